"""Office documents and e-books made by their own libraries (python-docx, python-pptx,
openpyxl, odfpy; an epub by hand) for the tests that translate them, and how an output is
compared with its source (`members`, `assert_rest_kept`)."""

from __future__ import annotations

import datetime
import io
import zipfile


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


def hyperlink(paragraph, text: str, url: str) -> None:
    """A Word hyperlink to `url` around one run of `text`, at the end of `paragraph`."""
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
    import docx
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    document = docx.Document()
    p = document.add_paragraph("A man is ")
    p.add_run("riding").bold = True
    p.add_run(" a ")
    p.add_run("red").italic = True
    p.add_run(" bike, see ")
    hyperlink(p, "the site", "https://example.org/")
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


def make_pptx() -> bytes:
    import pptx

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


def make_xlsx() -> bytes:
    import openpyxl
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


def make_odt() -> bytes:
    from odf.opendocument import OpenDocumentText
    from odf.style import Header, MasterPage, PageLayout, Style, TextProperties
    from odf.text import A, H, Note, NoteBody, NoteCitation, P, S, Span

    document = OpenDocumentText()
    bold = Style(name="B", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    layout = PageLayout(name="L")
    document.automaticstyles.addElement(layout)
    master = MasterPage(name="Standard", pagelayoutname=layout)
    header = Header()
    header.addElement(P(text="The running header"))
    master.addElement(header)
    document.masterstyles.addElement(master)
    document.text.addElement(H(outlinelevel=1, text="A short title"))
    p = P(text="Some ")
    p.addElement(Span(stylename=bold, text="bold words"))
    p.addText(" and")
    p.addElement(S(c=2))
    p.addElement(A(href="https://example.org/", text="a link"))
    p.addText(" here.")
    note = Note(id="n1", noteclass="footnote")
    note.addElement(NoteCitation(text="1"))
    body = NoteBody()
    body.addElement(P(text="A footnote text"))
    note.addElement(body)
    p.addElement(note)
    document.text.addElement(p)
    return saved(document)


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


def make_odp() -> bytes:
    from odf.draw import Frame, Page, TextBox
    from odf.opendocument import OpenDocumentPresentation
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
    return saved(deck)
