"""Documents that are not what they look like (issue 75): an XML text without an
element, a declared charset that is a codec but no text encoding, a binary file given as
text. Where nothing is wrong the document is translated (or, with nothing in it to
translate, comes back as it was); where something is, the command says so in one line
and exits 2, writing nothing, the Python API raises `mtkit.Error`, and the server
answers 4xx in its protocol's shape, never 500."""

from __future__ import annotations

import gzip
import io
import zipfile
from pathlib import Path

import pytest

import mtkit
from mtkit.api import translate_file
from mtkit.core.search_options import SearchOptions
from mtkit.core.textio import read_chunks

from faultkit import assert_one_line, cli

NOT_TEXT = "not text: mtkit translates text and the document formats --format lists"


@pytest.fixture(scope="module")
def model(trained) -> Path:
    return trained / "run" / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def translator(model):
    with mtkit.Translator.load(model, device="cpu") as t:
        yield t


WITHOUT_AN_ELEMENT = [
    b'<?xml version="1.0"?>\n',
    b"",
    b"<!-- a comment only -->\n",
    b" \n\t\n",
    b'<?xml version="1.0"?>\n<!DOCTYPE d [<!ENTITY e "x">]>\n<!-- c -->\n',
]


@pytest.mark.parametrize("document", WITHOUT_AN_ELEMENT)
def test_an_xml_text_without_an_element_comes_back_as_it_was(model, translator, tmp_path, document):
    """Once an IndexError (exit 1): the error's quoting read the line after the last.
    There is nothing to translate in it, as in an empty text of a batch."""
    path, out = tmp_path / "e.xml", tmp_path / "out.xml"
    path.write_bytes(document)
    result = cli("translate", "-m", model, "-i", path, "-o", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == document
    (found,) = translator.translate([document.decode()], format="xml")
    assert found.text == document.decode()


def test_an_empty_text_in_a_batch_of_xml_is_empty_and_the_rest_translated(translator):
    empty, page = translator.translate(["", "<p>A dog.</p>"], format="xml")
    alone = translator.translate(["<p>A dog.</p>"], format="xml")[0]
    assert empty.text == "" and page.text == alone.text and page.text.startswith("<p>")


def test_bare_text_in_a_declared_xml_document_is_one_line_and_alone_a_fragment(
    model, translator, tmp_path
):
    """A document (its declaration says so) needs a root; a segment is the content of an
    implied element, where text alone is well-formed."""
    path = tmp_path / "t.xml"
    path.write_text('<?xml version="1.0"?>\nA dog runs.\n')
    result = cli("translate", "-m", model, "-i", path)
    assert_one_line(result, says="the XML is not well-formed: syntax error: line 2")
    with pytest.raises(mtkit.Error, match="not well-formed: syntax error: line 2, column 0"):
        translator.translate(['<?xml version="1.0"?>\nA dog runs.'], format="xml")
    (fragment,) = translator.translate(["A dog runs."], format="xml")
    assert fragment.text == translator.translate(["A dog runs."])[0].text


def test_the_deepl_route_translates_an_empty_text_among_xml_ones(model):
    """Once a 500 in text/plain: an empty text is ordinary in a DeepL batch."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mtkit.engines.loader import load_engine
    from mtkit.serving.app import create_app
    from mtkit.serving.scheduler import Limits

    engine = load_engine(model, "cpu")
    app = create_app(engine, SearchOptions.from_config(engine.config.decode), Limits(), "best.pt")
    with TestClient(app) as c:
        fields = {"text": ["", "<p>A dog.</p>"], "target_lang": "DE", "tag_handling": "xml"}
        r = c.post("/v2/translate", json=fields)
        assert r.status_code == 200, r.text
        empty, page = r.json()["translations"]
        assert empty["text"] == "" and page["text"].startswith("<p>")
        fields["text"] = ["A dog & a cat."]  # a fragment that is not well-formed: 400 in
        r = c.post("/v2/translate", json=fields)  # DeepL's shape, its place the text's own
        assert r.status_code == 400, r.text
        assert r.json()["message"] == (
            "the XML is not well-formed: not well-formed (invalid token): line 1, column 7 "
            "('A dog & a cat.')"
        )


@pytest.mark.parametrize(
    "name, document",
    [
        ("page.html", b'<html><head><meta charset="hex"></head><p>A dog.</p></html>'),
        ("page.html", b"<meta charset=base64><p>A dog.</p>"),
        ("doc.xml", b'<?xml version="1.0" encoding="rot13"?><d>A dog.</d>'),
        (
            "de.po",
            b'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=zlib\\n"\n\n'
            b'msgid "A dog."\nmsgstr ""\n',
        ),
    ],
)
def test_a_declared_codec_that_is_no_text_encoding_is_one_line(
    model, tmp_path, engine_translate_file, name, document
):
    """Once a LookupError traceback (exit 1); `klingon`, no codec at all, was one line."""
    path, out = tmp_path / name, tmp_path / f"out-{name}"
    path.write_bytes(document)
    says = "the document declares an encoding that is not a text encoding: "
    assert_one_line(cli("translate", "-m", model, "-i", path, "-o", out), says=says)
    assert not out.exists()
    with pytest.raises(mtkit.Error, match=says):
        engine_translate_file(path, out)
    assert not out.exists()


@pytest.fixture(scope="module")
def engine_translate_file(translator):
    """The API's `translate_file`, its format by the input's suffix, as the CLI calls it."""
    from mtkit.documents.formats import output_format

    def run(path: Path, out: Path, kind: str | None = None) -> None:
        written = output_format(kind, path)
        translate_file(
            translator.engine, path, out, written, {"beam": 2}, split=True, batch_tokens=4000
        )

    return run


def _zip(name: str) -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as z:
        z.writestr(name, "<w:document>A dog runs.</w:document>")
    return data.getvalue()


BINARY = [
    ("report.docx", _zip("word/document.xml"), "a zip archive (a .docx, .xlsx"),
    ("book.epub", _zip("mimetype"), "a zip archive"),
    ("notes.pdf", b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n", "a PDF"),
    ("logo.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "a PNG image"),
    ("photo.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "a JPEG image"),
    ("anim.gif", b"GIF89a\x01\x00\x01\x00\x00\x00", "a GIF image"),
    ("old.doc", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1\x00\x00", "an old Office file (a .doc"),
]


@pytest.mark.parametrize("kind", ["text", "jsonl", "html", "xml", "srt", "po"])
@pytest.mark.parametrize("name, data, looks", BINARY, ids=[name for name, _, _ in BINARY])
def test_a_binary_file_given_as_text_is_one_line_naming_what_it_looks_like(
    model, tmp_path, engine_translate_file, name, data, looks, kind
):
    """Once translated into German-looking garbage, exit 0 (a .docx: 915 bytes)."""
    path, out = tmp_path / name, tmp_path / "out"
    path.write_bytes(data)
    says = f"error: the input looks like {looks}"
    line = assert_one_line(
        cli("translate", "-m", model, "-i", path, "-o", out, "--format", kind), says=says
    )
    assert line.endswith(NOT_TEXT)
    assert not out.exists()
    with pytest.raises(mtkit.Error, match=f"looks like {looks[:12]}"):
        engine_translate_file(path, out, kind)
    assert not out.exists()
    if kind == "text":  # and on stdin
        result = cli("translate", "-m", model, input=data)
        assert_one_line(result, says=says)
        assert result.stdout == ""


@pytest.mark.parametrize("kind", ["text", "html", "srt"])
def test_nul_bytes_in_a_utf8_text_are_binary_data_refused_in_one_line(
    model, tmp_path, engine_translate_file, kind
):
    path, out = tmp_path / "data.bin", tmp_path / "out"
    path.write_bytes(b"A dog runs.\n\x00\x01\x02\x03 x\n")
    says = "error: the input holds a NUL character (at "
    result = cli("translate", "-m", model, "-i", path, "-o", out, "--format", kind)
    assert_one_line(result, says=says).endswith(
        "binary data? mtkit translates text and the document formats --format lists"
    )
    assert not out.exists()
    with pytest.raises(mtkit.Error, match="holds a NUL character"):
        engine_translate_file(path, out, kind)
    assert not out.exists()


def test_text_that_only_looks_binary_later_still_streams_line_by_line():
    """The first chunk is what is judged: stdin keeps streaming, and text that starts as
    no binary file does (a unit separator, a word) is text."""
    chunks = list(read_chunks(io.BytesIO(b"GIF is a format.\n%PDF is not a PDF.\n")))
    assert chunks == [["GIF is a format.", "%PDF is not a PDF."]]
    with pytest.raises(mtkit.Error, match="gzip-compressed: decompress it first"):
        next(read_chunks(io.BytesIO(gzip.compress(b"A dog.\n"))))


@pytest.mark.parametrize("name", ["utf-16-le", "utf-16-be", "utf-32-le"])
def test_utf16_text_given_as_lines_is_one_line_saying_how_to_convert_it(model, name):
    """Lines are read as UTF-8; a UTF-16 text's NUL bytes were translated as garbage."""
    data = "\ufeff".encode(name) + "A dog runs.\n".encode(name)
    wide = name[:6].upper()
    result = cli("translate", "-m", model, input=data)
    assert_one_line(result, says=f"error: the input is {wide} text (it starts with its byte")
    assert f"(iconv -f {wide} -t UTF-8 FILE)" in result.stderr and result.stdout == ""
