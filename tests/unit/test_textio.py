"""Text in, text out (`mtkit.core.textio`): one output line per input line, in order, as lines
arrive; invalid UTF-8; output formats."""

from __future__ import annotations

import io
import json
import os
import threading

import pytest

from mtkit.core.errors import OptionError
from mtkit.core.search_options import SearchOptions
from mtkit.core.textio import (
    OutputFormat,
    Request,
    format_lines,
    parse_line,
    read_chunks,
    read_document,
)
from mtkit.core.translation import Translation
from mtkit.documents.formats import FORMATS
from mtkit.engines.session import translate_stream


def test_one_output_line_per_input_line_in_order(tiny_engine):
    lines = ["A dog.", "", "A man in a blue shirt is standing on a ladder.", "   ", "Hi."]
    opts = SearchOptions(beam=3, max_len_a=1.0, max_len_b=3)
    sink = io.StringIO()
    assert translate_stream(tiny_engine, io.BytesIO("\n".join(lines).encode()), sink, opts) == 5
    out = sink.getvalue().split("\n")
    assert len(out) == 6 and out[-1] == "" and out[1] == out[3] == ""
    # The same lines one at a time give the same outputs: order is restored exactly.
    one_by_one = [tiny_engine.translate([x], opts)[0][0].tokens for x in lines]
    together = [h[0].tokens for h in tiny_engine.translate(lines, opts)]
    assert one_by_one == together


def test_invalid_utf8_is_replaced_not_fatal():
    chunks = list(read_chunks(io.BytesIO(b"ok\n\xff\xfe bad\nlast")))
    assert chunks == [["ok", "\ufffd\ufffd bad"], ["last"]]


def test_lines_are_translated_as_soon_as_they_arrive():
    read_fd, write_fd = os.pipe()
    reader = os.fdopen(read_fd, "rb")
    chunks = read_chunks(reader)
    os.write(write_fd, b"first line\n")
    got: list = []
    thread = threading.Thread(target=lambda: got.append(next(chunks)))
    thread.start()
    thread.join(timeout=5)
    assert got == [["first line"]]  # no waiting for more input or end of file
    os.write(write_fd, b"second\nthird\n")
    os.close(write_fd)
    assert list(chunks) == [["second", "third"]]
    reader.close()


def test_output_formats(tiny_engine):
    hyps = tiny_engine.translate(["A dog."], SearchOptions(beam=3, nbest=2, max_len_b=3))[0]
    hyps = [Translation.of("A dog.", h, tiny_engine.tgt_vocab) for h in hyps]
    nbest = format_lines(7, Request("A dog."), hyps, SearchOptions(beam=3, nbest=2))
    assert len(nbest) == 2 and all(line.startswith("7 ||| ") for line in nbest)
    scored = format_lines(
        0,
        Request("A dog."),
        hyps[:1],
        SearchOptions(),
        OutputFormat(scores=True),
    )
    assert scored[0].count("\t") == 1 and float(scored[0].split("\t")[1]) <= 0
    record = json.loads(
        format_lines(
            0,
            Request("A dog."),
            hyps,
            SearchOptions(beam=3, nbest=2),
            OutputFormat("jsonl"),
        )[0]
    )
    assert record["source"] == "A dog." and len(record["nbest"]) == 2


@pytest.mark.parametrize(
    "line, says",
    [
        ('{"src": "A dog.", "prefx": "Ein"}', "prefx: no such field; did you mean prefix?"),
        ('{"src": "A dog.", "split": false}', "split: no such field; the fields are src,"),
        ('{"source": "A dog."}', "source: no such field; did you mean src?"),
        ('{"src": "A dog.", "target_lang": "de"}', "did you mean tgt_lang?"),
        ('{"src": "A dog.", "constraint": ["Hund"]}', "did you mean constraints?"),
        ('{"src": "A dog.", "\\ud800": 1}', "a field's name holds a lone surrogate"),
    ],
)
def test_a_jsonl_field_a_record_does_not_have_is_its_error_naming_the_nearest(line, says):
    """As /v1 refuses a field its body does not have: a misspelt "prefx" was read as no
    prefix, silently. The record's error (the stream goes on), its id echoed."""
    request = parse_line(line[:-1] + ', "id": 7}', jsonl=True)
    assert says in request.error and request.src == "" and request.id == 7
    assert "\n" not in request.error and "src, prefix, constraints, tgt_lang, id" in request.error
    good = parse_line('{"src": "A dog.", "prefix": "Ein", "tgt_lang": "de", "id": 1}', True)
    assert (good.error, good.prefix, good.tgt_lang) == ("", "Ein", "de")


def test_a_document_is_read_and_written_in_the_encoding_it_declares():
    """Once a declared Latin-1 was read as UTF-8: its "é" replaced, the translation
    written as UTF-8 under a declaration of ISO-8859-1."""
    po = b'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=ISO-8859-1\\n"\n'
    po += b'\nmsgid "caf\xe9"\n'
    assert FORMATS["po"].encoding(po) == "iso8859-1"
    assert "café" in read_document(po, "iso8859-1")
    xml = b'<?xml version="1.0" encoding="latin-1"?>\n<p>gr\xfcn</p>'
    assert FORMATS["xml"].encoding(xml) == "iso8859-1"
    html = b'<html><head><meta charset="windows-1252"></head><body>\x80</body></html>'
    assert FORMATS["html"].encoding(html) == "cp1252"
    assert read_document(html, "cp1252").endswith("<body>€</body></html>")
    # undeclared, a template's placeholder, a byte-order mark (given back on writing)
    assert FORMATS["html"].encoding(b"<p>x</p>") == "utf-8"
    assert FORMATS["po"].encoding(b'"Content-Type: text/plain; charset=CHARSET\\n"') == "utf-8"
    assert FORMATS["srt"].encoding(b"\xef\xbb\xbf1\n") == "utf-8-sig"
    assert FORMATS["srt"].written("1\n", "utf-8-sig") == b"\xef\xbb\xbf1\n"
    # UTF-16 and UTF-32, known by their marks (the declaration inside is not ASCII),
    # written back in their byte order after their mark (big-endian came back little)
    wide = '<?xml version="1.0" encoding="UTF-16"?><p>ü</p>'
    for name in ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"):
        data = "\ufeff".encode(name) + wide.encode(name)
        assert FORMATS["xml"].encoding(data) == name
        assert read_document(data, name) == wide
        assert FORMATS["xml"].written(wide, name) == data
    with pytest.raises(OptionError, match="declares an unknown encoding: foo"):
        FORMATS["xml"].encoding(b'<?xml version="1.0" encoding="foo"?><a/>')

    # declared in ASCII bytes, UTF-16 or UTF-32 is UTF-8 (the HTML standard's rule):
    # read as UTF-16, an ASCII page lost every tag
    for name in ("utf-16", "UTF-16BE", "utf-16le", "utf-32"):
        page = f'<html><head><meta charset="{name}"></head><p>A dog.</p></html>'.encode()
        assert FORMATS["html"].encoding(page) == "utf-8"
        declared = f'<?xml version="1.0" encoding="{name}"?><p>A dog.</p>'.encode()
        assert FORMATS["xml"].encoding(declared) == "utf-8"


@pytest.mark.parametrize("name", ["hex", "base64", "rot13", "zlib", "uu", "bz2", "quopri"])
def test_a_declared_codec_that_is_no_text_encoding_is_one_line(name):
    """Once a LookupError from decoding: these are codecs, but of bytes to bytes."""
    for data, format in (
        (f'<meta charset="{name}"><p>x</p>'.encode(), "html"),
        (f'<?xml version="1.0" encoding="{name}"?><a/>'.encode(), "xml"),
        (f'"Content-Type: text/plain; charset={name}\\n"'.encode(), "po"),
    ):
        with pytest.raises(OptionError, match=f"not a text encoding: {name}$"):
            FORMATS[format].encoding(data)


def test_a_character_the_encoding_cannot_hold_is_a_reference_in_markup_else_one_line():
    assert FORMATS["xml"].written("<p>grün</p>", "ascii") == b"<p>gr&#252;n</p>"
    assert FORMATS["po"].written("grün", "iso8859-1") == b"gr\xfcn"
    with pytest.raises(OptionError, match="holds 'ü', which the document's encoding"):
        FORMATS["po"].written('msgstr "grün"', "ascii")
