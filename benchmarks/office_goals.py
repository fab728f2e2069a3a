"""Issue 78's goal for office documents and e-books, measured: docx, pptx, xlsx, odt, odp
and epub files of test2016's sentences with bold, italic and hyperlink runs inside the
sentences, translated as `mtkit.Translator.translate_document` translates them, and each
output read back by the format's own library.

    python benchmarks/office_goals.py [-m CKPT] [--sentences 40] [--formats docx ...]
        [--no-soffice] [--json]

Each file is built by its format's library (python-docx, python-pptx, openpyxl, odfpy;
the epub by hand with zipfile, as `tests/officefiles.py` builds one) from `--sentences`
sentences of `data/multi30k/test2016.en.gz` (each format its own, the next ones after the
previous format's; those of 8-30 words; count words, "two" to "ten", written in digits:
"2 men"). In every paragraph a bold run and an italic run of one or two
words stand inside the sentence (never at its edges), and in every third a hyperlink
around one or two words. Beside the paragraphs: docx a heading, a header, a footer, a
table's cells and a picture; pptx slides' titles, bodies and notes and a picture; xlsx
inline rich strings (openpyxl's) with cell hyperlinks, numbers, formulas and dates in
their own columns on one sheet, and shared strings (plain and rich, written into the file
by hand as Excel writes them: openpyxl writes its strings inline) on a second; odt a
heading, a running header, spans of automatic bold and italic styles, `text:a` links and a
picture; odp text boxes of spans and links on two pages; epub two XHTML chapters of `h1`,
`p`, `b`, `i` and `a href` and a picture.

With `-m` the model translates (`mtkit.Translator.load(CKPT, device="cpu")`, the
checkpoint's own beam); without it a fake translation (each text in capitals, word i
linked to word i) measures the documents layer alone.

Each output is judged against its source, both read the same way: (a) paragraphs
translated, those whose text in the output is not empty and differs from the source's
(paired in order: python-docx's paragraphs of the body, the table, the header and the
footer; python-pptx's text frames' and notes' paragraphs; openpyxl's string cells, read
with `rich_text=True`; odfpy's `text:p`/`text:h`; lxml's `h1`/`p` in each chapter); (b)
bold, italic and link runs with text, source against output: docx runs whose `bold` /
`italic` is True and `w:hyperlink`s with an address, pptx runs' `font.bold` / `font.italic`
and `hyperlink.address`, xlsx rich text's blocks of `b` / `i` (shared and inline) and cells'
hyperlinks, odt / odp `text:span`s whose automatic style has `fo:font-weight="bold"` /
`fo:font-style="italic"` and `text:a`s, epub `b`, `i` and `a href` (formatted runs and
links left without text are counted apart, "empty", and the paragraphs where that left two
spaces in a row); (c) numbers: each paragraph whose source holds numbers ("3", "2016")
holding every one of them in digits in its output (and of those that do not, with a model
into German, those whose missing numbers are there as count words: "2" as "zwei"), and
xlsx's number, formula and date cells equal; (d) the zip's members: the same names in
the same order, and the ones whose bytes or compression changed, which must all be parts
that hold text; (e) the output opened by its library without an error (the epub: every
XML member parsed by lxml, its `mimetype` first and stored, every manifest item present),
and where `/usr/bin/soffice` is installed with the component that opens the format,
LibreOffice's `--convert-to pdf` of the source and of the output (its exit status and
whether each PDF was written; LibreOffice imports no epub, the source's neither).

Prints a table, one row per format, the members that changed under it; with `--json` one
JSON object after. Exits 1 where a figure falls short of the goal.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import io
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from lxml import etree

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # officefiles

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "data" / "multi30k" / "test2016.en.gz"
FORMATS = ("docx", "pptx", "xlsx", "odt", "odp", "epub")
URL = "https://example.org/{}"
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
COUNT_WORDS = "two three four five six seven eight nine ten".split()
COUNTS = {w: str(k) for k, w in enumerate(COUNT_WORDS, 2)}
# the count words of a target language: a number the translation spells out
SPELLED = {"de": "zwei drei vier fünf sechs sieben acht neun zehn".split()}

# ---- the text: test2016's sentences, with runs marked inside them ------------------------

Piece = tuple[str, str | None]  # (text, None | "b" | "i" | "a")


def sentences(n: int, skip: int) -> list[str]:
    """`n` sentences of test2016 of 8-30 words, after the first `skip` such; their count
    words in digits ("two" to "ten": "2 men")."""
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        found = [s.strip() for s in f if 8 <= len(s.split()) <= 30]
    chosen = found[skip : skip + n]
    return [" ".join(COUNTS.get(w.lower(), w) for w in s.split()) for s in chosen]


def marked(sentence: str, rng: random.Random, link: bool) -> list[Piece]:
    """`sentence` as pieces: a bold run and an italic run (and with `link` a hyperlink) of
    one or two words each, inside the sentence: the words but the first and the last
    parted into one stretch a run, each run in its stretch on words of four letters or more
    (not prepositions) where there are some, the stretch's last word plain."""
    words = sentence.split()
    kinds = ["b", "i", "a"] if link else ["b", "i"]
    rng.shuffle(kinds)
    kind_of: list[str | None] = [None] * len(words)
    inner = len(words) - 2  # words 1 .. n-2
    for k, kind in enumerate(kinds):
        a, b = 1 + k * inner // len(kinds), 1 + (k + 1) * inner // len(kinds)
        width = 2 if b - a >= 4 and rng.random() < 0.3 else 1
        starts = range(a, b - width)
        content = [i for i in starts if all(_content(w) for w in words[i : i + width])]
        start = rng.choice(content or list(starts))
        kind_of[start : start + width] = [kind] * width
    pieces: list[Piece] = []
    for k, (word, kind) in enumerate(zip(words, kind_of)):
        if k:
            pieces.append((" ", kind if kind and kind_of[k - 1] == kind else None))
        pieces.append((word, kind))
    merged: list[Piece] = []
    for text, kind in pieces:
        if merged and merged[-1][1] == kind:
            merged[-1] = (merged[-1][0] + text, kind)
        else:
            merged.append((text, kind))
    return merged


FUNCTION_WORDS = {"with", "from", "that", "this", "their", "into", "while", "near", "over"}


def _content(word: str) -> bool:
    """A word a writer would set in bold: of four letters or more, not a preposition."""
    return sum(c.isalpha() for c in word) >= 4 and word.lower() not in FUNCTION_WORDS


def paragraphs(n: int, skip: int, seed: int) -> list[list[Piece]]:
    rng = random.Random(seed + skip)
    return [marked(s, rng, k % 3 == 1) for k, s in enumerate(sentences(n, skip))]


def plain(pieces: list[Piece]) -> str:
    return "".join(text for text, _ in pieces)


def png() -> bytes:
    """A 2x2 PNG, made here: a member that holds no text."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    header = (2).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    rows = b"".join(b"\x00" + bytes([200, 30, 30]) * 2 for _ in range(2))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def saved(document) -> bytes:
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


# ---- the files, each built by its format's own library ---------------------------------


def make_docx(paras: list[list[Piece]]) -> bytes:
    """A heading, the paragraphs, a 2x2 table's cells, a header and a footer (the last
    four and two paragraphs), a picture."""
    import docx

    document = docx.Document()
    section = document.sections[0]
    header, footer, heading, body = paras[0], paras[1], paras[2], paras[3:]
    _docx_fill(section.header.paragraphs[0], header)
    _docx_fill(section.footer.paragraphs[0], footer)
    document.add_heading(plain(heading), level=1)
    cells, body = body[-4:], body[:-4]
    for pieces in body:
        _docx_fill(document.add_paragraph(), pieces)
    table = document.add_table(rows=2, cols=2)
    for k, pieces in enumerate(cells):
        _docx_fill(table.cell(k // 2, k % 2).paragraphs[0], pieces)
    document.add_picture(io.BytesIO(png()))
    return saved(document)


def _docx_fill(paragraph, pieces: list[Piece]) -> None:
    from officefiles import hyperlink

    for k, (text, kind) in enumerate(pieces):
        if kind == "a":
            hyperlink(paragraph, text, URL.format(k))
            continue
        run = paragraph.add_run(text)
        run.bold = True if kind == "b" else None
        run.italic = True if kind == "i" else None


def make_pptx(paras: list[list[Piece]]) -> bytes:
    """Slides of a title, three body paragraphs and a paragraph of notes each; a picture
    on the first."""
    import pptx
    from pptx.util import Inches

    deck = pptx.Presentation()
    for at in range(0, len(paras) - 4, 5):
        title, body, notes = paras[at], paras[at + 1 : at + 4], paras[at + 4]
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        _pptx_fill(slide.shapes.title.text_frame.paragraphs[0], title)
        frame = slide.placeholders[1].text_frame
        for k, pieces in enumerate(body):
            _pptx_fill(frame.paragraphs[0] if k == 0 else frame.add_paragraph(), pieces)
        _pptx_fill(slide.notes_slide.notes_text_frame.paragraphs[0], notes)
        if at == 0:
            slide.shapes.add_picture(io.BytesIO(png()), Inches(8), Inches(6))
    return saved(deck)


def _pptx_fill(paragraph, pieces: list[Piece]) -> None:
    for k, (text, kind) in enumerate(pieces):
        run = paragraph.add_run()
        run.text = text
        if kind == "b":
            run.font.bold = True
        elif kind == "i":
            run.font.italic = True
        elif kind == "a":
            run.hyperlink.address = URL.format(k)


def make_xlsx(paras: list[list[Piece]]) -> bytes:
    """Sheet "Inline": column A the first half of the paragraphs as rich inline strings
    (a link's words plain, the cell a hyperlink instead), B a number, C a formula, D a
    date; sheet "Shared": the second half as shared strings, rich and plain in turn."""
    import openpyxl
    from openpyxl.cell.rich_text import CellRichText, TextBlock
    from openpyxl.cell.text import InlineFont

    half = len(paras) // 2
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Inline"
    for row, pieces in enumerate(paras[:half], 1):
        blocks = [
            TextBlock(InlineFont(b=kind == "b", i=kind == "i"), text)
            if kind in ("b", "i")
            else text
            for text, kind in pieces
        ]
        sheet.cell(row, 1).value = CellRichText(blocks)
        if any(kind == "a" for _, kind in pieces):
            sheet.cell(row, 1).hyperlink = URL.format(row)
        sheet.cell(row, 2).value = row * 1.25 if row % 2 else row * 1000
        sheet.cell(row, 3).value = f"=B{row}*2+{row}"
        sheet.cell(row, 4).value = datetime.date(2016, 1 + row % 12, 1 + row % 28)
    shared = book.create_sheet("Shared")
    for row in range(1, len(paras) - half + 1):
        shared.cell(row, 1).value = f"SHARED{row - 1}"
        shared.cell(row, 2).value = row
    data = saved(book)
    strings = b"".join(_shared_string(p, k % 2 == 0) for k, p in enumerate(paras[half:]))
    sst = (
        b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<sst xmlns="http://'
        b'schemas.openxmlformats.org/spreadsheetml/2006/main" count="%d" uniqueCount="%d">'
        % (len(paras) - half, len(paras) - half)
        + strings
        + b"</sst>"
    )
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        parts = {i: z.read(i) for i in z.infolist()}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info, content in parts.items():
            if info.filename == "xl/worksheets/sheet2.xml":
                content = re.sub(
                    rb'<c r="(A\d+)" t="inlineStr"><is><t>SHARED(\d+)</t></is></c>',
                    rb'<c r="\1" t="s"><v>\2</v></c>',
                    content,
                )
            elif info.filename == "[Content_Types].xml":
                content = content.replace(
                    b"</Types>",
                    b'<Override PartName="/xl/sharedStrings.xml" ContentType="application/'
                    b"vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"
                    b'"/></Types>',
                )
            elif info.filename == "xl/_rels/workbook.xml.rels":
                content = content.replace(
                    b"</Relationships>",
                    b'<Relationship Id="rIdS" Target="sharedStrings.xml" Type="http://'
                    b"schemas.openxmlformats.org/officeDocument/2006/relationships/"
                    b'sharedStrings"/></Relationships>',
                )
            z.writestr(info, content)
        z.writestr("xl/sharedStrings.xml", sst)
    return out.getvalue()


def _shared_string(pieces: list[Piece], rich: bool) -> bytes:
    def t(text: str) -> str:
        space = ' xml:space="preserve"' if text != text.strip() else ""
        return f"<t{space}>{_escape(text)}</t>"

    if not rich:
        return f"<si>{t(plain(pieces))}</si>".encode()
    runs = []
    for text, kind in pieces:
        props = {"b": '<rPr><b val="1"/></rPr>', "i": '<rPr><i val="1"/></rPr>'}.get(kind, "")
        runs.append(f"<r>{props}{t(text)}</r>")
    return ("<si>" + "".join(runs) + "</si>").encode()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _odf_styles(document):
    from odf.style import Style, TextProperties

    bold = Style(name="B", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    italic = Style(name="I", family="text")
    italic.addElement(TextProperties(fontstyle="italic"))
    document.automaticstyles.addElement(bold)
    document.automaticstyles.addElement(italic)
    return {"b": bold, "i": italic}


def _odf_fill(paragraph, pieces: list[Piece], styles) -> None:
    from odf.text import A, Span

    for k, (text, kind) in enumerate(pieces):
        if kind in styles:
            paragraph.addElement(Span(stylename=styles[kind], text=text))
        elif kind == "a":
            paragraph.addElement(A(href=URL.format(k), type="simple", text=text))
        else:
            paragraph.addText(text)


def make_odt(paras: list[list[Piece]]) -> bytes:
    """A running header (the first paragraph, plain, in styles.xml), a heading (the
    second), the paragraphs of spans and links, a picture."""
    from odf.draw import Frame, Image
    from odf.opendocument import OpenDocumentText
    from odf.style import Header, MasterPage, PageLayout
    from odf.text import H, P

    document = OpenDocumentText()
    styles = _odf_styles(document)
    layout = PageLayout(name="L")
    document.automaticstyles.addElement(layout)
    master = MasterPage(name="Standard", pagelayoutname=layout)
    header = Header()
    header.addElement(P(text=plain(paras[0])))
    master.addElement(header)
    document.masterstyles.addElement(master)
    document.text.addElement(H(outlinelevel=1, text=plain(paras[1])))
    for k, pieces in enumerate(paras[2:]):
        p = P()
        _odf_fill(p, pieces, styles)
        if k == 0:
            href = document.addPicture("Pictures/dot.png", "image/png", png())
            frame = Frame(width="1cm", height="1cm", anchortype="as-char")
            frame.addElement(Image(href=href))
            p.addElement(frame)
        document.text.addElement(p)
    return saved(document)


def make_odp(paras: list[list[Piece]]) -> bytes:
    """Pages of text boxes, three paragraphs a box, two boxes a page."""
    from odf.draw import Frame, Page, TextBox
    from odf.opendocument import OpenDocumentPresentation
    from odf.style import MasterPage, PageLayout
    from odf.text import P

    deck = OpenDocumentPresentation()
    styles = _odf_styles(deck)
    layout = PageLayout(name="L")
    deck.automaticstyles.addElement(layout)
    master = MasterPage(name="M", pagelayoutname=layout)
    deck.masterstyles.addElement(master)
    page = None
    for box_at, at in enumerate(range(0, len(paras), 3)):
        if box_at % 2 == 0:
            page = Page(masterpagename=master, name=f"page{box_at // 2 + 1}")
            deck.presentation.addElement(page)
        frame = Frame(width="20cm", height="6cm", x="1cm", y=f"{1 + 7 * (box_at % 2)}cm")
        box = TextBox()
        for pieces in paras[at : at + 3]:
            p = P()
            _odf_fill(p, pieces, styles)
            box.addElement(p)
        frame.addElement(box)
        page.addElement(frame)
    return saved(deck)


def _xhtml(title: str, paras: list[list[Piece]]) -> bytes:
    tags = {"b": ("<b>", "</b>"), "i": ("<i>", "</i>")}
    body = [f"<h1>{_escape(plain(paras[0]))}</h1>"]
    for k, pieces in enumerate(paras[1:]):
        out = []
        for j, (text, kind) in enumerate(pieces):
            start, end = tags.get(kind, ("", ""))
            if kind == "a":
                start, end = f'<a href="{URL.format(j)}">', "</a>"
            out.append(f"{start}{_escape(text)}{end}")
        body.append("<p>" + "".join(out) + "</p>")
        if k == 0:
            body.append('<p><img src="../dot.png" alt=""/></p>')
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE html>\n<html xmlns="http://'
        f'www.w3.org/1999/xhtml"><head><title>{title}</title></head>\n<body>\n'
        + "\n".join(body)
        + "\n</body></html>\n"
    ).encode()


def make_epub(paras: list[list[Piece]]) -> bytes:
    """Two XHTML chapters (a heading and paragraphs each), a picture, the package."""
    half = len(paras) // 2
    files = {
        "mimetype": b"application/epub+zip",
        "META-INF/container.xml": b'<?xml version="1.0"?><container version="1.0" '
        b'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles><rootfile '
        b'full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
        b"</rootfiles></container>",
        "OEBPS/content.opf": b'<?xml version="1.0"?><package xmlns="http://www.idpf.org/'
        b'2007/opf" version="3.0" unique-identifier="id"><metadata xmlns:dc="http://purl.'
        b'org/dc/elements/1.1/"><dc:identifier id="id">office-goals</dc:identifier>'
        b"<dc:title>test2016</dc:title><dc:language>en</dc:language></metadata><manifest>"
        b'<item id="c1" href="text/one.xhtml" media-type="application/xhtml+xml"/>'
        b'<item id="c2" href="text/two.xhtml" media-type="application/xhtml+xml"/>'
        b'<item id="p" href="dot.png" media-type="image/png"/></manifest><spine>'
        b'<itemref idref="c1"/><itemref idref="c2"/></spine></package>',
        "OEBPS/text/one.xhtml": _xhtml("One", paras[:half]),
        "OEBPS/text/two.xhtml": _xhtml("Two", paras[half:]),
        "OEBPS/dot.png": png(),
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, content in files.items():
            stored = name in ("mimetype", "OEBPS/dot.png")
            z.writestr(name, content, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return out.getvalue()


MAKERS = {
    "docx": make_docx,
    "pptx": make_pptx,
    "xlsx": make_xlsx,
    "odt": make_odt,
    "odp": make_odp,
    "epub": make_epub,
}
# the members that hold text (the only ones that may change)
TEXT_PARTS = {
    "docx": re.compile(r"word/(document|header\d*|footer\d*)\.xml$"),
    "pptx": re.compile(r"ppt/(slides/slide|notesSlides/notesSlide)\d+\.xml$"),
    "xlsx": re.compile(r"xl/(sharedStrings|worksheets/sheet\d+)\.xml$"),
    "odt": re.compile(r"(content|styles)\.xml$"),
    "odp": re.compile(r"(content|styles)\.xml$"),
    "epub": re.compile(r"OEBPS/text/\w+\.xhtml$"),
}
# the LibreOffice component that opens each format
COMPONENT = {
    "docx": "libswlo.so",
    "odt": "libswlo.so",
    "epub": "libswlo.so",
    "pptx": "libsdlo.so",
    "odp": "libsdlo.so",
    "xlsx": "libsclo.so",
}

# ---- reading a file back with its library ------------------------------------------------


@dataclass
class Para:
    """One paragraph as its library reads it: its text, its formatted runs with text,
    and those left without text."""

    text: str
    bold: int = 0
    italic: int = 0
    links: int = 0
    empty: int = 0


@dataclass
class Read:
    paras: list[Para] = field(default_factory=list)
    cells: dict[str, object] = field(default_factory=dict)  # xlsx: the cells not text
    error: str | None = None


def _nonempty(text: str | None) -> bool:
    return bool(text and text.strip())


def read_docx(data: bytes) -> Read:
    import docx
    from docx.text.hyperlink import Hyperlink

    document = docx.Document(io.BytesIO(data))
    found = list(document.paragraphs)
    for table in document.tables:
        for row in table.rows:
            for cell in row.cells:
                found.extend(cell.paragraphs)
    for section in document.sections:
        found.extend(section.header.paragraphs)
        found.extend(section.footer.paragraphs)
    out = []
    for p in found:
        para = Para(p.text)
        for item in p.iter_inner_content():
            runs = item.runs if isinstance(item, Hyperlink) else [item]
            if isinstance(item, Hyperlink) and item.address:
                para.links += _nonempty(item.text)
                para.empty += not _nonempty(item.text)
            for run in runs:
                has = _nonempty(run.text)
                para.bold += bool(run.bold) and has
                para.italic += bool(run.italic) and has
                para.empty += (bool(run.bold) or bool(run.italic)) and not has
        if p.text.strip():
            out.append(para)
    return Read(out)


def read_pptx(data: bytes) -> Read:
    import pptx

    deck = pptx.Presentation(io.BytesIO(data))
    frames = []
    for slide in deck.slides:
        frames.extend(s.text_frame for s in slide.shapes if s.has_text_frame)
        if slide.has_notes_slide:
            frames.append(slide.notes_slide.notes_text_frame)
    out = []
    for frame in frames:
        for p in frame.paragraphs:
            para = Para(p.text)
            for run in p.runs:
                has = _nonempty(run.text)
                para.bold += bool(run.font.bold) and has
                para.italic += bool(run.font.italic) and has
                para.links += bool(run.hyperlink.address) and has
                formatted = run.font.bold or run.font.italic or run.hyperlink.address
                para.empty += bool(formatted) and not has
            if p.text.strip():
                out.append(para)
    return Read(out)


def read_xlsx(data: bytes) -> Read:
    import openpyxl
    from openpyxl.cell.rich_text import CellRichText, TextBlock

    book = openpyxl.load_workbook(io.BytesIO(data), rich_text=True)
    read = Read()
    for sheet in book.worksheets:
        for row in sheet.iter_rows():
            for cell in row:
                value = cell.value
                if isinstance(value, (str, CellRichText)) and cell.data_type != "f":
                    para = Para(str(value), links=int(bool(cell.hyperlink)))
                    for block in value if isinstance(value, CellRichText) else ():
                        if isinstance(block, TextBlock):
                            has = _nonempty(block.text)
                            para.bold += bool(block.font.b) and has
                            para.italic += bool(block.font.i) and has
                            para.empty += (bool(block.font.b) or bool(block.font.i)) and not has
                    read.paras.append(para)
                elif value is not None:
                    read.cells[f"{sheet.title}!{cell.coordinate}"] = value
    return read


def read_odf(data: bytes) -> Read:
    from odf import teletype
    from odf.namespaces import STYLENS, TEXTNS
    from odf.opendocument import load
    from odf.style import Style, TextProperties

    document = load(io.BytesIO(data))
    kinds: dict[str, set[str]] = {}
    for holder in (document.automaticstyles, document.styles):
        for style in holder.getElementsByType(Style):
            found = set()
            for props in style.getElementsByType(TextProperties):
                if props.getAttribute("fontweight") == "bold":
                    found.add("b")
                if props.getAttribute("fontstyle") == "italic":
                    found.add("i")
            kinds[style.getAttrNS(STYLENS, "name")] = found
    out = []
    blocks = []
    for holder in (document.masterstyles, document.body):
        blocks += [e for e in _walk(holder) if e.qname in ((TEXTNS, "p"), (TEXTNS, "h"))]
    for block in blocks:
        text = teletype.extractText(block)
        para = Para(text)
        for span in _walk(block, (TEXTNS, "span"), (TEXTNS, "a")):
            has = _nonempty(teletype.extractText(span))
            if span.qname == (TEXTNS, "a"):
                para.links += has
                para.empty += not has
                continue
            style = kinds.get(span.getAttrNS(TEXTNS, "style-name"), set())
            para.bold += "b" in style and has
            para.italic += "i" in style and has
            para.empty += bool(style) and not has
        if text.strip():
            out.append(para)
    return Read(out)


def _walk(element, *qnames):
    """`element`'s descendants in document order (those named `qnames` only, if given)."""
    for child in element.childNodes:
        if child.nodeType != child.ELEMENT_NODE:
            continue
        if not qnames or child.qname in qnames:
            yield child
        yield from _walk(child, *qnames)


XHTML = "{http://www.w3.org/1999/xhtml}"


def read_epub(data: bytes) -> Read:
    """No library reads an epub here: zipfile and lxml, and the checks an e-reader makes
    first (the `mimetype` member first and stored, every manifest item present, every XML
    member well-formed)."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        infos = z.infolist()
        if infos[0].filename != "mimetype" or infos[0].compress_type != zipfile.ZIP_STORED:
            raise ValueError("the mimetype member is not first and stored")
        if z.read("mimetype") != b"application/epub+zip":
            raise ValueError("the mimetype member is wrong")
        parser = etree.XMLParser(resolve_entities=False, no_network=True)
        parsed = {
            i.filename: etree.fromstring(z.read(i), parser)
            for i in infos
            if i.filename.endswith((".xml", ".opf", ".xhtml"))
        }
        opf = parsed["OEBPS/content.opf"]
        chapters = []
        for item in opf.iter("{http://www.idpf.org/2007/opf}item"):
            name = "OEBPS/" + item.get("href")
            if name not in z.namelist():
                raise ValueError(f"the manifest's {name} is missing")
            if item.get("media-type") == "application/xhtml+xml":
                chapters.append(parsed[name])
    out = []
    for root in chapters:
        for block in root.iter(f"{XHTML}h1", f"{XHTML}p"):
            text = "".join(block.itertext())
            para = Para(text)
            for kind, tag in (("bold", "b"), ("italic", "i"), ("links", "a")):
                for e in block.iter(f"{XHTML}{tag}"):
                    has = _nonempty("".join(e.itertext()))
                    if tag != "a" or e.get("href"):
                        setattr(para, kind, getattr(para, kind) + has)
                        para.empty += not has
            if text.strip():
                out.append(para)
    return Read(out)


READERS = {
    "docx": read_docx,
    "pptx": read_pptx,
    "xlsx": read_xlsx,
    "odt": read_odf,
    "odp": read_odf,
    "epub": read_epub,
}


def read(format: str, data: bytes) -> Read:
    try:
        return READERS[format](data)
    except Exception as e:  # the goal's (e): any error the library raises is the finding
        return Read(error=f"{type(e).__name__}: {' '.join(str(e).split())}")


# ---- judging an output against its source -------------------------------------------------


def members(data: bytes) -> list[tuple[str, bytes, int]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(i.filename, z.read(i), i.compress_type) for i in z.infolist()]


def judged(format: str, source: bytes, output: bytes, spelled: list[str] | None) -> dict:
    before, after = read(format, source), read(format, output)
    if before.error:
        raise SystemExit(f"{format}: the source does not read back: {before.error}")
    row: dict = {"format": format, "opened": after.error or "yes"}
    # (d) the members
    ins, outs = members(source), members(output)
    row["same_names_in_order"] = [m[0] for m in ins] == [m[0] for m in outs]
    theirs = {name: (content, kind) for name, content, kind in outs}
    changed = [n for n, c, k in ins if theirs.get(n) != (c, k)]
    texts = [n for n, _, _ in ins if TEXT_PARTS[format].search(n)]
    row["members"] = len(ins)
    row["text_parts"] = texts
    row["changed"] = changed
    row["changed_not_text"] = [n for n in changed if n not in texts]
    row["kept_not_text"] = sum(1 for n, _, _ in ins if n not in texts and n not in changed)
    row["not_text"] = len(ins) - len(texts)
    if after.error:
        return row
    # (a) translated, (b) runs, (c) numbers
    src, out = before.paras, after.paras
    row["paragraphs"] = len(src)
    row["paragraphs_out"] = len(out)
    pairs = list(zip(src, out))
    row["translated"] = sum(1 for s, o in pairs if o.text.strip() and o.text != s.text)
    row["untranslated"] = [s.text for s, o in pairs if not (o.text.strip() and o.text != s.text)]
    for kind in ("bold", "italic", "links", "empty"):
        row[f"{kind}_in"] = sum(getattr(p, kind) for p in src)
        row[f"{kind}_out"] = sum(getattr(p, kind) for p in out)
    row["runs_differ"] = [
        {"source": s.text, "output": o.text, **_differences(s, o)}
        for s, o in pairs
        if (s.bold, s.italic, s.links, s.empty) != (o.bold, o.italic, o.links, o.empty)
    ]
    numbered = [(s, o) for s, o in pairs if NUMBER.search(s.text)]
    lost = [
        (s.text, o.text)
        for s, o in numbered
        if Counter(NUMBER.findall(s.text)) - Counter(NUMBER.findall(o.text))
    ]
    row["with_numbers"] = len(numbered)
    row["numbers_kept"] = len(numbered) - len(lost)
    row["numbers_lost"] = lost
    row["numbers_spelled"] = sum(1 for s, o in lost if spelled and _spelled(s, o, spelled))
    row["double_spaces"] = sum(1 for s, o in pairs if "  " in o.text and "  " not in s.text)
    row["cells"] = len(before.cells)
    row["cells_kept"] = sum(1 for k, v in before.cells.items() if after.cells.get(k) == v)
    row["cells_same_set"] = set(before.cells) == set(after.cells)
    return row


def _spelled(source: str, output: str, words: list[str]) -> bool:
    """Whether every number of `source` missing from `output` (two to ten) is there as a
    word of the target language (`SPELLED`)."""
    missing = Counter(NUMBER.findall(source)) - Counter(NUMBER.findall(output))
    found = Counter(w.strip(".,;:!?\"'„“").lower() for w in output.split())
    return all(
        n.isdigit() and 2 <= int(n) <= 10 and found[words[int(n) - 2]] >= k
        for n, k in missing.items()
    )


def _differences(s: Para, o: Para) -> dict:
    return {
        k: [getattr(s, k), getattr(o, k)]
        for k in ("bold", "italic", "links", "empty")
        if getattr(s, k) != getattr(o, k)
    }


def met(row: dict) -> bool:
    if row["opened"] != "yes":
        return False
    return (
        row["translated"] == row["paragraphs"] == row["paragraphs_out"]
        and all(row[f"{k}_in"] == row[f"{k}_out"] for k in ("bold", "italic", "links"))
        and row["empty_out"] == 0
        and row["numbers_kept"] == row["with_numbers"]
        and row["cells_kept"] == row["cells"]
        and row["cells_same_set"]
        and row["same_names_in_order"]
        and not row["changed_not_text"]
    )


# ---- LibreOffice ------------------------------------------------------------------------------

SOFFICE = Path("/usr/bin/soffice")


def libreoffice(format: str, files: dict[str, bytes], folder: Path) -> str:
    """`soffice --convert-to pdf` of each of `files` (name -> bytes): its exit status and
    which PDFs it wrote; "not installed" where soffice or the format's component is not."""
    if not SOFFICE.exists():
        return "not installed"
    program = SOFFICE.resolve().parent
    if not (program / COMPONENT[format]).exists():
        return f"not installed ({COMPONENT[format]})"
    paths = []
    for name, data in files.items():
        path = folder / f"{name}.{format}"
        path.write_bytes(data)
        paths.append(path)
    pdfs = folder / "pdf"
    pdfs.mkdir(exist_ok=True)
    profile = (folder / "profile").as_uri()
    argv = [str(SOFFICE), f"-env:UserInstallation={profile}", "--headless", "--convert-to"]
    try:
        done = subprocess.run(
            [*argv, "pdf", "--outdir", str(pdfs), *map(str, paths)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        return "timed out"
    said = " ".join((done.stdout + done.stderr).split())
    made = ", ".join(
        f"{p.stem.split('-')[0]} {'yes' if (pdfs / f'{p.stem}.pdf').is_file() else 'no'}"
        for p in paths
    )
    why = re.findall(r"Error: [^.]*?(?= Error:|$)", said)
    return f"rc {done.returncode}, PDF {made}" + (f" ({why[0]})" if why else "")


# ---- the run ------------------------------------------------------------------------------


def fake(texts: list[str]):
    from mtkit.core.translation import Translation

    return [
        Translation(t, t.upper(), -1.0, -0.5, (), tuple((k, k) for k in range(len(t.split()))))
        for t in texts
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", help="a checkpoint (default: a fake translation)")
    parser.add_argument("--sentences", type=int, default=40, help="paragraphs a format")
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-soffice", action="store_true", help="skip LibreOffice")
    parser.add_argument("--keep", help="a folder to write each source and output into")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import mtkit
    from mtkit.documents.formats import translate_files

    translator = mtkit.Translator.load(args.model, device="cpu") if args.model else None
    rows = []
    for k, format in enumerate(args.formats):
        paras = paragraphs(args.sentences, k * args.sentences, args.seed)
        source = MAKERS[format](paras)
        start = time.perf_counter()
        if translator is not None:
            output = translator.translate_document(source, format)
        else:
            output = translate_files([source], format, fake)[0]
        seconds = time.perf_counter() - start
        target = translator.target_language if translator is not None else None
        row = judged(format, source, output, SPELLED.get(target or ""))
        row["seconds"] = round(seconds, 2)
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            Path(args.keep, f"source.{format}").write_bytes(source)
            Path(args.keep, f"output.{format}").write_bytes(output)
        if args.no_soffice:
            row["libreoffice"] = "not run"
        else:
            folder = Path(tempfile.mkdtemp(prefix="office-goals-"))
            try:
                row["libreoffice"] = libreoffice(
                    format, {f"source-{format}": source, f"output-{format}": output}, folder
                )
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        row["met"] = met(row)
        rows.append(row)
    print_table(rows)
    if args.json:
        print(json.dumps({"model": args.model or "fake (capitals)", "rows": rows}))
    sys.exit(0 if all(r["met"] for r in rows) else 1)


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'format':<6} {'translated':>10} {'bold':>7} {'italic':>7} {'links':>7} {'empty':>5} "
        f"{'numbers':>16} {'members':>8} {'opened':>6} {'s':>5}  LibreOffice (source, output)"
    )
    print(head)
    for r in rows:
        if r["opened"] != "yes":
            print(f"{r['format']:<6} output not opened: {r['opened']}")
            continue
        numbers = f"{r['numbers_kept']}/{r['with_numbers']}"
        if r["numbers_spelled"]:
            numbers += f" ({r['numbers_spelled']}w)"
        if r["cells"]:
            numbers += f" +{r['cells_kept']}/{r['cells']}c"
        print(
            f"{r['format']:<6} {r['translated']:>4}/{r['paragraphs']:<5} "
            f"{r['bold_in']:>3}/{r['bold_out']:<3} {r['italic_in']:>3}/{r['italic_out']:<3} "
            f"{r['links_in']:>3}/{r['links_out']:<3} {r['empty_out']:>5} {numbers:>16} "
            f"{r['kept_not_text']:>3}/{r['not_text']:<4} {'yes':>6} {r['seconds']:>5.1f}  "
            f"{r['libreoffice']}"
        )
    print(
        "(translated: paragraphs whose output differs / all; bold, italic, links: runs with "
        "text in / out; empty: formatted runs and links left without text in the output; "
        "numbers: paragraphs with numbers keeping them all in digits / all ((Nw): of those "
        "not, N with each missing number spelled out as a word of the target language; +c: "
        "xlsx's number, formula and date cells equal / all); members: not holding text, kept "
        "byte for byte / all)"
    )
    for r in rows:
        extra = []
        if r.get("double_spaces"):
            extra.append(f"{r['double_spaces']} paragraphs with two spaces in a row")
        if r["changed_not_text"]:
            extra.append(f"changed members not holding text: {r['changed_not_text']}")
        if not r["same_names_in_order"]:
            extra.append("the members' names or order differ")
        if r.get("paragraphs_out", r.get("paragraphs")) != r.get("paragraphs"):
            extra.append(f"paragraphs out: {r['paragraphs_out']}")
        texts = len(r["text_parts"])
        changed = len(r["changed"])
        print(f"{r['format']}: {changed} members changed, of {texts} with text: {r['changed']}")
        for line in extra:
            print(f"  {line}")
        for d in r.get("runs_differ", [])[:5]:
            print(f"  runs differ {json.dumps(d, ensure_ascii=False)}")
        for s, o in r.get("numbers_lost", [])[:5]:
            print(f"  numbers lost: {s!r} -> {o!r}")


if __name__ == "__main__":
    main()
