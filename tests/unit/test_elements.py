"""Which elements are inline, blocks, nested or kept (`mtkit.documents.elements`, judged
in `mtkit.documents.markup`): HTML's content model, ITS 2.0 (local attributes, a
document's rules, a user's rules file), DITA's and DocBook's defaults, the running-text
rule, and DeepL's options (`MarkupRules`), seen in the texts a document sends to be
translated (a run is one text) and in what comes back, with a scripted translator."""

from __future__ import annotations

from pathlib import Path

import pytest
from lxml import etree

from mtkit.core.errors import OptionError
from mtkit.core.translation import Translation
from mtkit.documents.elements import ITS, MarkupRules
from mtkit.documents.formats import translate_document
from mtkit.documents.markup import MarkupError, tags

from fake_translations import upper


def sent(document: str, format: str = "xml", **rules) -> tuple[list[str], str]:
    """The texts `document` sends to be translated (one per run), and what comes back."""
    texts: list[str] = []

    def translate(batch: list[str]) -> list[Translation]:
        texts.extend(batch)
        return upper(batch)

    out = translate_document(document, format, translate, rules=MarkupRules.checked(**rules)).text
    assert tags(out, format) == tags(document, format)
    if format == "xml" and out.startswith("<?xml"):  # well-formed, as a document
        etree.fromstring(out.encode(), etree.XMLParser(encoding="utf-8"))
    elif format == "xml":  # or as a fragment is: inside an implied element
        etree.fromstring(f'<r xmlns:its="{ITS}">{out}</r>'.encode())
    return texts, out


SEGMENT = "Select <parmname>Multiple Languages</parmname> and add the languages you want."


@pytest.mark.parametrize("format", ["xml", "html"])
def test_a_segment_with_unknown_elements_is_one_sentence(format):
    """LibreTranslate's #806: parmname, ph and uicontrol cut a sentence in three."""
    texts, out = sent(SEGMENT, format)
    assert texts == ["Select Multiple Languages and add the languages you want."]
    assert out == ("SELECT <parmname>MULTIPLE LANGUAGES</parmname> AND ADD THE LANGUAGES YOU WANT.")
    texts, _ = sent('Press <my-widget x="1">OK</my-widget> or <ph>Cancel</ph>.', format)
    assert texts == ["Press OK or Cancel."]


def test_html_blocks_are_blocks_and_phrasing_and_unknown_elements_inline():
    texts, out = sent(
        "<div>Open <uicontrol>File</uicontrol> now<p>A new <b>one</b></p></div>"
        "<ul><li>First <xref>see</xref></li><li>Second</li></ul>",
        "html",
    )
    assert texts == ["Open File now", "A new one", "First see", "Second"]
    assert out.startswith("<div>OPEN <uicontrol>FILE</uicontrol> NOW<p>")


@pytest.mark.parametrize(
    "document, expected",
    [
        # several roots, text before the first element, text after the last
        ("<p>A dog.</p><p>A cat.</p>", ["A dog.", "A cat."]),
        ("Then <ph>tap</ph> here <b>now</b>", ["Then tap here now"]),
        # an element nothing names: inline beside text, a block where none is
        ("Use the <zz>red</zz> one.", ["Use the red one."]),
        ("<zz>One dog.</zz><zz>Two cats.</zz>", ["One dog.", "Two cats."]),
        ("<doc>\n  <zz>One dog.</zz>\n  <zz>Two cats.</zz>\n</doc>", ["One dog.", "Two cats."]),
        # DITA's defaults where no vocabulary is said (what DITA and DocBook agree on)
        ("<ph>One</ph> <uicontrol>two</uicontrol>", ["One two"]),
        ("<li>First <ul><li>inner</li></ul></li>", ["First", "inner"]),
        ("<title>A title</title><shortdesc>A line.</shortdesc>", ["A title", "A line."]),
        ("<step><cmd>Open it.</cmd><info>It opens.</info></step>", ["Open it.", "It opens."]),
        # code is kept, inside a sentence as an atom: codeph (DITA), code (DocBook, XHTML)
        ("Run <codeph>ls -l</codeph> now.", ["Run  now."]),
        # a footnote is nested: its text translated on its own, where it stood
        ("A dog<fn>Or a wolf.</fn> runs.", ["Or a wolf.", "A dog runs."]),
    ],
)
def test_xml_segments_by_vocabulary_and_running_text(document, expected):
    assert sent(document)[0] == expected


def test_a_nested_footnote_is_written_back_translated_inside_its_sentence():
    assert sent("A dog<fn>Or a wolf.</fn> runs.")[1] == "A DOG<fn>OR A WOLF.</fn> RUNS."


def test_docbook_by_its_namespace_and_dita_by_its_doctype():
    docbook = (
        '<article xmlns="http://docbook.org/ns/docbook"><para>Click <guilabel>OK</guilabel>'
        " in <filename>a.txt</filename>.</para><variablelist><varlistentry>"
        "<term>Dog</term><listitem><para>An animal.</para></listitem></varlistentry>"
        "</variablelist><programlisting>ls -l</programlisting></article>"
    )
    assert sent(docbook)[0] == ["Click OK in a.txt.", "Dog", "An animal."]
    dita = (
        '<?xml version="1.0"?>\n<!DOCTYPE concept PUBLIC "-//OASIS//DTD DITA Concept//EN" '
        '"concept.dtd">\n<concept id="c"><title>Setup</title><conbody><p>Set '
        "<term>locale</term> and <option>-v</option>.</p><codeblock>make</codeblock>"
        "</conbody></concept>"
    )
    texts, out = sent(dita)
    assert texts == ["Setup", "Set locale and -v."]
    assert out.startswith('<?xml version="1.0"?>\n<!DOCTYPE concept PUBLIC')
    assert "<codeblock>make</codeblock>" in out


def test_xhtml_in_xml_follows_html():
    page = (
        '<html xmlns="http://www.w3.org/1999/xhtml"><body><div>A <zz>dog</zz> runs.'
        "<p>A cat.</p></div></body></html>"
    )
    assert sent(page)[0] == ["A dog runs.", "A cat."]


def test_its_local_attributes_win():
    texts, out = sent(
        f'<doc xmlns:its="{ITS}"><p>A <ph its:withinText="no">dog</ph> runs '
        '<b its:translate="no">Kept</b> and <ph its:withinText="nested">a note</ph>.</p></doc>'
    )
    assert texts == ["A", "dog", "a note", "runs  and ."]
    assert '<b its:translate="no">Kept</b>' in out
    # in a segment the its: prefix needs no declaration (the implied element has it)
    assert sent('A <zz its:withinText="no">dog</zz> runs.')[0] == ["A", "dog", "runs."]


RULES = (
    '<its:rules xmlns:its="http://www.w3.org/2005/11/its" version="2.0" '
    'xmlns:d="urn:d">{}</its:rules>'
)


def test_its_rules_in_the_document():
    document = (
        "<doc>"
        + RULES.format(
            '<its:withinTextRule withinText="no" selector="//ph | //zz"/>'
            '<its:translateRule translate="no" selector="//*[@code]"/>'
            '<its:withinTextRule withinText="yes" selector="//d:x"/>'
        )
        + '<p>A <ph>dog</ph> runs <b code="1">kept</b> <zz>far</zz>.</p>'
        '<p xmlns:d="urn:d"><d:x>One</d:x> <d:x>two</d:x></p></doc>'
    )
    texts, out = sent(document)
    assert texts == ["A", "dog", "runs", "far", "One two"]  # (a "." alone: kept as it is)
    assert '<b code="1">kept</b>' in out and "<its:withinTextRule" in out  # (rules kept)


def test_a_user_rules_file_is_above_the_document_s_rules_and_below_local_markup(tmp_path):
    rules = tmp_path / "rules.xml"
    rules.write_text(
        RULES.format(
            '<its:withinTextRule withinText="yes" selector="//ph"/>'
            '<its:translateRule translate="no" selector="//uicontrol"/>'
        )
    )
    document = (
        "<doc>"
        + RULES.format('<its:withinTextRule withinText="no" selector="//ph"/>')
        + f'<p xmlns:its="{ITS}">A <ph>dog</ph> and <ph its:withinText="no">a cat</ph> '
        "<uicontrol>OK</uicontrol> run.</p></doc>"
    )
    assert sent(document)[0] == ["A", "dog", "and", "a cat", "OK run."]
    texts, out = sent(document, its_rules=rules)
    assert texts == ["A dog and", "a cat", "run."]
    assert "<uicontrol>OK</uicontrol>" in out


@pytest.mark.parametrize("format", ["xml", "html"])
def test_deepl_options(format):
    segment = "Open <zz>the menu</zz> and <p>a new page</p> <kk>right away</kk>."
    assert sent(segment, format, ignore_tags="zz")[0][:1] == ["Open  and"]
    assert sent(segment, format, ignore_tags=["zz"])[1].startswith("OPEN <zz>the menu</zz>")
    assert sent(segment, format, splitting_tags="zz,kk")[0] == [
        "Open",
        "the menu",
        "and",
        "a new page",
        "right away",
    ]
    assert sent(segment, format, outline_detection=False)[0] == [
        "Open the menu and a new page right away."
    ]
    assert sent(segment, format, outline_detection=0)[0] == [  # (JSON's 0 too)
        "Open the menu and a new page right away."
    ]
    assert sent(segment, format, outline_detection="0", splitting_tags=["kk"])[0] == [
        "Open the menu and a new page",
        "right away",
    ]
    assert sent("<zz>One.</zz><zz>Two.</zz>", "xml", non_splitting_tags="zz")[0] == ["One.Two."]


@pytest.mark.parametrize(
    "given, says",
    [
        (dict(ignore_tags="a,<b>"), "--ignore-tags: '<b>' is not a tag name"),
        (dict(splitting_tags=3), "--splitting-tags must be tag names, comma-separated or"),
        (dict(outline_detection="maybe"), "--outline-detection must be true or false"),
        (dict(outline_detection=2), "--outline-detection must be true or false"),
        (dict(its_rules="/no/such/rules.xml"), "--its-rules /no/such/rules.xml: No such file"),
    ],
)
def test_bad_markup_options_are_one_line_naming_the_option(given, says):
    with pytest.raises(OptionError, match=says) as e:
        MarkupRules.checked(**given)
    assert "\n" not in str(e.value)


def test_a_rules_file_that_is_wrong_is_one_line(tmp_path: Path):
    path = tmp_path / "r.xml"
    for text, says in [
        ("<its:rules", "not well-formed XML"),
        ("<rules/>", "no its:rules element"),
        (RULES.format('<its:withinTextRule withinText="maybe" selector="//a"/>'), "yes, no or"),
        (RULES.format('<its:translateRule translate="no" selector="//["/>'), "is not XPath"),
        (  # an external entity is never fetched or expanded
            '<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><r>&x;</r>',
            "no its:rules element",
        ),
    ]:
        path.write_text(text)
        with pytest.raises(OptionError, match=says) as e:
            MarkupRules.checked(its_rules=str(path), spell=str)
        assert "\n" not in str(e.value) and str(e.value).startswith(f"its_rules {path}")


def test_markup_options_are_for_markup_formats():
    with pytest.raises(OptionError, match="ignore_tags is for html or xml documents, not srt"):
        translate_document(
            "1\n00:00:01,000 --> 00:00:02,000\nA dog.\n",
            "srt",
            upper,
            rules=MarkupRules.checked(ignore_tags="b", spell=str),
        )


def test_a_document_s_bad_its_rule_is_one_line():
    document = "<doc>" + RULES.format('<its:translateRule translate="x" selector="//a"/>')
    with pytest.raises(MarkupError, match="translate='x' must be yes or no"):
        translate_document(document + "<p>A dog.</p></doc>", "xml", upper)


def test_a_document_s_costly_selector_is_left_out_with_a_warning(caplog):
    """A document's rules come from a stranger: only paths of names are evaluated."""
    document = (
        "<doc>"
        + RULES.format(
            '<its:withinTextRule withinText="no" selector="//*[count(//*) &gt; 0]"/>'
            '<its:withinTextRule withinText="no" selector="//zz"/>'
        )
        + "<p>A <zz>dog</zz> and <ph>a cat</ph> run.</p></doc>"
    )
    assert sent(document)[0] == ["A", "dog", "and a cat run."]
    assert "1 left out" in caplog.text


def test_a_rules_file_is_for_xml(tmp_path):
    rules = tmp_path / "rules.xml"
    rules.write_text(RULES.format('<its:withinTextRule withinText="no" selector="//b"/>'))
    with pytest.raises(OptionError, match="--its-rules is for xml documents"):
        sent("A <b>dog</b>.", "html", its_rules=rules)


@pytest.mark.parametrize("encoding", ["iso-8859-1", "utf-16"])
def test_its_rules_are_read_whatever_encoding_the_declaration_names(encoding):
    """The document is text by then (read in its encoding): its rules are read from it."""
    document = (
        f'<?xml version="1.0" encoding="{encoding}"?><d>'
        + RULES.format('<its:withinTextRule withinText="no" selector="//b"/>')
        + "<p>A <b>dog</b> runs é.</p></d>"
    )
    assert sent(document)[0] == ["A", "dog", "runs é."]


def test_the_safe_parser_is_made_once_per_thread_and_expands_no_entity(tmp_path):
    """One parser per thread and encoding (lxml's parsers are not shared between
    threads), which neither expands a declared entity nor reads an external one."""
    import threading

    from mtkit.documents.elements import safe_parser

    mine = safe_parser("utf-8")
    assert safe_parser("utf-8") is mine and safe_parser() is not mine
    theirs = []
    thread = threading.Thread(target=lambda: theirs.append(safe_parser("utf-8")))
    thread.start()
    thread.join()
    assert theirs[0] is not mine
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    document = (
        f'<!DOCTYPE d [<!ENTITY a "expanded"><!ENTITY s SYSTEM "{secret.as_uri()}">]><d>&a; &s;</d>'
    ).encode()
    root = etree.fromstring(document, safe_parser("utf-8"))
    assert "expanded" not in etree.tostring(root, encoding="unicode")
    assert "SECRET" not in etree.tostring(root, encoding="unicode")
