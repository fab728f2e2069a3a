# ruff: noqa: E501  (the XLIFF files below are written a unit to a line, as tools write them)
"""`mtkit translate --format xliff` and the API's `format="xliff"` with a trained model:
every untranslated unit of an XLIFF 1.2 or 2.0 file gets its target with its inline
codes, read back by translate-toolkit; the rest of the file is kept byte for byte;
mistakes are one line."""

from __future__ import annotations

import re

import pytest
from lxml import etree

import mtkit

from conftest import cli, one_line_error

xliff1 = pytest.importorskip("translate.storage.xliff")

FILE_1 = """<?xml version="1.0" encoding="ISO-8859-1"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
  <!-- café -->
  <file original="a.html" source-language="en" datatype="html">
    <body>
      <trans-unit id="1">
        <source>A man is <g id="1">riding</g> a bike<x id="2"/> on the <bpt id="3">&lt;b&gt;</bpt>street<ept id="3">&lt;/b&gt;</ept>.</source>
        <note>keep this</note>
      </trans-unit>
      <trans-unit id="2" translate="no"><source>Two dogs play.</source></trans-unit>
      <trans-unit id="3"><source>A woman sings.</source><target>Eine Frau singt.</target></trans-unit>
      <trans-unit id="4"><source><![CDATA[Two <dogs>]]> run in the grass.</source></trans-unit>
    </body>
  </file>
</xliff>
"""

FILE_2 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.0" srcLang="en">
  <file id="f">
    <unit id="u1">
      <segment>
        <source>A dog <pc id="1">runs</pc> in the <sc id="2"/>snow<ec startRef="2"/><ph id="3"/>.</source>
      </segment>
      <segment state="final"><source>A girl.</source><target>Ein Mädchen.</target></segment>
    </unit>
  </file>
</xliff>
"""


def _model(trained):
    return str(trained / "run" / "checkpoints" / "best.pt")


def _codes(element) -> list:
    return sorted(
        (etree.QName(e).localname, e.get("id") or e.get("startRef"))
        for e in element.iterdescendants()
        if isinstance(e.tag, str)
    )


def test_an_xliff_1_file_by_its_suffix_gets_its_targets_with_their_codes(trained, tmp_path):
    (tmp_path / "a.xlf").write_bytes(FILE_1.encode("latin-1"))
    out = tmp_path / "out.xlf"
    result = cli("translate", "-m", _model(trained), "-i", tmp_path / "a.xlf", "-o", out)
    assert result.exit_code == 0, result.output
    written = out.read_bytes().decode("latin-1")  # (the file's own encoding)
    store = xliff1.xlifffile.parsestring(out.read_bytes())
    units = {u.xmlelement.get("id"): u for u in store.units}
    assert units["1"].target and units["4"].target
    assert units["2"].target is None and units["3"].target == "Eine Frau singt."
    ns = "{urn:oasis:names:tc:xliff:document:1.2}"
    for uid in ("1", "4"):
        unit = units[uid].xmlelement
        assert _codes(unit.find(ns + "source")) == _codes(unit.find(ns + "target"))
        assert unit.find(ns + "target").get("state-qualifier") == "leveraged-mt"
    assert "<![CDATA[" in etree.tostring(units["4"].xmlelement, encoding="unicode")
    added = re.compile(r"(?:\n\s*)?<target state=\"needs-review-translation\".*?</target>", re.S)
    assert added.sub("", written).replace(' target-language="de"', "") == FILE_1
    # stdin to stdout: the same bytes
    stdin = cli("translate", "-m", _model(trained), "--format", "xliff", input=FILE_1)
    assert stdin.exit_code == 0 and stdin.stdout == out.read_bytes().decode("latin-1")


def test_an_xliff_2_file_through_the_api_gets_its_targets(trained):
    xliff2 = pytest.importorskip("translate.storage.xliff2")
    with mtkit.Translator.load(_model(trained), device="cpu") as translator:
        (result,) = translator.translate([FILE_2], format="xliff")
    store = xliff2.Xliff2File.parsestring(result.text.encode("utf-8"))
    first, second = store.units
    assert first.target and second.target == "Ein Mädchen."
    ns = "{urn:oasis:names:tc:xliff:document:2.0}"
    segment = first.xmlelement
    assert _codes(segment.find(ns + "source")) == _codes(segment.find(ns + "target"))
    assert segment.get("state") == "translated" and 'srcLang="en" trgLang="de"' in result.text
    kept = re.sub(r"\n\s*<target>.*?</target>", "", result.text, flags=re.S)
    kept = kept.replace(' trgLang="de"', "").replace(' state="translated" subState="mtkit:mt"', "")
    assert kept == FILE_2


def test_xliff_mistakes_are_one_line_and_write_nothing(trained, tmp_path):
    out = tmp_path / "out.xlf"
    (tmp_path / "bad.xlf").write_text(FILE_1.replace("</g>", ""))
    one_line_error(
        cli("translate", "-m", _model(trained), "-i", tmp_path / "bad.xlf", "-o", out),
        "the XLIFF is not well-formed",
    )
    (tmp_path / "fr.xliff").write_text(FILE_2.replace('srcLang="en"', 'srcLang="en" trgLang="fr"'))
    one_line_error(
        cli("translate", "-m", _model(trained), "-i", tmp_path / "fr.xliff", "-o", out),
        "the XLIFF's trgLang is fr, but this translates into de",
    )
    assert not out.exists()


def test_retranslate_from_the_cli_and_the_api_replaces_a_translators_target(trained, tmp_path):
    (tmp_path / "a.xlf").write_bytes(FILE_1.encode("latin-1"))
    out = tmp_path / "out.xlf"
    result = cli(
        "translate", "-m", _model(trained), "-i", tmp_path / "a.xlf", "-o", out, "--retranslate"
    )
    assert result.exit_code == 0, result.output
    units = {
        u.xmlelement.get("id"): u for u in xliff1.xlifffile.parsestring(out.read_bytes()).units
    }
    assert units["3"].target and units["3"].target != "Eine Frau singt."
    assert units["2"].target is None  # translate="no" stays as it was
    with mtkit.Translator.load(_model(trained), device="cpu") as translator:
        (again,) = translator.translate([FILE_2], format="xliff", retranslate=True)
        assert "Ein Mädchen." not in again.text
        with pytest.raises(mtkit.Error, match="retranslate is for bilingual files"):
            translator.translate(["<p>A dog.</p>"], format="html", retranslate=True)
    one_line_error(
        cli(
            "translate",
            "-m",
            _model(trained),
            "--format",
            "html",
            "--retranslate",
            input="<p>A dog.</p>",
        ),
        "--retranslate is for bilingual files (xliff), not html",
    )
