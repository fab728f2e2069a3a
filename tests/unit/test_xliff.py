# ruff: noqa: E501  (the XLIFF files below are written a unit to a line, as tools write them)
"""XLIFF 1.2 and 2.x (`mtkit.documents.xliff`): each untranslated unit gets its target
with the source's inline codes (same elements, same ids), marked as a machine
translation, and everything else in the file is kept byte for byte. Files are made by
translate-toolkit or written here with every kind of inline code; every output is read
back with translate-toolkit, and its codes compared with lxml."""

from __future__ import annotations

import random
import re

import pytest
from lxml import etree

from mtkit.core.errors import OptionError, UserError
from mtkit.documents.formats import FORMATS, output_format, translate_document
from mtkit.documents.xliff import XliffError

from fake_translations import reverse_upper as reverse
from fake_translations import scrambled, upper

xliff1 = pytest.importorskip("translate.storage.xliff")

X1 = "urn:oasis:names:tc:xliff:document:1.2"
X2 = "urn:oasis:names:tc:xliff:document:2.0"


# What a translation adds to a file: the targets (each on its own line, or right after
# its source), their marks, the target language
ADDED = re.compile(
    r"(?:\r?\n[ \t]*)?<(?:\w+:)?target state=\"needs-review-translation\" "
    r"state-qualifier=\"leveraged-mt\">.*?</(?:\w+:)?target>"
    r"| target-language=\"de\"| trgLang=\"de\"| state=\"translated\" subState=\"mtkit:mt\"",
    re.S,
)
ADDED_2 = re.compile(r"(?:\r?\n[ \t]*)?<target>.*?</target>", re.S)  # (a 2.x target)


def without_targets(output: str, version: int) -> str:
    """`output` without what translating added to it (for a file that had no target)."""
    out = ADDED.sub("", output)
    return ADDED_2.sub("", out) if version == 2 else out


CODES_1 = {"g", "x", "bx", "ex", "bpt", "ept", "ph", "it", "mrk"}
CODES_2 = {"pc", "sc", "ec", "ph", "mrk", "sm", "em", "cp"}


def codes(element) -> list[tuple[str, str | None, str | None]]:
    """The inline codes inside `element` (lxml), in document order: (name, id, and the
    native code a 1.2 bpt/ept/ph/it holds)."""
    out = []
    for e in element.iterdescendants():
        if not isinstance(e.tag, str):
            continue
        name = etree.QName(e).localname
        native = "".join(e.itertext()) if name in ("bpt", "ept", "ph", "it") else None
        out.append((name, e.get("id") or e.get("mid") or e.get("startRef") or e.get("rid"), native))
    return out


def translatable(element) -> bool:
    """Whether `element` (lxml) is to be translated: its own translate attribute, or its
    nearest ancestor's."""
    for e in (element, *element.iterancestors()):
        if e.get("translate") is not None:
            return e.get("translate") != "no"
    return True


def read_back_1(output: str) -> list:
    """Every unit of a 1.x output as translate-toolkit reads it; each translatable one
    has a target with its source's codes, the same ones (as a set: paired ones hold the
    same words in any order)."""
    store = xliff1.xlifffile.parsestring(output.encode("utf-8"))
    for unit in store.units:
        element = unit.xmlelement
        if not translatable(element):
            continue
        assert unit.target or not unit.source, etree.tostring(element)
        ns = etree.QName(element).namespace
        seg = element.find(f"{{{ns}}}seg-source")
        source = seg if seg is not None else element.find(f"{{{ns}}}source")
        target = element.find(f"{{{ns}}}target")
        assert sorted(codes(source), key=str) == sorted(codes(target), key=str)
        assert in_order(target, 1)
    return store.units


def read_back_2(output: str) -> list:
    """Every segment of a 2.x output as translate-toolkit reads it: each has a target
    with its source's codes."""
    from translate.storage import xliff2

    store = xliff2.Xliff2File.parsestring(output.encode("utf-8"))
    for unit in store.units:
        segment = unit.xmlelement
        if not translatable(segment):
            continue
        assert unit.target or not unit.source, etree.tostring(segment)
        source, target = segment.find(f"{{{X2}}}source"), segment.find(f"{{{X2}}}target")
        assert sorted(codes(source), key=str) == sorted(codes(target), key=str)
        assert in_order(target, 2)
    return store.units


PAIRS = {1: {"ept": "bpt", "ex": "bx"}, 2: {"ec": "sc", "em": "sm"}}  # closing: opening


def in_order(target, version: int) -> bool:
    """Whether each closing code in `target` (lxml) comes after the opening one it
    closes, where it has one (1.2: the same rid, else id; 2.x: startRef naming its id)."""
    seen, opening = set(), set()
    for e in target.iterdescendants():
        name = etree.QName(e).localname if isinstance(e.tag, str) else ""
        if name in PAIRS[version].values():
            opening.add((name, e.get("rid") or e.get("id")))
    for e in target.iterdescendants():
        name = etree.QName(e).localname if isinstance(e.tag, str) else ""
        key = e.get("rid") or e.get("id" if version == 1 else "startRef")
        if name in PAIRS[version].values():
            seen.add((name, e.get("rid") or e.get("id")))
        elif name in PAIRS[version] and (PAIRS[version][name], key) in opening - seen:
            return False
    return True


# ---- files made by translate-toolkit -------------------------------------------------------


def test_a_translate_toolkit_xliff_1_file_gets_every_target_and_keeps_the_rest():
    store = xliff1.xlifffile(sourcelanguage="en")
    store.addsourceunit("Hello world").addnote("for translators", origin="developer")
    store.addsourceunit("Two & more <things>")
    done = store.addsourceunit("Already done")
    done.target = "Schon fertig"
    document = bytes(store).decode("utf-8")
    output = translate_document(document, "xliff", upper, "de").text
    units = read_back_1(output)
    assert [u.target for u in units] == ["HELLO WORLD", "TWO & MORE <THINGS>", "Schon fertig"]
    assert [u.getnotes() for u in units][0] == "for translators"
    assert without_targets(output, 1) == document
    assert 'source-language="en" target-language="de"' in output
    assert all(u.isfuzzy() or u.target == "Schon fertig" for u in units)  # (needs review)


def test_translate_toolkits_inline_codes_come_back_as_it_reads_them():
    """A file whose sources translate-toolkit wrote from its placeables (g, x, bx, ex,
    bpt, ept, ph, it): its reading of each target holds the same placeables, same ids."""
    from translate.storage.placeables import StringElem
    from translate.storage.placeables.xliff import Bpt, Bx, Ept, Ex, G, It, Ph, X

    store = xliff1.xlifffile(sourcelanguage="en")
    sources = [
        ["Click ", G(["the button"], id="1"), " now", X(id="2"), " and "]
        + [Bpt(["<b>"], id="3"), "see", Ept(["</b>"], id="3"), " more", Ph(["{0}"], id="4"), "."],
        [Bx(id="5"), "Opened", Ex(id="6"), " here ", It(["<i>"], id="7", pos="open"), "ok"],
    ]
    for parts in sources:
        store.addsourceunit("").rich_source = [StringElem(parts)]
    document = bytes(store).decode("utf-8")
    for translate in (upper, reverse):
        output = translate_document(document, "xliff", translate, "de").text
        assert without_targets(output, 1) == document
        for unit in read_back_1(output):
            ids = [
                sorted((type(e).__name__, e.id) for e in rich[0].depth_first() if e.id)
                for rich in (unit.rich_source, unit.rich_target)
            ]
            assert ids[0] == ids[1] and len(ids[0]) in (5, 3)


def test_a_translate_toolkit_xliff_2_file_gets_every_target_and_keeps_the_rest():
    xliff2 = pytest.importorskip("translate.storage.xliff2")
    store = xliff2.Xliff2File(sourcelanguage="en")
    store.addsourceunit("Hello world").addnote("a note")
    store.addsourceunit("Second & <third>")
    document = bytes(store).decode("utf-8")
    output = translate_document(document, "xliff", upper, "de").text
    units = read_back_2(output)
    assert [u.target for u in units] == ["HELLO WORLD", "SECOND & <THIRD>"]
    assert without_targets(output, 2) == document
    assert 'srcLang="en" trgLang="de"' in output
    assert (
        output.count('<segment xml:space="preserve" state="translated" subState="mtkit:mt">') == 2
    )


# ---- hand-written files with every kind of code --------------------------------------------

FILE_1 = """<?xml version="1.0" encoding="UTF-8"?>
<!-- made by hand -->
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2"
       xmlns:acme="http://acme.example/x">
  <file original="a.html" source-language="en-US" datatype="html">
    <header><acme:tool  name='x' /></header>
    <body>
      <trans-unit id="1" resname='a'>
        <source>Click <g id="1" ctype="bold">the big button</g> to<x id="2" ctype="lb"/> go &amp; <bpt id="3">&lt;b class="q"&gt;</bpt>see<ept id="3">&lt;/b&gt;</ept> it.</source>
        <note from="dev">keep this note</note>
      </trans-unit>
      <trans-unit id="2" translate="no">
        <source>Keep me as I am</source>
      </trans-unit>
      <group id="g" translate="no">
        <trans-unit id="2b"><source>Kept by my group</source></trans-unit>
      </group>
      <trans-unit id="3"><source>Done</source><target state="final">Fertig</target></trans-unit>
      <trans-unit id="4"><source><![CDATA[A <raw> text]]> and a second part</source><target state="new"/></trans-unit>
      <trans-unit id="5">
        <source>One sentence. Two <ph id="1">{0}</ph> words.</source>
        <seg-source><mrk mtype="seg" mid="1">One sentence.</mrk> <mrk mtype="seg" mid="2">Two <ph id="1">{0}</ph> words.</mrk></seg-source>
        <alt-trans match-quality="80"><source>One sentence.</source><target>Ein Satz.</target></alt-trans>
      </trans-unit>
      <trans-unit id="6">
        <source>Open <bx id="7"/>the file<ex id="8"/> with <it id="9" pos="open">&lt;i&gt;</it>care and <mrk mtype="protected">ACME Tool</mrk> <mrk mtype="term">today</mrk><ph id="10">&lt;img <sub>alt text</sub>&gt;</ph></source>
      </trans-unit>
      <bin-unit id="b" mime-type="image/png"><bin-source><external-file href="a.png"/></bin-source></bin-unit>
    </body>
  </file>
</xliff>
"""

FILE_2 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.1" srcLang="en"
  xmlns:my="http://example.com/my">
 <!-- a comment -->
 <file id="f1" my:flag='yes'>
  <notes><note id="n1">file note</note></notes>
  <unit id="u1">
   <originalData>
    <data id="d1">&lt;b&gt;</data>
    <data id="d2">&lt;/b&gt;</data>
   </originalData>
   <segment id="s1">
    <source>Press <pc id="1" dataRefStart="d1" dataRefEnd="d2">the red key</pc> now<ph id="2"/> so <sc id="3"/>then<ec startRef="3"/> wait <mrk id="m1" translate="no">ACME</mrk> and <sm id="m2" type="comment" value="x"/>look<em startRef="m2"/> <cp hex="0019"/>here.</source>
   </segment>
   <ignorable>
    <source> </source>
   </ignorable>
   <segment id="s2" state="initial"><source>A second segment</source><target/></segment>
   <segment id="s3" state="final"><source>Translated</source><target>Schon</target></segment>
  </unit>
  <unit id="u2" translate="no"><segment><source>Not this</source></segment></unit>
  <unit id="u3"><segment><source><![CDATA[x < y]]> is true</source></segment><my:ext a="1"/></unit>
 </file>
</xliff>
"""


def test_every_kind_of_xliff_1_code_is_carried_through_and_the_rest_is_kept():
    output = translate_document(FILE_1, "xliff", upper, "de").text
    units = read_back_1(output)
    by_id = {u.xmlelement.get("id"): u.xmlelement for u in units}
    assert set(by_id) == {"1", "2", "2b", "3", "4", "5", "6"}
    target = etree.tostring(by_id["1"].find(f"{{{X1}}}target"), encoding="unicode")
    assert (
        '<g id="1" ctype="bold">THE BIG BUTTON</g> TO<x id="2" ctype="lb"/> GO &amp; '
        '<bpt id="3">&lt;b class="q"&gt;</bpt>SEE<ept id="3">&lt;/b&gt;</ept> IT.' in target
    )
    # translate="no" (its own, its group's) and a translator's target: as they were
    for kept in ("2", "2b", "3"):
        assert by_id[kept].find(f"{{{X1}}}target") is None or kept == "3"
    assert '<target state="final">Fertig</target>' in output
    # the empty target is filled (its other attributes kept), CDATA translated as CDATA
    assert (
        '<target state="needs-review-translation" state-qualifier="leveraged-mt">'
        "<![CDATA[A <RAW> TEXT]]> AND A SECOND PART</target>" in output
    )
    # a seg-source: each segment translated, in its mrk
    assert (
        '<mrk mtype="seg" mid="1">ONE SENTENCE.</mrk> <mrk mtype="seg" mid="2">TWO '
        '<ph id="1">{0}</ph> WORDS.</mrk></target>' in output
    )
    # native code (and a sub inside it) and protected text: never translated
    assert (
        'OPEN <bx id="7"/>THE FILE<ex id="8"/> WITH <it id="9" pos="open">&lt;i&gt;</it>CARE '
        'AND <mrk mtype="protected">ACME Tool</mrk> <mrk mtype="term">TODAY</mrk>'
        '<ph id="10">&lt;img <sub>alt text</sub>&gt;</ph></target>' in output
    )
    assert 'source-language="en-US" target-language="de" datatype="html"' in output
    # everything else: byte for byte
    filled = output.replace(
        '<target state="needs-review-translation" state-qualifier="leveraged-mt">'
        "<![CDATA[A <RAW> TEXT]]> AND A SECOND PART</target>",
        '<target state="new"/>',
    )
    assert without_targets(filled, 1) == FILE_1


def test_every_kind_of_xliff_2_code_is_carried_through_and_the_rest_is_kept():
    pytest.importorskip("translate.storage.xliff2")
    output = translate_document(FILE_2, "xliff", upper, "de").text
    read_back_2(output)
    assert (
        '<target>PRESS <pc id="1" dataRefStart="d1" dataRefEnd="d2">THE RED KEY</pc> '
        'NOW<ph id="2"/> SO <sc id="3"/>THEN<ec startRef="3"/> WAIT <mrk id="m1" '
        'translate="no">ACME</mrk> AND <sm id="m2" type="comment" value="x"/>LOOK'
        '<em startRef="m2"/> <cp hex="0019"/>HERE.</target>' in output
    )
    assert (
        '<segment id="s2" state="translated" subState="mtkit:mt"><source>A second segment'
        "</source><target>A SECOND SEGMENT</target></segment>" in output
    )
    assert '<segment id="s3" state="final"><source>Translated</source><target>Schon</target>' in (
        output
    )
    assert "<source>Not this</source></segment>" in output and "NOT THIS" not in output
    assert "<target><![CDATA[X < Y]]> IS TRUE</target>" in output
    assert '<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.1" srcLang="en" ' in (
        output
    )
    restored = (
        without_targets(output, 2)
        .replace('<segment id="s2">', '<segment id="s2" state="initial">')
        .replace("<source>A second segment</source>", "<source>A second segment</source><target/>")
        .replace("<source>Translated</source>", "<source>Translated</source><target>Schon</target>")
    )
    assert restored == FILE_2


@pytest.mark.parametrize("seed", range(12))
def test_any_alignment_gives_every_unit_its_codes_and_keeps_the_rest(seed):
    for translate in (reverse, scrambled(seed, fewest=1)):
        output = translate_document(FILE_1, "xliff", translate, "de").text
        read_back_1(output)
        output = translate_document(FILE_2, "xliff", translate, "de").text
        read_back_2(output)


def test_a_prefixed_and_crlf_file_gets_its_targets_on_their_own_lines_with_its_prefix():
    document = (
        '<x:xliff xmlns:x="urn:oasis:names:tc:xliff:document:1.2" version="1.2">\r\n'
        '<x:file source-language="en" target-language="de-AT" original="o" datatype="x">'
        '<x:body>\r\n\t<x:trans-unit id="1">\r\n\t\t<x:source>Hi there</x:source>\r\n'
        "\t</x:trans-unit>\r\n</x:body></x:file></x:xliff>"
    )
    output = translate_document(document, "xliff", upper, "de").text
    assert (
        '<x:source>Hi there</x:source>\r\n\t\t<x:target state="needs-review-translation" '
        'state-qualifier="leveraged-mt">HI THERE</x:target>\r\n\t</x:trans-unit>' in output
    )
    assert 'target-language="de-AT"' in output  # (the file's own, of the same language)
    read_back_1(output)


def test_a_target_of_empty_segments_is_filled_and_one_of_codes_alone_is_kept():
    """A target prepared with empty segments (Trados' SDLXLIFF) has no text: it is filled
    segment by segment; a target of codes alone for a source of codes alone is kept."""
    document = (
        f'<xliff version="1.2" xmlns="{X1}" xmlns:sdl="http://sdl.com/FileTypes/SdlXliff/1.0">'
        '<file original="o" source-language="en" target-language="de-DE" datatype="x"><body>\n'
        '  <trans-unit id="a"><source>Hello there. Bye.</source><seg-source><mrk mtype="seg" '
        'mid="1">Hello there.</mrk> <mrk mtype="seg" mid="2">Bye.</mrk></seg-source>'
        '<target><mrk mtype="seg" mid="1"/> <mrk mtype="seg" mid="2"></mrk></target>'
        '<sdl:seg-defs><sdl:seg id="1"/></sdl:seg-defs></trans-unit>\n'
        '  <trans-unit id="b"><source><x id="1"/></source><target><x id="1"/></target>'
        "</trans-unit>\n</body></file></xliff>"
    )
    output = translate_document(document, "xliff", upper, "de").text
    assert output == document.replace(
        '<target><mrk mtype="seg" mid="1"/> <mrk mtype="seg" mid="2"></mrk></target>',
        '<target state="needs-review-translation" state-qualifier="leveraged-mt"><mrk '
        'mtype="seg" mid="1">HELLO THERE.</mrk> <mrk mtype="seg" mid="2">BYE.</mrk></target>',
    )
    read_back_1(output)


def test_a_file_with_nothing_to_translate_is_kept_but_gets_its_target_language():
    document = (
        '<xliff version="2.0" xmlns="urn:oasis:names:tc:xliff:document:2.0" srcLang="en">'
        '<file id="f"><unit id="u"><segment><source>Hi</source><target>Hallo</target>'
        "</segment></unit></file></xliff>"
    )
    assert translate_document(document, "xliff", upper, "de").text == document.replace(
        'srcLang="en"', 'srcLang="en" trgLang="de"'
    )
    assert translate_document(document, "xliff", upper, None).text == document


# ---- refused, in one line --------------------------------------------------------------------


@pytest.mark.parametrize(
    "document, says",
    [
        (FILE_1.replace("</g>", "</x>", 1), "not well-formed: Opening and ending tag mismatch"),
        ("<xliff version='1.2' xmlns='urn:oasis:names:tc:xliff:document:1.2'>\n<file>", "line 2"),
        ("<html><body>Hi</body></html>", "not an XLIFF file: its root element is <html>"),
        (
            '<!DOCTYPE xliff [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
            "<xliff version='1.2' xmlns='urn:oasis:names:tc:xliff:document:1.2'><file "
            "source-language='en' original='o' datatype='x'><body><trans-unit id='1'>"
            "<source>&b;</source></trans-unit></body></file></xliff>",
            "DOCTYPE declares entities",
        ),
        (FILE_2.replace('srcLang="en"', 'srcLang="en" trgLang="fr-FR"'), "trgLang is fr-FR"),
        ("<xliff " + "x" * 10 + "/>", "not well-formed"),
        (
            f'<xliff version="1.2" xmlns="{X1}"><file><body><trans-unit id="1"><source>'
            + "<g>" * 200
            + "deep"
            + "</g>" * 200
            + "</source></trans-unit></body></file></xliff>",
            "nests elements more than 128 deep",
        ),
        (
            '<xliff version="3.0" xmlns="urn:oasis:names:tc:xliff:document:3.0"/>',
            "XLIFF version '3.0'",
        ),
    ],
)
def test_bad_or_hostile_files_are_refused_in_one_line(document, says):
    with pytest.raises(UserError) as e:
        translate_document(document, "xliff", upper, "de")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_file_over_the_size_bound_is_refused_before_it_is_parsed(monkeypatch):
    from mtkit.documents import xliff

    monkeypatch.setattr(xliff, "MAX_CHARS", len(FILE_1) - 1)
    with pytest.raises(XliffError, match=f"holds {len(FILE_1)} characters; mtkit reads files"):
        translate_document(FILE_1, "xliff", upper, "de")
    monkeypatch.setattr(xliff, "MAX_CHARS", len(FILE_1))
    assert "THE BIG BUTTON" in translate_document(FILE_1, "xliff", upper, "de").text


def test_an_external_dtd_is_never_read_and_its_entities_are_kept_as_written():
    document = (
        '<!DOCTYPE xliff SYSTEM "http://127.0.0.1:9/x.dtd"><xliff version="1.2" '
        'xmlns="urn:oasis:names:tc:xliff:document:1.2"><file source-language="en" '
        'original="o" datatype="x"><body><trans-unit id="1"><source>Go &ext; now</source>'
        "</trans-unit></body></file></xliff>"
    )
    output = translate_document(document, "xliff", upper, "de").text
    assert "<source>Go &ext; now</source><target " in output
    assert 'leveraged-mt">GO &ext; NOW</target>' in output


def test_the_format_is_in_the_one_table():
    assert FORMATS["xliff"].suffixes == (".xlf", ".xliff")
    from pathlib import Path

    assert output_format(None, Path("a.XLF")).kind == "xliff"
    assert output_format(None, Path("a.xliff")).kind == "xliff"
    assert issubclass(XliffError, UserError)


# ---- a larger generated file ---------------------------------------------------------------


def generated(n: int, version: int, seed: int = 0) -> str:
    """An XLIFF file of `n` units, each with 0-4 inline codes of every kind around and
    between random words, notes and comments here and there."""
    rng = random.Random(seed)
    words = "the red dog runs over a green field and jumps to see its friend".split()
    kinds = (
        ["g", "x", "bx", "ex", "bpt", "ph", "it", "mrk"]
        if version == 1
        else ["pc", "ph", "sc", "mrk", "sm", "cp"]
    )
    units = []
    for u in range(n):
        parts, k = [], 0
        for _ in range(rng.randint(2, 7)):
            chunk = " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))
            kind = rng.choice(kinds) if rng.random() < 0.5 else None
            k += 1
            parts.append(_code(kind, k, chunk, version))
        source = " ".join(parts) + "."
        note = f"<note>note {u}</note>" if u % 7 == 0 else ""
        comment = f"<!-- unit {u} -->\n" if u % 11 == 0 else ""
        if version == 1:
            units.append(
                f'{comment}      <trans-unit id="{u}">\n        <source>{source}</source>\n'
                f"        {note}\n      </trans-unit>\n"
            )
        else:
            units.append(
                f'{comment}    <unit id="u{u}">\n      <segment>\n        <source>{source}'
                f"</source>\n      </segment>\n    </unit>\n"
            )
    if version == 1:
        return (
            f'<?xml version="1.0"?>\n<xliff version="1.2" xmlns="{X1}">\n  <file '
            'original="g" source-language="en" datatype="plaintext">\n    <body>\n'
            + "".join(units)
            + "    </body>\n  </file>\n</xliff>\n"
        )
    return (
        f'<?xml version="1.0"?>\n<xliff version="2.0" xmlns="{X2}" srcLang="en">\n  <file '
        'id="f">\n' + "".join(units) + "  </file>\n</xliff>\n"
    )


def _code(kind: str | None, k: int, chunk: str, version: int) -> str:
    """`chunk` with a code of `kind` (None: none), numbered `k`."""
    kept = 'mtype="protected"' if version == 1 else f'id="m{k}" translate="no"'
    return {
        None: chunk,
        "g": f'<g id="{k}">{chunk}</g>',
        "x": f'{chunk}<x id="{k}"/>',
        "bx": f'<bx id="{k}"/>{chunk}',
        "ex": f'{chunk}<ex id="{k}"/>',
        "bpt": f'<bpt id="{k}">&lt;b&gt;</bpt>{chunk}<ept id="{k}">&lt;/b&gt;</ept>',
        "ph": f'{chunk} <ph id="{k}">{{{k}}}</ph>' if version == 1 else f'{chunk} <ph id="{k}"/>',
        "it": f'<it id="{k}" pos="open">&lt;i&gt;</it>{chunk}',
        "mrk": f'<mrk mtype="term" mid="{k}">{chunk}</mrk>'
        if k % 2
        else f"<mrk {kept}>{chunk}</mrk>",
        "pc": f'<pc id="{k}">{chunk}</pc>',
        "sc": f'<sc id="{k}"/>{chunk}<ec startRef="{k}"/>',
        "sm": f'<sm id="s{k}"/>{chunk}<em startRef="s{k}"/>',
        "cp": f'{chunk}<cp hex="0001"/>',
    }[kind]


@pytest.mark.parametrize("version", [1, 2])
def test_a_file_of_hundreds_of_units_with_mixed_codes_is_filled_whole(version):
    if version == 2:
        pytest.importorskip("translate.storage.xliff2")
    document = generated(300, version)
    output = translate_document(document, "xliff", scrambled(version, fewest=1), "de").text
    units = read_back_1(output) if version == 1 else read_back_2(output)
    assert len(units) == 300 and all(u.target for u in units)
    assert without_targets(output, version) == document


def test_retranslate_replaces_a_translators_targets_and_marks_them_machine_translated():
    """Asked (`retranslate`), the units whose target a translator filled are translated
    again and marked as machine translations; translate="no" units stay as they were."""
    kept = translate_document(FILE_1, "xliff", upper, "de").text
    again = translate_document(FILE_1, "xliff", upper, "de", retranslate=True).text
    assert '<target state="final">Fertig</target>' in kept
    assert (
        '<target state="needs-review-translation" state-qualifier="leveraged-mt">DONE</target>'
        in again
    )
    units = {u.xmlelement.get("id"): u for u in read_back_1(again)}
    assert units["2"].xmlelement.find(f"{{{X1}}}target") is None  # translate="no"
    output_2 = translate_document(FILE_2, "xliff", upper, "de", retranslate=True).text
    assert "<target>SCHON</target>" not in output_2 and "<target>TRANSLATED</target>" in output_2
    assert '<segment id="s3" state="translated" subState="mtkit:mt">' in output_2


def test_retranslate_is_for_bilingual_files_alone():
    with pytest.raises(
        OptionError, match="retranslate is for bilingual files \\(xliff\\), not html"
    ):
        translate_document("<p>A dog.</p>", "html", upper, retranslate=True)
