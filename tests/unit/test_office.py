"""Office documents and e-books (`mtkit.documents.office`): docx, pptx, xlsx, odt, odp and
epub files made by their own libraries (python-docx, python-pptx, openpyxl, odfpy; an epub
by hand), translated with fake translators whose alignments are known, and read back by
the same libraries: every text part translated, each run's formatting on its words, the
runs as many as in the source, every other member byte for byte; hostile zips refused in
one line."""

from __future__ import annotations

import datetime
import io
import zipfile

import pytest

from mtkit.core.errors import OptionError, UserError
from mtkit.core.translation import Translation
from mtkit.documents import office
from mtkit.documents.formats import FORMATS, output_format, translate_documents, translate_files

docx = pytest.importorskip("docx")
pptx = pytest.importorskip("pptx")
openpyxl = pytest.importorskip("openpyxl")
pytest.importorskip("odf")


def upper(texts: list[str]) -> list[Translation]:
    """Each word in capitals, word k aligned to word k."""
    out = []
    for text in texts:
        words = text.split()
        links = tuple((k, k) for k in range(len(words)))
        out.append(Translation(text, " ".join(w.upper() for w in words), -1.0, -0.5, (), links))
    return out


def reverse(texts: list[str]) -> list[Translation]:
    """The words in reverse order, capitals, each aligned to its source word."""
    out = []
    for text in texts:
        words = text.split()
        n = len(words)
        links = tuple((k, n - 1 - k) for k in range(n))
        target = " ".join(w.upper() for w in reversed(words))
        out.append(Translation(text, target, -1.0, -0.5, (), links))
    return out


def members(data: bytes) -> dict[str, tuple[bytes, int]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {i.filename: (z.read(i), i.compress_type) for i in z.infolist()}


def assert_rest_kept(source: bytes, output: bytes, changed: set[str]) -> None:
    """The same members in the same order; each one not in `changed` byte for byte, with
    its compression."""
    before, after = members(source), members(output)
    assert list(before) == list(after)
    assert changed <= set(before)
    for name in set(before) - changed:
        assert before[name] == after[name], name
    for name in changed:
        assert before[name][0] != after[name][0], name


def saved(document) -> bytes:
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


# ---- docx ------------------------------------------------------------------------------


def _hyperlink(paragraph, text: str, url: str) -> None:
    from docx.opc.constants import RELATIONSHIP_TYPE
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    rid = paragraph.part.relate_to(url, RELATIONSHIP_TYPE.HYPERLINK, is_external=True)
    link = OxmlElement("w:hyperlink")
    link.set(qn("r:id"), rid)
    run = OxmlElement("w:r")
    props = OxmlElement("w:rPr")
    style = OxmlElement("w:rStyle")
    style.set(qn("w:val"), "Hyperlink")
    props.append(style)
    run.append(props)
    t = OxmlElement("w:t")
    t.text = text
    run.append(t)
    link.append(run)
    paragraph._p.append(link)


def make_docx() -> bytes:
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    document = docx.Document()
    p = document.add_paragraph("A man is ")
    p.add_run("riding").bold = True
    p.add_run(" a ")
    p.add_run("red").italic = True
    p.add_run(" bike, see ")
    _hyperlink(p, "the site", "https://example.org/")
    p.add_run(" now.")
    # a word split by a spell-check mark, in two runs of the same formatting
    q = document.add_paragraph()
    q.add_run("The dog ").bold = True
    q._p.append(OxmlElement("w:proofErr"))
    q.add_run("runs fast").bold = True
    q.add_run(" in the park.")
    # a tab, a bookmark and a simple field inside a paragraph
    f = document.add_paragraph("Name:")
    run = f.add_run()
    run._r.append(OxmlElement("w:tab"))
    f.add_run("John Smith")
    mark = OxmlElement("w:bookmarkStart")
    mark.set(qn("w:id"), "0")
    mark.set(qn("w:name"), "here")
    f._p.append(mark)
    end = OxmlElement("w:bookmarkEnd")
    end.set(qn("w:id"), "0")
    f._p.append(end)
    field = OxmlElement("w:fldSimple")
    field.set(qn("w:instr"), "PAGE")
    f._p.append(field)
    f.add_run(" is on page 3.")
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "A cell with words"
    table.cell(0, 1).text = "Another cell"
    section = document.sections[0]
    section.header.paragraphs[0].text = "The header text"
    section.footer.paragraphs[0].text = "The footer text"
    return saved(document)


def _runs(paragraph) -> list[tuple[str, bool | None, bool | None]]:
    return [(r.text, r.bold, r.italic) for r in paragraph.runs]


def test_docx_every_text_part_is_translated_with_its_runs_and_the_rest_kept():
    source = make_docx()
    (output,) = translate_files([source], "docx", upper)
    document = docx.Document(io.BytesIO(output))
    first, second, third = document.paragraphs[:3]
    assert _runs(first) == [
        ("A MAN IS ", None, None),
        ("RIDING", True, None),
        (" A ", None, None),
        ("RED", None, True),
        (" BIKE, SEE ", None, None),
        (" NOW.", None, None),
    ]
    (link,) = first.hyperlinks
    assert link.text == "THE SITE" and link.address == "https://example.org/"
    # the two bold runs parted by a spell-check mark are one; the mark is gone
    assert second.text == "THE DOG RUNS FAST IN THE PARK."
    assert [(r.text.strip(), r.bold) for r in second.runs] == [
        ("THE DOG RUNS FAST", True),
        ("IN THE PARK.", None),
    ]
    assert b"proofErr" not in members(output)["word/document.xml"][0]
    assert third.text == "NAME:\tJOHN SMITH IS ON PAGE 3."
    body = members(output)["word/document.xml"][0].decode()
    assert 'w:name="here"' in body and 'w:instr="PAGE"' in body
    assert body.index("JOHN SMITH") < body.index("bookmarkStart") < body.index("fldSimple")
    assert body.index("fldSimple") < body.index(" IS ON PAGE")
    assert [c.text for c in document.tables[0].rows[0].cells] == [
        "A CELL WITH WORDS",
        "ANOTHER CELL",
    ]
    section = document.sections[0]
    assert section.header.paragraphs[0].text == "THE HEADER TEXT"
    assert section.footer.paragraphs[0].text == "THE FOOTER TEXT"
    changed = {"word/document.xml", "word/header1.xml", "word/footer1.xml"}
    changed &= set(members(source))
    assert_rest_kept(source, output, changed)


def test_docx_a_runs_formatting_follows_its_words_where_the_translation_moves_them():
    document = docx.Document()
    p = document.add_paragraph("one two ")
    p.add_run("three").bold = True
    (output,) = translate_files([saved(document)], "docx", reverse)
    (paragraph,) = docx.Document(io.BytesIO(output)).paragraphs
    assert paragraph.text == "THREE TWO ONE"
    assert [(r.text, r.bold) for r in paragraph.runs] == [("THREE", True), (" TWO ONE", None)]


def test_docx_comments_footnotes_and_complex_fields():
    """Comments are translated; a complex field (begin, instruction, result, end) is kept
    whole, where it stood."""
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    document = docx.Document()
    p = document.add_paragraph("Page ")
    for kind, instr in (
        ("begin", None),
        (None, " PAGE "),
        ("separate", None),
        (None, None),
        ("end", None),
    ):
        run = p.add_run()
        if kind:
            char = OxmlElement("w:fldChar")
            char.set(qn("w:fldCharType"), kind)
            run._r.append(char)
        elif instr:
            node = OxmlElement("w:instrText")
            node.text = instr
            run._r.append(node)
        else:
            run.text = "7"
    p.add_run(" of the report")
    document.add_comment(p.runs[-1], text="Check this part")
    (output,) = translate_files([saved(document)], "docx", upper)
    read = docx.Document(io.BytesIO(output))
    body = members(output)["word/document.xml"][0].decode()
    assert body.count("w:fldChar ") == 3 and " PAGE " in body
    assert read.paragraphs[0].text.replace("7", "") == "PAGE  OF THE REPORT"
    (comment,) = read.comments
    assert comment.text == "CHECK THIS PART"


# ---- pptx ------------------------------------------------------------------------------


def make_pptx() -> bytes:
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Hello world"
    paragraph = slide.placeholders[1].text_frame.paragraphs[0]
    for text, bold in (("A man is ", None), ("riding", True), (" a bike", None)):
        run = paragraph.add_run()
        run.text = text
        run.font.bold = bold
    run = paragraph.add_run()
    run.text = " on the road"
    run.hyperlink.address = "https://example.org/"
    slide.notes_slide.notes_text_frame.text = "Speaker notes here"
    return saved(deck)


def test_pptx_slides_and_notes_are_translated_with_their_runs():
    source = make_pptx()
    (output,) = translate_files([source], "pptx", upper)
    deck = pptx.Presentation(io.BytesIO(output))
    slide = deck.slides[0]
    assert slide.shapes.title.text == "HELLO WORLD"
    (paragraph,) = slide.placeholders[1].text_frame.paragraphs
    runs = [(r.text, r.font.bold, r.hyperlink.address) for r in paragraph.runs]
    assert runs == [
        ("A MAN IS ", None, None),
        ("RIDING", True, None),
        (" A BIKE ", None, None),
        ("ON THE ROAD", None, "https://example.org/"),
    ]
    assert slide.notes_slide.notes_text_frame.text == "SPEAKER NOTES HERE"
    changed = {"ppt/slides/slide1.xml", "ppt/notesSlides/notesSlide1.xml"}
    assert_rest_kept(source, output, changed)


# ---- xlsx ------------------------------------------------------------------------------


def make_xlsx() -> bytes:
    from openpyxl.cell.rich_text import CellRichText, TextBlock
    from openpyxl.cell.text import InlineFont

    book = openpyxl.Workbook()
    sheet = book.active
    sheet["A1"] = "A man rides"
    sheet["A2"] = 3.25
    sheet["A3"] = "=SUM(A2:A2)"
    sheet["A4"] = datetime.date(2024, 1, 2)
    sheet["A5"] = CellRichText(["plain words ", TextBlock(InlineFont(b=True), "bold words")])
    data = saved(book)
    # (openpyxl writes its strings inline) two shared strings, as Excel writes them
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        parts = {i: z.read(i) for i in z.infolist()}
    edits = {
        "xl/worksheets/sheet1.xml": (
            b"</row></sheetData>",
            b'</row><row r="6"><c r="A6" t="s"><v>0</v></c></row><row r="7"><c r="A7" t="s">'
            b"<v>1</v></c></row></sheetData>",
        ),
        "[Content_Types].xml": (
            b"</Types>",
            b'<Override PartName="/xl/sharedStrings.xml" ContentType="application/'
            b'vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>',
        ),
        "xl/_rels/workbook.xml.rels": (
            b"</Relationships>",
            b'<Relationship Id="rIdS" Target="sharedStrings.xml" Type="http://schemas.'
            b'openxmlformats.org/officeDocument/2006/relationships/sharedStrings"/></Relationships>',
        ),
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info, content in parts.items():
            if info.filename in edits:
                content = content.replace(*edits[info.filename])
            z.writestr(info, content)
        z.writestr("xl/sharedStrings.xml", SHARED)
    return out.getvalue()


SHARED = (
    b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<sst xmlns="http://schemas.'
    b'openxmlformats.org/spreadsheetml/2006/main" count="2" uniqueCount="2"><si><t>A shared '
    b'string</t></si><si><r><t xml:space="preserve">plain </t></r><r><rPr><i val="1"/></rPr>'
    b"<t>italic words</t></r></si></sst>"
)


def test_xlsx_strings_are_translated_and_numbers_formulas_dates_kept():
    source = make_xlsx()
    (output,) = translate_files([source], "xlsx", upper)
    sheet = openpyxl.load_workbook(io.BytesIO(output), rich_text=True).active
    assert sheet["A1"].value == "A MAN RIDES"
    assert sheet["A2"].value == 3.25 and sheet["A3"].value == "=SUM(A2:A2)"
    assert sheet["A4"].value == datetime.datetime(2024, 1, 2)
    rich = sheet["A5"].value
    assert str(rich) == "PLAIN WORDS BOLD WORDS"
    bold = [block for block in rich if not isinstance(block, str)]
    assert [b.text.strip() for b in bold] == ["BOLD WORDS"] and bold[0].font.b
    assert sheet["A6"].value == "A SHARED STRING"
    italic = [block for block in sheet["A7"].value if not isinstance(block, str)]
    assert str(sheet["A7"].value) == "PLAIN ITALIC WORDS"
    assert [b.text.strip() for b in italic] == ["ITALIC WORDS"] and italic[0].font.i
    sheet_xml = members(output)["xl/worksheets/sheet1.xml"][0]
    for kept in (b"<v>3.25</v>", b"<f>SUM(A2:A2)</f>"):
        assert kept in sheet_xml
    assert_rest_kept(source, output, {"xl/sharedStrings.xml", "xl/worksheets/sheet1.xml"})


# ---- odt and odp -----------------------------------------------------------------------


def make_odt() -> bytes:
    from odf.opendocument import OpenDocumentText
    from odf.style import Style, TextProperties
    from odf.text import A, H, P, S, Span

    document = OpenDocumentText()
    bold = Style(name="B", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    document.text.addElement(H(outlinelevel=1, text="A short title"))
    p = P(text="Some ")
    p.addElement(Span(stylename=bold, text="bold words"))
    p.addText(" and")
    p.addElement(S(c=2))
    p.addElement(A(href="https://example.org/", text="a link"))
    p.addText(" here.")
    document.text.addElement(p)
    return saved(document)


def _odf_paragraphs(data: bytes) -> list:
    from odf import teletype
    from odf.opendocument import load

    document = load(io.BytesIO(data))
    return [(e.qname[1], teletype.extractText(e), e) for e in document.text.childNodes]


def test_odt_headings_spans_and_links_are_translated_in_place():
    source = make_odt()
    (output,) = translate_files([source], "odt", upper)
    (h, heading, _), (p, text, element) = _odf_paragraphs(output)
    assert (h, heading) == ("h", "A SHORT TITLE")
    assert p == "p" and text.split() == "SOME BOLD WORDS AND A LINK HERE.".split()
    children = [(c.qname[1], str(c)) for c in element.childNodes if c.nodeType == 1]
    assert children == [("span", "BOLD WORDS"), ("s", ""), ("a", "A LINK")]
    assert_rest_kept(source, output, {"content.xml"})
    assert list(members(output))[0] == "mimetype"


def test_odp_text_boxes_are_translated():
    from odf.draw import Frame, Page, TextBox
    from odf.opendocument import OpenDocumentPresentation, load
    from odf.style import MasterPage, PageLayout
    from odf.text import P

    deck = OpenDocumentPresentation()
    layout = PageLayout(name="L")
    deck.automaticstyles.addElement(layout)
    master = MasterPage(name="M", pagelayoutname=layout)
    deck.masterstyles.addElement(master)
    page = Page(masterpagename=master)
    frame = Frame(width="10cm", height="2cm", x="1cm", y="1cm")
    box = TextBox()
    box.addElement(P(text="Slide words here"))
    frame.addElement(box)
    page.addElement(frame)
    deck.presentation.addElement(page)
    source = saved(deck)
    (output,) = translate_files([source], "odp", upper)
    from odf import teletype
    from odf.text import P as Para

    read = load(io.BytesIO(output))
    assert [teletype.extractText(p) for p in read.getElementsByType(Para)] == ["SLIDE WORDS HERE"]
    assert_rest_kept(source, output, {"content.xml"})


# ---- epub ------------------------------------------------------------------------------

CHAPTER = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>One</title></head>
<body><h1>Chapter one</h1><p>A man is <b>riding</b> a bike.</p><img src="a.png" alt=""/>
</body></html>
"""
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


def make_epub(chapter: str = CHAPTER, **replaced: bytes) -> bytes:
    files = {
        "mimetype": b"application/epub+zip",
        "META-INF/container.xml": b'<?xml version="1.0"?><container version="1.0" '
        b'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles><rootfile '
        b'full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
        b"</rootfiles></container>",
        "OEBPS/content.opf": b'<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" '
        b'version="3.0" unique-identifier="id"><metadata '
        b'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier id="id">x</dc:identifier>'
        b"<dc:title>T</dc:title><dc:language>en</dc:language></metadata><manifest>"
        b'<item id="c1" href="text/one.xhtml" media-type="application/xhtml+xml"/>'
        b'<item id="i" href="a.png" media-type="image/png"/></manifest><spine><itemref idref="c1"/>'
        b"</spine></package>",
        "OEBPS/text/one.xhtml": chapter.encode(),
        "OEBPS/a.png": PNG,
    }
    files.update({k.replace("__", "/"): v for k, v in replaced.items()})
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, content in files.items():
            stored = name in ("mimetype", "OEBPS/a.png")
            z.writestr(name, content, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return out.getvalue()


def test_epub_chapters_are_translated_through_markup_and_the_rest_kept():
    from lxml import etree

    source = make_epub()
    (output,) = translate_files([source], "epub", upper)
    chapter = members(output)["OEBPS/text/one.xhtml"][0]
    root = etree.fromstring(chapter)
    ns = {"h": "http://www.w3.org/1999/xhtml"}
    assert root.findtext(".//h:h1", namespaces=ns) == "CHAPTER ONE"
    assert root.findtext(".//h:title", namespaces=ns) == "ONE"
    (p,) = root.findall(".//h:p", ns)
    assert etree.tostring(p, encoding="unicode", with_tail=False).endswith(
        ">A MAN IS <b>RIDING</b> A BIKE.</p>"
    )
    assert_rest_kept(source, output, {"OEBPS/text/one.xhtml"})
    with zipfile.ZipFile(io.BytesIO(output)) as z:
        first = z.infolist()[0]
        assert first.filename == "mimetype" and first.compress_type == zipfile.ZIP_STORED


# ---- every format through the table ----------------------------------------------------


def test_each_file_format_is_a_binary_record_found_by_its_suffix(tmp_path):
    for name in ("docx", "pptx", "xlsx", "odt", "odp", "epub"):
        assert FORMATS[name].binary
        assert output_format(None, tmp_path / f"a.{name.upper()}").kind == name
    with pytest.raises(OptionError, match=r"^format docx is a file, not text"):
        translate_documents(["text"], "docx", upper)
    with pytest.raises(OptionError, match="is text, not a file's bytes"):
        translate_files([b"<p>x</p>"], "html", upper)


def test_the_files_of_a_call_are_translated_in_one_batch():
    calls = []

    def counted(texts):
        calls.append(len(texts))
        return upper(texts)

    outputs = translate_files([make_docx(), make_docx()], "docx", counted)
    assert len(calls) == 1 and len(outputs) == 2


def test_a_paragraph_without_words_and_a_part_without_text_keep_their_bytes():
    document = docx.Document()
    document.add_paragraph("  ... — ")
    source = saved(document)
    (output,) = translate_files([source], "docx", reverse)
    assert_rest_kept(source, output, set())


# ---- hostile files ---------------------------------------------------------------------


def _zip(entries: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in entries.items():
            z.writestr(name, content)
    return out.getvalue()


def refused(data: bytes, format: str, says: str) -> None:
    with pytest.raises(UserError) as e:
        translate_files([data], format, upper)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_hostile_zips_are_one_line(monkeypatch):
    refused(b"not a zip at all", "docx", "is not a zip archive")
    refused(make_docx()[:200], "docx", "not a zip archive")
    refused(
        _zip({"../evil.txt": b"x", "[Content_Types].xml": b"<a/>"}), "docx", "outside its folder"
    )
    refused(_zip({"/etc/passwd": b"x"}), "odt", "outside its folder")
    refused(_zip({"C:/x": b"x"}), "odt", "outside its folder")
    refused(_zip({"a": b"x"}), "docx", "has no [Content_Types].xml")
    refused(_zip({"mimetype": b"x"}), "odt", "has no content.xml")
    refused(_zip({"mimetype": b"x"}), "epub", "has no META-INF/container.xml")
    refused(make_docx(), "pptx", "has no presentation part")
    bomb = doc_types = make_docx()
    monkeypatch.setattr(office, "MAX_UNPACKED", 1000)
    refused(bomb, "docx", "too large")
    monkeypatch.undo()
    monkeypatch.setattr(office, "MAX_MEMBERS", 3)
    refused(doc_types, "docx", "members; mtkit reads files of up to 3")
    monkeypatch.undo()
    laughs = (
        b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "ha"><!ENTITY b "&a;&a;&a;">]>'
        b'<office:document-content xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0">'
        b"&b;</office:document-content>"
    )
    refused(_zip({"mimetype": b"x", "content.xml": laughs}), "odt", "declares a DOCTYPE")
    refused(_zip({"mimetype": b"x", "content.xml": b"<a><b></a>"}), "odt", "not well-formed")


def test_a_zip_bomb_is_refused_before_any_member_is_inflated(monkeypatch):
    """A member whose declared size is over the bound: refused from the listing alone."""
    bomb = _zip({"content.xml": bytes(4 << 20), "mimetype": b"x"})
    monkeypatch.setattr(office, "MAX_UNPACKED", 1 << 20)
    opened = []
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda *a, **k: opened.append(a) or 1 / 0)
    refused(bomb, "odt", "too large")
    assert opened == []


def test_an_encrypted_member_is_one_line():
    data = bytearray(_zip({"mimetype": b"x", "content.xml": b"<a/>"}))
    central = data.index(b"PK\x01\x02")
    data[central + 8] |= 1  # the central directory's flag: encrypted
    refused(bytes(data), "odt", "is encrypted")


def test_a_member_whose_bytes_disagree_with_its_checksum_is_one_line():
    data = bytearray(_zip({"mimetype": b"x", "content.xml": b"<a>" + b"b" * 50 + b"</a>"}))
    central = data.index(b"PK\x01\x02")
    data[central + 16] ^= 0xFF  # its CRC-32, in the central directory
    refused(bytes(data), "odt", "is damaged")
