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
from mtkit.documents import office
from mtkit.documents.formats import FORMATS, output_format, translate_documents, translate_files

from fake_translations import reverse_upper as reverse
from fake_translations import upper
from officefiles import (
    assert_rest_kept,
    make_docx,
    make_epub,
    make_odp,
    make_odt,
    make_pptx,
    make_xlsx,
    members,
    saved,
)

docx = pytest.importorskip("docx")
pptx = pytest.importorskip("pptx")
openpyxl = pytest.importorskip("openpyxl")
pytest.importorskip("odf")


# ---- docx ------------------------------------------------------------------------------


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


def test_docx_a_run_whose_words_were_dropped_leaves_one_space_not_two():
    """The model dropped "shorts": its bold run stays (the runs as many), empty, and the
    words either side are one space apart, as a browser would show the HTML."""
    from mtkit.core.translation import Translation

    document = docx.Document()
    p = document.add_paragraph("A man in ")
    p.add_run("shorts").bold = True
    p.add_run(" is fishing.")

    def dropped(texts):
        links = ((0, 0), (1, 1), (5, 2))
        return [Translation(t, "Ein Mann angelt.", -1.0, -0.5, (), links) for t in texts]

    (output,) = translate_files([saved(document)], "docx", dropped)
    (paragraph,) = docx.Document(io.BytesIO(output)).paragraphs
    assert paragraph.text == "Ein Mann angelt."
    assert [(r.text, r.bold) for r in paragraph.runs] == [
        ("Ein Mann ", None),
        ("", True),
        ("angelt.", None),
    ]


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
    assert p == "p" and text.split() == "SOME BOLD WORDS AND A LINK HERE.1A FOOTNOTE TEXT".split()
    children = [(c.qname[1], str(c)) for c in element.childNodes if c.nodeType == 1]
    assert children[:3] == [("span", "BOLD WORDS"), ("s", ""), ("a", "A LINK")]
    assert children[3][0] == "note" and str(children[3][1]).endswith("A FOOTNOTE TEXT")
    from odf.opendocument import load
    from odf.style import Header

    (header,) = load(io.BytesIO(output)).getElementsByType(Header)
    assert str(header) == "THE RUNNING HEADER"
    assert_rest_kept(source, output, {"content.xml", "styles.xml"})
    assert list(members(output))[0] == "mimetype"


def test_odp_text_boxes_are_translated():
    from odf.opendocument import load

    source = make_odp()
    (output,) = translate_files([source], "odp", upper)
    from odf import teletype
    from odf.text import P as Para

    read = load(io.BytesIO(output))
    assert [teletype.extractText(p) for p in read.getElementsByType(Para)] == ["SLIDE WORDS HERE"]
    assert_rest_kept(source, output, {"content.xml"})


# ---- epub ------------------------------------------------------------------------------


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


def test_pptx_a_line_break_and_a_field_stay_between_their_words():
    from lxml import etree

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "First line\vsecond line"  # (\v: python-pptx's a:br)
    source = saved(deck)
    with zipfile.ZipFile(io.BytesIO(source)) as z:
        xml = z.read("ppt/slides/slide1.xml")
    field = (
        b'<a:fld id="{B6F15528-21DE-4FAA-801E-634DDDAF4B2B}" type="slidenum"><a:t>1</a:t></a:fld>'
    )
    xml = xml.replace(b"<a:t>second line</a:t></a:r>", b"<a:t>second line</a:t></a:r>" + field)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(source)) as z, zipfile.ZipFile(out, "w") as w:
        for info in z.infolist():
            w.writestr(info, xml if info.filename == "ppt/slides/slide1.xml" else z.read(info))
    (output,) = translate_files([out.getvalue()], "pptx", upper)
    title = pptx.Presentation(io.BytesIO(output)).slides[0].shapes.title
    assert title.text == "FIRST LINE\vSECOND LINE1"
    a = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
    root = etree.fromstring(members(output)["ppt/slides/slide1.xml"][0])
    (p,) = [p for p in root.iter(a + "p") if p.find(a + "r") is not None]
    kinds = [etree.QName(c).localname for c in p if etree.QName(c).localname != "pPr"]
    assert kinds[:4] == ["r", "br", "r", "fld"] and p.find(a + "fld").get("type") == "slidenum"


def test_docx_a_text_box_inside_a_run_is_translated_where_it_stands():
    from docx.oxml import parse_xml

    document = docx.Document()
    p = document.add_paragraph("Outer words ")
    namespaces = (
        'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main" '
        'xmlns:v="urn:schemas-microsoft-com:vml"'
    )
    p._p.append(
        parse_xml(
            f"<w:r {namespaces}><w:pict><v:shape><v:textbox><w:txbxContent><w:p><w:r>"
            "<w:t>Box words</w:t></w:r></w:p></w:txbxContent></v:textbox></v:shape></w:pict></w:r>"
        )
    )
    p.add_run(" end here")
    (output,) = translate_files([saved(document)], "docx", upper)
    body = members(output)["word/document.xml"][0].decode()
    assert "<w:txbxContent><w:p><w:r><w:t>BOX WORDS</w:t></w:r></w:p></w:txbxContent>" in body
    assert body.index("OUTER WORDS") < body.index("BOX WORDS") < body.index("END HERE")


def test_docx_a_content_control_inside_a_paragraph_holds_its_translated_words():
    """An inline content control (`w:sdt`) is an element around its runs: its properties
    kept, its `w:sdtContent` holding the target words of its source words."""
    from docx.oxml import parse_xml

    document = docx.Document()
    p = document.add_paragraph("one two ")
    w = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    p._p.append(
        parse_xml(
            f'<w:sdt {w}><w:sdtPr><w:alias w:val="Name"/><w:id w:val="7"/></w:sdtPr>'
            "<w:sdtContent><w:r><w:t>three four</w:t></w:r></w:sdtContent></w:sdt>"
        )
    )
    p.add_run(" five")
    (output,) = translate_files([saved(document)], "docx", reverse)
    body = members(output)["word/document.xml"][0].decode()
    assert (
        '<w:p><w:r><w:t xml:space="preserve">FIVE </w:t></w:r><w:sdt><w:sdtPr><w:alias '
        'w:val="Name"/><w:id w:val="7"/></w:sdtPr><w:sdtContent><w:r><w:t>FOUR THREE</w:t>'
        '</w:r></w:sdtContent></w:sdt><w:r><w:t xml:space="preserve"> TWO ONE</w:t></w:r></w:p>'
    ) in body


@pytest.mark.parametrize("format", ["docx", "pptx", "odt", "epub"])
def test_a_file_with_bytes_damaged_anywhere_is_translated_or_refused_in_one_line(format):
    """Seeded corruption (a few bytes changed anywhere: names, sizes, deflate streams,
    XML): each either translates or is one line (`UserError`), never another error."""
    import random

    source = {"docx": make_docx, "pptx": make_pptx, "odt": make_odt, "epub": make_epub}[format]()
    rng = random.Random(7)
    refusals = 0
    for _ in range(60):
        damaged = bytearray(source)
        for _ in range(rng.randint(1, 8)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            translate_files([bytes(damaged)], format, upper)
        except UserError as e:
            assert "\n" not in str(e), str(e)
            refusals += 1
    assert refusals > 30
