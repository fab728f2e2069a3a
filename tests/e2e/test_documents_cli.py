"""`mtkit translate --format html|xml|srt|po`: a document in, the same document translated
out, with its tags, timings, plural forms and placeholders; mistakes are one line."""

from __future__ import annotations

import polib
import srt

from mtkit.documents.markup import tags
from mtkit.documents.placeholders import placeholders

from conftest import cli, one_line_error


def _model(trained):
    return str(trained / "run" / "checkpoints" / "best.pt")


def test_html_by_its_suffix_keeps_its_tags_and_lands_whole(trained, tmp_path):
    page = (
        "<html><body><h1>A dog.</h1>\n<p>A man is <b>riding</b> a <a href='/b'>bike</a>. "
        "Two dogs play.<br>A woman <i>sings</i>!</p><pre>ls -l</pre></body></html>\n"
    )
    (tmp_path / "page.html").write_text(page)
    result = cli(
        "translate",
        "-m",
        _model(trained),
        "-i",
        str(tmp_path / "page.html"),
        "-o",
        str(tmp_path / "out.html"),
    )
    assert result.exit_code == 0, result.output
    out = (tmp_path / "out.html").read_text()
    assert tags(out) == tags(page) and "<pre>ls -l</pre>" in out
    stdin = cli("translate", "-m", _model(trained), "--format", "html", input=page)
    assert stdin.exit_code == 0 and stdin.stdout == out


def test_srt_and_po_through_the_cli(trained, tmp_path):
    subtitles = (
        "1\n00:00:01,000 --> 00:00:02,000\nA man runs.\n\n"
        "2\n00:00:03,000 --> 00:00:04,500\nTwo dogs.\n"
    )
    (tmp_path / "a.srt").write_text(subtitles)
    result = cli("translate", "-m", _model(trained), "-i", str(tmp_path / "a.srt"))
    assert result.exit_code == 0, result.output
    cues = list(srt.parse(result.stdout))
    assert [(c.index, c.start, c.end) for c in cues] == [
        (c.index, c.start, c.end) for c in srt.parse(subtitles)
    ]
    catalog = (
        'msgid "A dog and %s."\nmsgstr ""\n\n'
        'msgid "One cat"\nmsgid_plural "{n} cats"\nmsgstr[0] ""\nmsgstr[1] ""\n'
    )
    (tmp_path / "de.po").write_text(catalog)
    result = cli("translate", "-m", _model(trained), "-i", str(tmp_path / "de.po"))
    assert result.exit_code == 0, result.output
    entries = list(polib.pofile(result.stdout))
    assert placeholders(entries[0].msgstr) == ["%s"]
    assert "{n}" in entries[1].msgstr_plural[1] and 0 in entries[1].msgstr_plural


def test_document_mistakes_are_one_line_and_write_nothing(trained, tmp_path):
    (tmp_path / "bad.xml").write_text("<doc><p>A dog.</doc>")
    out = tmp_path / "out.xml"
    one_line_error(
        cli("translate", "-m", _model(trained), "-i", str(tmp_path / "bad.xml"), "-o", str(out)),
        "the XML is not well-formed",
    )
    assert not out.exists()
    (tmp_path / "a.html").write_text("<p>A dog.</p>")
    one_line_error(
        cli("translate", "-m", _model(trained), "-i", str(tmp_path / "a.html"), "--nbest", "2"),
        "--nbest is for text; format html writes a document",
    )
    one_line_error(
        cli("translate", "-m", _model(trained), "--format", "pdf", input="x"),
        "--format must be text, jsonl, html, xml, srt, po, xliff, docx, pptx, xlsx, odt, odp "
        "or epub",
    )


def test_text_with_markup_characters_is_translated_as_text(trained):
    line = "A <b>dog</b> & a cat."
    text = cli("translate", "-m", _model(trained), "--format", "text", input=line + "\n")
    jsonl = cli(
        "translate",
        "-m",
        _model(trained),
        "--format",
        "jsonl",
        input='{"src": "A <b>dog</b> & a cat."}\n',
    )
    assert text.exit_code == 0 and jsonl.exit_code == 0
    import json

    assert json.loads(jsonl.stdout)["source"] == line
    assert json.loads(jsonl.stdout)["translation"] == text.stdout.rstrip("\n")


def test_a_latin1_catalogue_comes_back_in_latin1_with_its_messages_unchanged(trained, tmp_path):
    catalog = (
        b'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=ISO-8859-1\\n"\n\n'
        b'msgid "A caf\xe9 and a dog."\nmsgstr ""\n'
    )
    (tmp_path / "fr.po").write_bytes(catalog)
    out = tmp_path / "out.po"
    result = cli("translate", "-m", _model(trained), "-i", tmp_path / "fr.po", "-o", out)
    assert result.exit_code == 0, result.output
    assert b'msgid "A caf\xe9 and a dog."' in out.read_bytes()
    assert polib.pofile(out.read_bytes().decode("latin-1"))[0].msgstr


def test_an_ascii_page_declaring_utf16_is_read_as_utf8_with_its_tags(trained, tmp_path):
    """Once decoded as UTF-16: every tag lost ("Ein Geingergerger."), exit 0. A
    declaration read from ASCII bytes cannot be UTF-16's (the HTML standard's rule)."""
    page = b'<html><head><meta charset="utf-16"></head><body><p>A dog runs.</p></body></html>'
    (tmp_path / "page.html").write_bytes(page)
    out = tmp_path / "out.html"
    result = cli("translate", "-m", _model(trained), "-i", tmp_path / "page.html", "-o", out)
    assert result.exit_code == 0, result.output
    assert tags(out.read_text("utf-8")) == tags(page.decode())


def test_a_big_endian_document_comes_back_big_endian_after_its_mark(trained, tmp_path):
    """UTF-16BE and UTF-32BE came back little-endian."""
    document = '<?xml version="1.0" encoding="UTF-16"?><doc><p>A dog runs.</p></doc>'
    for name in ("utf-16-be", "utf-32-be", "utf-16-le"):
        path, out = tmp_path / f"{name}.xml", tmp_path / f"out-{name}.xml"
        path.write_bytes("\ufeff".encode(name) + document.encode(name))
        result = cli("translate", "-m", _model(trained), "-i", path, "-o", out)
        assert result.exit_code == 0, result.output
        data = out.read_bytes()
        assert data.startswith("\ufeff".encode(name))
        assert tags(data.decode(name).removeprefix("\ufeff"), "xml") == tags(document, "xml")


SEGMENTS = [
    "Select <parmname>Multiple Languages</parmname> and add the languages you want.",
    "Tap <uicontrol>OK</uicontrol>.",
    "",
    "Run <codeph>ls -l</codeph> &amp; <ph>wait</ph> for <zz>the dog</zz>.",
    "<p>A dog.</p><p>A cat.</p>",
]


def test_a_file_of_segments_is_translated_a_line_for_each(trained, tmp_path):
    """--segments: each line one xml fragment, one output line each, as the API
    translates each segment; DeepL's options and an ITS rules file from the command line."""
    import mtkit

    path = tmp_path / "segments.txt"
    path.write_text("".join(x + "\n" for x in SEGMENTS))
    rules = tmp_path / "rules.xml"
    rules.write_text(
        '<its:rules xmlns:its="http://www.w3.org/2005/11/its" version="2.0">'
        '<its:translateRule translate="no" selector="//ph"/></its:rules>'
    )
    flags = ["--ignore-tags", "zz", "--splitting-tags", "uicontrol", "--its-rules", str(rules)]
    out = tmp_path / "out.txt"
    model = _model(trained)
    result = cli("translate", "-m", model, "--format", "xml", "--segments", "-i", path, "-o", out)
    assert result.exit_code == 0, result.output
    lines = out.read_text().split("\n")
    assert lines[-1] == "" and len(lines) == len(SEGMENTS) + 1
    with mtkit.Translator.load(model, device="cpu") as t:
        assert lines[:-1] == [x.text for x in t.translate(SEGMENTS, format="xml")]
        assert [tags(x, "xml") for x in lines[:-1]] == [tags(x, "xml") for x in SEGMENTS]
        assert lines[2] == "" and "<codeph>ls -l</codeph>" in lines[3]
        result = cli(
            "translate",
            "-m",
            model,
            "--format",
            "xml",
            "--segments",
            *flags,
            input=path.read_text(),
        )
        assert result.exit_code == 0, result.output
        ruled = t.translate(
            SEGMENTS, format="xml", ignore_tags="zz", splitting_tags=["uicontrol"], its_rules=rules
        )
        assert result.stdout.split("\n")[:-1] == [x.text for x in ruled]
    assert "<zz>the dog</zz>" in result.stdout and "<ph>wait</ph>" in result.stdout


def test_segments_and_markup_options_mistakes_are_one_line(trained, tmp_path):
    model = _model(trained)
    bad = cli(
        "translate",
        "-m",
        model,
        "--format",
        "xml",
        "--segments",
        input="A dog.\nA <b>cat & dog</b>.\n",
    )
    one_line_error(
        bad,
        "line 2: the XML is not well-formed: not well-formed (invalid token): line 1, column 10",
    )
    for args, says in (
        (
            ["--format", "srt", "--segments"],
            "--segments reads each line as a segment of --format html or --format xml, not srt",
        ),
        (["--segments"], "not text"),
        (["--format", "xml", "--ignore-tags", "a,<b>"], "--ignore-tags: '<b>' is not a tag name"),
        (["--ignore-tags", "b"], "--ignore-tags is for html or xml documents, not text"),
        (["--format", "xml", "--its-rules", str(tmp_path / "none.xml")], "--its-rules"),
    ):
        one_line_error(cli("translate", "-m", model, *args, input="A dog.\n"), says)
