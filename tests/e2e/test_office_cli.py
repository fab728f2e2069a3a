"""Office documents and e-books with a trained model: `mtkit translate -i FILE` by the
file's suffix or `--format`, and the API's `Translator.translate_document` and
`translate_file`; each output read back by its own library (and, where LibreOffice's
Writer, Calc and Impress are installed, converted by them headless), its text parts
translated, its runs as many as the source's, its other members byte for byte; mistakes in
one line, nothing written."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

import mtkit

from conftest import cli, one_line_error
from officefiles import (
    assert_rest_kept,
    make_docx,
    make_epub,
    make_odp,
    make_odt,
    make_pptx,
    make_xlsx,
    members,
)

docx = pytest.importorskip("docx")
pptx = pytest.importorskip("pptx")
openpyxl = pytest.importorskip("openpyxl")
pytest.importorskip("odf")

# Each format's file and the members that hold its text
MADE = {
    "docx": (make_docx, {"word/document.xml", "word/header1.xml", "word/footer1.xml"}),
    "pptx": (make_pptx, {"ppt/slides/slide1.xml", "ppt/notesSlides/notesSlide1.xml"}),
    "xlsx": (make_xlsx, {"xl/sharedStrings.xml", "xl/worksheets/sheet1.xml"}),
    "odt": (make_odt, {"content.xml", "styles.xml"}),
    "odp": (make_odp, {"content.xml"}),
    "epub": (make_epub, {"OEBPS/text/one.xhtml"}),
}


def _model(trained):
    return str(trained / "run" / "checkpoints" / "best.pt")


def _bold_runs(document) -> int:
    return sum(bool(r.bold) for p in document.paragraphs for r in p.runs)


def test_a_docx_by_its_suffix_is_translated_with_its_runs(trained, tmp_path):
    source = make_docx()
    (tmp_path / "report.docx").write_bytes(source)
    out = tmp_path / "out.docx"
    result = cli("translate", "-m", _model(trained), "-i", tmp_path / "report.docx", "-o", out)
    assert result.exit_code == 0, result.output
    before, after = docx.Document(io.BytesIO(source)), docx.Document(out)
    texts = [(a.text, b.text) for a, b in zip(before.paragraphs, after.paragraphs, strict=True)]
    assert all(b and b != a for a, b in texts if a.strip()), texts
    assert (_bold_runs(before), _bold_runs(after)) == (3, 2)  # (two merged: one proofErr)
    assert sum(r.italic is True for p in after.paragraphs for r in p.runs) == 1
    assert len(after.paragraphs[0].hyperlinks) == 1
    assert_rest_kept(source, out.read_bytes(), MADE["docx"][1] & set(members(source)))
    # --format on stdin, the same bytes out on stdout
    piped = cli("translate", "-m", _model(trained), "--format", "docx", input=source)
    assert piped.exit_code == 0 and piped.stdout_bytes == out.read_bytes()


@pytest.mark.parametrize("format", ["pptx", "xlsx", "odt", "odp", "epub"])
def test_each_file_format_through_the_api_translates_every_text_part(trained, tmp_path, format):
    make, changed = MADE[format]
    source = make()
    with mtkit.Translator.load(_model(trained), device="cpu") as translator:
        output = translator.translate_document(source, format)
        (tmp_path / f"a.{format}").write_bytes(source)
        translator.translate_file(tmp_path / f"a.{format}", tmp_path / f"b.{format}")
    assert (tmp_path / f"b.{format}").read_bytes() == output
    assert_rest_kept(source, output, changed)
    if format == "pptx":
        deck = pptx.Presentation(io.BytesIO(output))
        runs = [r for s in deck.slides[0].shapes for p in s.text_frame.paragraphs for r in p.runs]
        assert sum(bool(r.font.bold) for r in runs) == 1
        assert sum(r.hyperlink.address is not None for r in runs) == 1
    elif format == "xlsx":
        sheet = openpyxl.load_workbook(io.BytesIO(output)).active
        assert sheet["A1"].value != "A man rides" and sheet["A2"].value == 3.25
        assert sheet["A3"].value == "=SUM(A2:A2)"


def test_file_format_mistakes_are_one_line_and_write_nothing(trained, tmp_path):
    out = tmp_path / "out.docx"
    bad = io.BytesIO()
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("../../evil", b"x")
    (tmp_path / "evil.docx").write_bytes(bad.getvalue())
    one_line_error(
        cli("translate", "-m", _model(trained), "-i", tmp_path / "evil.docx", "-o", out),
        "outside its folder",
    )
    (tmp_path / "plain.docx").write_text("just text")
    one_line_error(
        cli("translate", "-m", _model(trained), "-i", tmp_path / "plain.docx", "-o", out),
        "is not a docx file: it is not a zip archive",
    )
    # a zip on stdin without --format is refused as binary, not translated as text
    one_line_error(
        cli("translate", "-m", _model(trained), input=make_docx()), "looks like a zip archive"
    )
    # a PDF is refused by its name, saying why, whatever its bytes hold
    (tmp_path / "report.pdf").write_bytes(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n")
    (tmp_path / "notes.pdf").write_text("A dog runs.\n")
    for pdf in ("report.pdf", "notes.pdf"):
        one_line_error(
            cli("translate", "-m", _model(trained), "-i", tmp_path / pdf, "-o", out),
            "error: PDF is not translated: a PDF holds glyphs placed on pages, not paragraphs",
        )
    one_line_error(
        cli("translate", "-m", _model(trained), "--format", "pdf", input="A dog runs."),
        "got 'pdf': PDF is not translated",
    )
    assert not out.exists()
    with mtkit.Translator.load(_model(trained), device="cpu") as translator:
        with pytest.raises(mtkit.Error, match=r"^PDF is not translated: .* convert it to docx"):
            translator.translate_file(tmp_path / "notes.pdf", out)
        with pytest.raises(mtkit.Error, match=r"^format docx is a file, not text"):
            translator.translate(["A dog."], format="docx")
        with pytest.raises(mtkit.Error, match="give the document's bytes"):
            translator.translate_document("text", "docx")


SOFFICE = shutil.which("soffice")
ODF_TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
# Each format: the LibreOffice component that opens it (its library, beside soffice), what
# it is converted to (soffice --convert-to), and how the conversion is checked
LIBREOFFICE = {
    "docx": ("Writer", "swlo", "txt:Text"),
    "odt": ("Writer", "swlo", "txt:Text"),
    "xlsx": ("Calc", "sclo", "csv:Text - txt - csv (StarCalc):44,34,76"),  # (76: UTF-8)
    "pptx": ("Impress", "sdlo", "odp"),
    "odp": ("Impress", "sdlo", "pptx"),
}


def _libreoffice_has(library: str) -> bool:
    """Whether LibreOffice is installed with the component whose library is `library`
    (Debian packages Writer, Calc and Impress apart: libswlo.so, libsclo.so, libsdlo.so
    beside the soffice they share)."""
    if SOFFICE is None:
        return False
    program = Path(SOFFICE).resolve().parent
    return any(program.glob(f"lib{library}.*")) or any(program.glob(f"{library}.*"))


def _converted(tmp_path: Path, data: bytes, format: str) -> Path:
    """`data` (a `format` file) converted by LibreOffice, headless, as LIBREOFFICE says:
    the file it wrote (soffice answers 0 even where it could not load the file: the
    file's absence says so)."""
    (tmp_path / f"out.{format}").write_bytes(data)
    target = LIBREOFFICE[format][2]
    done = subprocess.run(
        [SOFFICE, f"-env:UserInstallation=file://{tmp_path}/profile", "--headless"]
        + ["--convert-to", target, "--outdir", str(tmp_path / "converted")]
        + [str(tmp_path / f"out.{format}")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    written = tmp_path / "converted" / f"out.{target.split(':')[0]}"
    assert done.returncode == 0 and written.is_file(), (done.stdout, done.stderr)
    return written


def _odf_paragraphs(data: bytes) -> list[str]:
    """The text of each non-empty paragraph and heading of an ODF file's content.xml,
    its whitespace left out (LibreOffice and the writer space runs their own way)."""
    from lxml import etree

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        root = etree.fromstring(z.read("content.xml"))
    found = ("".join(p.itertext()) for p in root.iter(f"{ODF_TEXT}p", f"{ODF_TEXT}h"))
    return [t for t in ("".join(x.split()) for x in found) if t]


def _pptx_paragraphs(data: bytes) -> list[str]:
    """The text of each non-empty paragraph of a deck's slides and notes (python-pptx),
    its whitespace left out."""
    deck = pptx.Presentation(io.BytesIO(data))
    frames = [s.text_frame for slide in deck.slides for s in slide.shapes if s.has_text_frame]
    frames += [slide.notes_slide.notes_text_frame for slide in deck.slides if slide.has_notes_slide]
    found = ("".join(p.text.split()) for frame in frames for p in frame.paragraphs)
    return [t for t in found if t]


@pytest.mark.parametrize("format", list(LIBREOFFICE))
def test_libreoffice_opens_the_translated_file(trained, tmp_path, format):
    """Each translated file opened by LibreOffice headless and converted: a text file's
    paragraphs (docx, odt), a workbook's cells as CSV (its strings as openpyxl reads them,
    translated; its number, formula and date as they were), a deck's paragraphs in the
    other deck format (pptx to odp and back), as the format's own library reads them."""
    component, library, _ = LIBREOFFICE[format]
    if not _libreoffice_has(library):
        pytest.skip(f"LibreOffice {component} is not installed")
    make, _ = MADE[format]
    source = make()
    with mtkit.Translator.load(_model(trained), device="cpu") as translator:
        output = translator.translate_document(source, format)
    converted = _converted(tmp_path, output, format)
    if format in ("docx", "odt"):
        text = converted.read_text(encoding="utf-8-sig")
        paragraphs = [line for line in text.splitlines() if line.strip()]
        assert len(paragraphs) >= 2 and "A man is" not in text
    elif format == "xlsx":
        rows = list(csv.reader(converted.read_text(encoding="utf-8").splitlines()))
        cells = [row[0] if row else "" for row in rows]
        assert cells[1:4] == ["3.25", "3.25", "2024-01-02"]  # (the formula computed)
        before = openpyxl.load_workbook(io.BytesIO(source)).active
        after = openpyxl.load_workbook(io.BytesIO(output)).active
        for i in (1, 5, 6, 7):  # A1, the inline rich text, the two shared strings
            value = str(after[f"A{i}"].value)
            assert cells[i - 1] == value and value and value != str(before[f"A{i}"].value)
    elif format == "pptx":
        translated = _pptx_paragraphs(output)
        assert "Helloworld" not in translated and len(translated) >= 3
        assert set(translated) <= set(_odf_paragraphs(converted.read_bytes()))
    else:  # odp
        translated = _odf_paragraphs(output)
        assert translated and "Slidewordshere" not in translated
        assert _pptx_paragraphs(converted.read_bytes()) == translated


def test_translate_file_never_writes_over_its_input(trained, tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<p>A dog runs.</p>")
    with mtkit.Translator.load(trained / "run" / "checkpoints" / "best.pt") as translator:
        with pytest.raises(mtkit.Error, match="same file"):
            translator.translate_file(page, page)
    assert page.read_text() == "<p>A dog runs.</p>"
