"""Documents (`mtkit.documents`): markup carried through alignments, subtitles, gettext
catalogues, placeholders and numbers, with scripted translators (what they return is
known, so where each tag lands is too) and random ones (any alignment at all still gives
a well-formed document with exactly the input's tags)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from mtkit.core.errors import OptionError
from mtkit.core.translation import Translation
from mtkit.documents.catalogs import CatalogError
from mtkit.documents.formats import translate_document
from mtkit.documents.markup import MarkupError, parse, tags
from mtkit.documents.messages import translate_messages
from mtkit.documents.placeholders import placeholders, restore_numbers
from mtkit.documents.subtitles import SubtitleError

from fake_translations import reverse, scrambled, upper


def same(texts: list[str]) -> list[Translation]:
    """Each word as it was: word i is linked to word i."""
    return [
        Translation(t, t, -1.0, -0.5, (), tuple((i, i) for i in range(len(t.split()))))
        for t in texts
    ]


def first_word(texts: list[str]) -> list[Translation]:
    """Only the first word of each text, linked to it."""
    return [Translation(t, " ".join(t.split()[:1]), -1.0, -0.5, (), ((0, 0),)) for t in texts]


def padded(texts: list[str]) -> list[Translation]:
    """A new word first, linked to none, then each word in capitals: word i is linked to
    word i + 1."""
    out = []
    for text in texts:
        words = text.split()
        links = tuple((i, i + 1) for i in range(len(words)))
        target = " ".join(["NEW"] + [w.upper() for w in words])
        out.append(Translation(text, target, -1.0, -0.5, (), links))
    return out


def fixed(target: str, links: tuple) -> Callable[[list[str]], list[Translation]]:
    """`target` for any text, with `links`: a model's translation, as it came."""
    return lambda texts: [Translation(t, target, -1.0, -0.5, (), links) for t in texts]


PAGE = (
    '<!DOCTYPE html>\n<html lang="en"><head><title>A page</title>'
    "<style>p { color: red }</style></head><body>\n"
    '<p class="x">Hello <a href="/a?x=1&amp;y=2" title="T">my <i>good</i> friend</a>, '
    "how are you?<br>Fine &amp; you?</p>\n"
    "<pre>keep  <b>this</b> as is</pre><!-- a comment -->\n"
    '<p translate="no">not this one</p>\n'
    "<ul><li>One<li>Two &copy; 2024</ul>\n"
    "<p>Run <code>ls -l</code> to list the files.</p>\n"
    "</body></html>\n"
)


def test_html_keeps_every_tag_and_what_is_not_to_be_translated():
    out = translate_document(PAGE, "html", upper).text
    assert tags(out) == tags(PAGE)
    for kept in (
        "<pre>keep  <b>this</b> as is</pre>",
        "<!-- a comment -->",
        '<p translate="no">not this one</p>',
        "<style>p { color: red }</style>",
        '<a href="/a?x=1&amp;y=2" title="T">',
        "<code>ls -l</code>",
        "<!DOCTYPE html>",
    ):
        assert kept in out
    assert "<title>A PAGE</title>" in out
    assert '<a href="/a?x=1&amp;y=2" title="T">MY <i>GOOD</i> FRIEND</a>, HOW' in out
    assert "FINE &amp; YOU?" in out and "TWO © 2024" in out


def test_a_tag_follows_its_words_wherever_they_go():
    assert translate_document("<p>A man is <b>riding</b> a bike.</p>", "html", reverse).text == (
        "<p>bike. a <b>riding</b> is man A</p>"
    )
    # punctuation the target word took on goes after the end tag
    out = translate_document("<p>He rides a <b>bike</b>.</p>", "html", upper).text
    assert out == "<p>HE RIDES A <b>BIKE</b>.</p>"


@pytest.mark.parametrize(
    "document, expected",
    [
        ("<p><i>singing on a stage.</i></p>", "<p><i>NEW SINGING ON A STAGE.</i></p>"),
        (  # nested: all of its parent's words, all of its parent's translation
            "<p><b><i>A dog runs</i></b></p>",
            "<p><b><i>NEW A DOG RUNS</i></b></p>",
        ),
        (  # what else the run holds goes to the edge on its side
            '<p><img src="x"> <a href="y">A dog.</a><img src="z"></p>',
            '<p><img src="x"> <a href="y">NEW A DOG.</a><img src="z"></p>',
        ),
        ("<p>A <b>dog</b> runs.</p>", "<p>NEW A <b>DOG</b> RUNS.</p>"),
    ],
)
def test_a_tag_around_all_the_words_is_around_all_the_translation(document, expected):
    assert translate_document(document, "html", padded).text == expected


@pytest.mark.parametrize(
    "document, translate, expected",
    [
        (  # the model's "." went to "den Händen.": the placeholder is not glued to "den"
            "<p>A dog runs with <b>{{ a &amp;&amp; b }}</b>.</p>",
            fixed(
                "Ein Hund läuft mit den Händen.",
                ((0, 0), (1, 0), (1, 1), (2, 2), (3, 3), (4, 4), (4, 5)),
            ),
            "<p>Ein Hund läuft mit <b>{{ a &amp;&amp; b }}</b> den Händen.</p>",
        ),
        (  # a tag whose word found no partner keeps the spaces it had
            "<p>A <b>dog</b> runs.</p>",
            fixed("EIN HUND LÄUFT.", ((0, 0), (2, 2))),
            "<p>EIN HUND <b></b> LÄUFT.</p>",
        ),
        ("<p>A man<br>rides.</p>", upper, "<p>A MAN<br>RIDES.</p>"),
        ("<p>A man<br><br>rides.</p>", upper, "<p>A MAN<br><br>RIDES.</p>"),
        ("<p>A man <br> rides.</p>", upper, "<p>A MAN <br> RIDES.</p>"),
        ("<p>A man<br></p>", upper, "<p>A MAN<br></p>"),
        ("<p>Hi {a}{b} there, %s%%.</p>", upper, "<p>HI {a}{b} THERE, %s%%.</p>"),
    ],
)
def test_what_has_no_words_keeps_the_spaces_it_had_on_either_side(document, translate, expected):
    assert translate_document(document, "html", translate).text == expected


def test_a_tag_whose_only_words_end_its_neighbours_takes_them_from_it():
    """ "handstand" links to "einen Handstand auf", and "top" to "auf" alone: the bold
    run gives "auf" up to the italic one, which would have no word otherwise."""
    translate = fixed(
        "Ein Mann macht einen Handstand auf einer Statue.",
        ((0, 0), (1, 1), (2, 2), (3, 3), (3, 4), (3, 5), (5, 5), (7, 6), (8, 7)),
    )
    document = "<p>A man doing <b>handstand</b> on <i>top</i> of a statue.</p>"
    assert translate_document(document, "html", translate).text == (
        "<p>Ein Mann macht <b>einen Handstand</b> <i>auf</i> einer Statue.</p>"
    )


def test_a_tag_inside_a_word_kept_as_it_was_stays_on_its_characters():
    doc = "<p><b>W</b>ater is H<sub>2</sub>O, <i>NA</i>SA{x}'s.</p>"
    assert translate_document(doc, "html", same).text == doc
    assert translate_document(doc, "html", reverse).text == (
        "<p><i>NA</i>SA{x}'s. H<sub>2</sub>O, is <b>W</b>ater</p>"
    )
    # a word the translation changed is wrapped whole; a placeholder inside it goes after it
    assert translate_document(doc, "html", upper).text == (
        "<p><b>WATER</b> IS H<sub>2</sub>O, <i>NASA'S</i>.{x}</p>"
    )


def _tagged(k: int, word: Callable[[str], str] = str) -> str:
    """A piece of a long block: four tags (a link, a break, one element in another) and a
    placeholder around numbered words (each as `word` gives it)."""
    w, x, y, z, v = (word(f"{c}{k}") for c in "wxyzv")
    return f'<a href="/{k}">{w}</a> {x}<br>{y} <i>{z} <b>{v}</b></i>{{n{k}}}'


def _nested(k: int) -> str:
    """A chain of 100 spans, each inside the one before, each with a word of its own."""
    return "".join(f"<span>w{k}.{d} " for d in range(100)) + f"w{k}" + "</span>" * 100


@pytest.mark.parametrize(
    "document, translate, expected",
    [
        (  # each tag follows its word to the other end of the block
            "<p>" + " ".join(f"<b>w{k}</b> x{k}" for k in range(20_000)) + "</p>",
            reverse,
            "<p>" + " ".join(f"x{k} <b>w{k}</b>" for k in reversed(range(20_000))) + "</p>",
        ),
        (
            "<p>" + " ".join(_tagged(k) for k in range(5_000)) + "</p>",
            upper,
            "<p>" + " ".join(_tagged(k, str.upper) for k in range(5_000)) + "</p>",
        ),
        ("<p>" + " ".join(_nested(k) for k in range(200)) + "</p>", same, None),
    ],
    ids=["20000 tags reversed", "20000 tags and atoms", "20000 spans nested 100 deep"],
)
def test_a_block_of_20000_tags_comes_back_exactly(document, translate, expected):
    # Correctness at scale, which also keeps placement linear without timing anything:
    # placement that went over every word for every tag took minutes at this size.
    assert translate_document(document, "html", translate).text == (expected or document)


@pytest.mark.parametrize("seed", range(40))
def test_any_alignment_gives_well_formed_output_with_exactly_the_input_tags(seed):
    doc = (
        "<doc><title>A <em>short</em> title</title><para>Some <term id='t1'>text "
        "<sub>with <x/> inner</sub></term> here &amp; <b>there</b>. And <i>more</i>.</para>"
        "<para><!-- c --> Only words <br/> here</para></doc>"
    )
    out = translate_document(doc, "xml", scrambled(seed)).text
    assert tags(out, "xml") == tags(doc, "xml")
    parse(out, "xml")  # well-formed: every end tag closes the element it should


def test_bad_markup_is_one_line_or_a_named_best_effort(caplog):
    with pytest.raises(MarkupError, match="not well-formed: </b> closes <i>") as e:
        translate_document("<doc><b>a <i>b</b></i></doc>", "xml", upper)
    assert "\n" not in str(e.value)
    with pytest.raises(MarkupError, match="</doc> closes <p>, which was left open"):
        translate_document("<doc><p>a</doc>", "xml", upper)
    with pytest.raises(MarkupError, match="<doc> is never closed"):
        translate_document("<doc><p>a</p>", "xml", upper)
    with pytest.raises(MarkupError, match="a stray end tag </b>"):  # XML: a script holds tags
        translate_document("<doc><script>a </b></script></doc>", "xml", upper)
    with caplog.at_level(logging.WARNING):
        out = translate_document("<p>a stray</b> end</p>", "html", upper).text
    assert "best it can be" in caplog.text and tags(out) == tags("<p>a stray</b> end</p>")


def test_placeholders_are_found_and_kept_exactly_once():
    assert placeholders("Hi %(name)s, %d new, %1$s {0} {count} {{ user }} %{x} ${y} $z %%") == [
        "%(name)s",
        "%d",
        "%1$s",
        "{0}",
        "{count}",
        "{{ user }}",
        "%{x}",
        "${y}",
        "$z",
        "%%",
    ]
    assert placeholders("50% of 3 dogs cost $5") == []
    messages = ["Hello %(name)s, you have %d new messages.", "{count} files", "%s"]
    for translate in (upper, reverse, scrambled(1)):
        for source, out in zip(messages, translate_messages(messages, translate)):
            assert sorted(placeholders(out)) == sorted(placeholders(source))
    assert translate_messages(messages, upper) == [
        "HELLO %(name)s, YOU HAVE %d NEW MESSAGES.",
        "{count} FILES",
        "%s",
    ]
    assert translate_messages(["a < b & c"], upper) == ["A < B & C"]  # plain text stays plain


def test_a_number_the_model_changed_is_put_back_through_the_alignment():
    t = Translation(
        "I have 3 dogs and 2.5 cats.",
        "Ich habe 4 Hunde und 2,5 Katzen.",
        -1,
        -1,
        (),
        ((0, 0), (1, 1), (2, 2), (3, 3), (5, 5), (6, 6)),
    )
    assert restore_numbers(t).text == "Ich habe 3 Hunde und 2,5 Katzen."  # 2,5 is 2.5


def test_a_number_the_model_wrote_as_a_word_gets_its_digits_back():
    """ "2 men" as "Zwei Männer": the word linked to the source's 2 that is two becomes
    2; a number word linked to another number, or to no number, stays a word."""
    t = Translation(
        "2 men and 3 dogs, one cat.",
        "Zwei Männer und vier Hunde, eine Katze.",
        -1,
        -1,
        (),
        ((0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6)),
    )
    assert restore_numbers(t).text == "2 Männer und vier Hunde, eine Katze."


SRT = """1
00:00:01,000 --> 00:00:02,500
A man is riding
a bike and

2
00:00:02,600 --> 00:00:04,000
two dogs play in the snow.

7
00:00:05,000 --> 00:00:06,000
<i>It is 3 o'clock.</i>

"""


def test_subtitles_keep_numbers_timings_and_lines():
    import srt

    for translate in (upper, reverse, scrambled(2)):
        out = translate_document(SRT, "srt", translate).text
        before, after = list(srt.parse(SRT)), list(srt.parse(out))
        assert [(c.index, c.start, c.end) for c in after] == [
            (c.index, c.start, c.end) for c in before
        ]
        assert tags(after[2].content) == tags(before[2].content)
    cues = list(srt.parse(translate_document(SRT, "srt", upper).text))
    assert cues[0].content == "A MAN IS RIDING\nA BIKE AND"  # the sentence ran over two cues
    assert cues[1].content == "TWO DOGS PLAY IN THE SNOW."
    with pytest.raises(SubtitleError, match="not a SubRip"):
        translate_document("1\nnot a timing\nhello\n", "srt", upper)


PO = r"""msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\n"
"Plural-Forms: nplurals=3; plural=(n==1 ? 0 : n%10>=2 && n%10<=4 ? 1 : 2);\n"

#: app.py:10
#, python-format
msgid "Hello %(name)s, you have %d new messages."
msgstr ""

msgctxt "menu"
msgid "One file"
msgid_plural "{count} files"
msgstr[0] ""
msgstr[1] ""
msgstr[2] ""

msgid "Click <a href=\"/x\">here</a> to go"
msgstr ""

msgid "Done"
msgstr "Fertig"
"""


def test_po_catalogues_get_every_plural_form_with_placeholders_kept():
    import polib

    for translate in (upper, scrambled(3)):
        out = polib.pofile(translate_document(PO, "po", translate).text)
        entries = {e.msgid: e for e in out}
        assert entries["Done"].msgstr == "Fertig"  # a translated message is kept
        plural = entries["One file"]
        assert plural.msgctxt == "menu" and sorted(plural.msgstr_plural) == [0, 1, 2]
        assert all("{count}" in plural.msgstr_plural[k] for k in (1, 2))
        hello = entries["Hello %(name)s, you have %d new messages."]
        assert sorted(placeholders(hello.msgstr)) == ["%(name)s", "%d"]
        assert "python-format" in hello.flags
        link = entries['Click <a href="/x">here</a> to go']
        assert tags(link.msgstr) == tags(link.msgid)
    with pytest.raises(CatalogError, match="not a gettext"):
        translate_document("hello world\n", "po", upper)


@pytest.mark.parametrize(
    "document, format, says",
    [
        ('<p>A man walks.</p><p class="x\n', "html", "ends inside an unterminated tag"),
        ("<p>A man.</p><!-- never closed", "html", "ends inside an unterminated tag"),
        ('<a x="1', "xml", "ends inside an unterminated tag"),
        ("<A>A man.</a>", "xml", "names differ in case"),
        ("<div>" * 300 + "A man.", "html", "nests elements more than 128 deep"),
        ("<b>" * 3000 + "x", "xml", "nests elements more than 128 deep"),
        # what only an XML parser judges (once each was translated as if well-formed)
        ("<doc><p>A dog & a cat.</p></doc>", "xml", r"not well-formed \(invalid token\)"),
        # a document (a declaration, a DOCTYPE) has one root; a fragment may have several
        ('<?xml version="1.0"?><doc/><extra/>', "xml", "junk after document element"),
        ('<doc a="1" a="2">A dog.</doc>', "xml", "duplicate attribute"),
        # in a fragment, the line and column are the text's own (not the implied element's)
        ("A dog & a cat.", "xml", r"invalid token\): line 1, column 7 \('A dog & a cat.'\)"),
        ("<b>A</b> dog\n<i>x & y</i>", "xml", r"line 2, column 6 \('<i>x & y</i>'\)"),
        ("A&nbsp;dog.", "xml", "undefined entity: line 1, column 1"),
        ("<doc>A&nbsp;dog.</doc>", "xml", "undefined entity"),
        # the line quoted is the one expat counts (a U+2028 ends none in XML)
        (
            '<?xml version="1.0"?>\n<a>\u2028x</a>\n<b/>',
            "xml",
            r"junk after document element: line 3, column 0 \('<b/>'\)",
        ),
        # a "<![" that opens no section (an AssertionError inside Python's parser)
        ("<doc><![foo[x]]></doc>", "xml", "'<!\\[foo\\[x]]></doc>' is no CDATA section"),
        ("<doc><![ x</doc>", "xml", "is no CDATA section"),
        ("<doc><![CDATA[A dog.</doc>", "xml", "ends inside an unterminated tag"),
        (
            '<!DOCTYPE d [<!ENTITY c "a > b">]<d>A dog.</d>',
            "xml",
            "not well-formed: a stray end tag",
        ),
        ("<?pi a > b <d>A dog.</d>", "xml", "ends inside an unterminated tag"),
    ],
)
def test_markup_that_cannot_be_read_is_one_line(document, format, says):
    with pytest.raises(MarkupError, match=says) as e:
        translate_document(document, format, upper)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "document, format, expected",
    [
        # an & without ";" is text, and an HTML entity without one too
        ("<p>AT&T rocks &copy 2024.</p>", "html", "<p>AT&amp;T ROCKS © 2024.</p>"),
        # CDATA's text is text (inline, as a <b> is)
        ("<a><![CDATA[ x ]]>A man.</a>", "xml", "<a><![CDATA[X]]> A MAN.</a>"),
        ("<!foo><p>a dog</p>", "html", "<!foo><p>A DOG</p>"),
        (
            '<!DOCTYPE html [<!ENTITY x "y">]><p>A man.</p>',
            "html",
            '<!DOCTYPE html [<!ENTITY x "y">]><p>A MAN.</p>',
        ),
        (  # an XML document's own entity is kept as it stands
            '<!DOCTYPE a [<!ENTITY e "A man.">]><a>&e; walks.</a>',
            "xml",
            '<!DOCTYPE a [<!ENTITY e "A man.">]><a>&e; WALKS.</a>',
        ),
        # in XML (XHTML's elements) code, scripts and styles are kept too, their tags with them
        ("<doc><code>a dog</code></doc>", "xml", "<doc><code>a dog</code></doc>"),
        (
            "<doc><script>A <b>dog</b> runs.</script><p>A <b>dog</b>.</p></doc>",
            "xml",
            "<doc><script>A <b>dog</b> runs.</script><p>A <b>DOG</b>.</p></doc>",
        ),
        (
            '<html xmlns="http://www.w3.org/1999/xhtml"><head><title>A dog</title>'
            '<script>if (a &lt; b) alert("A dog runs.");</script>'
            "<style>p { color: red; }</style></head><body><pre>A dog runs.</pre>"
            "<p>Use <code>A cat</code> now.</p></body></html>",
            "xml",
            '<html xmlns="http://www.w3.org/1999/xhtml"><head><title>A DOG</title>'
            '<script>if (a &lt; b) alert("A dog runs.");</script>'
            "<style>p { color: red; }</style></head><body><pre>A dog runs.</pre>"
            "<p>USE <code>A cat</code> NOW.</p></body></html>",
        ),
        (  # XHTML's with a prefix too
            '<h:html xmlns:h="http://www.w3.org/1999/xhtml"><h:body><h:pre>A cat  sleeps.'
            "</h:pre><h:code>keep me</h:code><h:p>A dog runs.</h:p></h:body></h:html>",
            "xml",
            '<h:html xmlns:h="http://www.w3.org/1999/xhtml"><h:body><h:pre>A cat  sleeps.'
            "</h:pre><h:code>keep me</h:code><h:p>A DOG RUNS.</h:p></h:body></h:html>",
        ),
        (
            "<p>\u200b</p><p>—</p><p>...</p><p>&#0;</p>",
            "html",
            "<p>\u200b</p><p>—</p><p>...</p><p>&#0;</p>",
        ),
    ],
)
def test_what_markup_holds_is_kept_exactly(document, format, expected):
    assert translate_document(document, format, upper).text == expected


@pytest.mark.parametrize(
    "document, format",
    [
        ('<!DOCTYPE d [<!ENTITY c "Dogs > cats">]><d>A dog &c;.</d>', "xml"),
        ("<!DOCTYPE d [<!ENTITY c 'say \"a > b\"'>]><d>A dog &c;.</d>", "xml"),
        (  # a parameter entity, and a ">" in the subset's comment and instruction
            "<!DOCTYPE d [<!ENTITY % pe \"<!ENTITY c 'x'>\"> %pe; <!-- a > b --> "
            "<?pi a > b?>]>\n<d>A dog &c;.</d>",
            "xml",
        ),
        ('<?xml-stylesheet href="a>b"?><d>A dog.</d>', "xml"),
        ("<?php if ($a > 1) ?><p>A dog.</p>", "html"),
        ('<!DOCTYPE html [<!ENTITY x "a > b">]><p>A dog.</p>', "html"),
        ('<!DOCTYPE html PUBLIC "-//W3C//DTD HTML 4.01//EN"><p>A dog.</p>', "html"),
    ],
)
def test_a_gt_inside_a_doctype_or_an_instruction_keeps_it_whole(document, format):
    """Once cut at its first ">", the rest translated as text (not well-formed, exit 0)."""
    start = document.index("<d>" if format == "xml" else "<p>")
    head, body = document[:start], document[start:]
    out = translate_document(document, format, upper).text
    assert out == head + body.replace("A dog", "A DOG")
    assert tags(out, format) == tags(document, format)


def _cdata_text(document: str) -> str:
    """The text of `document`'s root as an XML parser reads it (CDATA and all)."""
    from xml.etree import ElementTree

    return "".join(ElementTree.fromstring(document).itertext())


@pytest.mark.parametrize(
    "document, translate, expected",
    [
        ("<d><![CDATA[A dog & a <cat>.]]></d>", upper, "<d><![CDATA[A DOG & A <CAT>.]]></d>"),
        ("<d>A <b><![CDATA[dog]]></b> runs.</d>", upper, "<d>A <b><![CDATA[DOG]]></b> RUNS.</d>"),
        ("<d>A <![CDATA[dog & cat]]> run.</d>", reverse, "<d>run. <![CDATA[cat & dog]]> A</d>"),
        ("<d><![CDATA[A {name} runs.]]></d>", upper, "<d><![CDATA[A {name} RUNS.]]></d>"),
        (  # a "]]>" in the translation would end the section: it is split across two
            "<d><![CDATA[A dog.]]></d>",
            fixed("Ein ]]> Hund.", ((0, 0), (1, 2))),
            "<d><![CDATA[Ein ]]]]><![CDATA[> Hund.]]></d>",
        ),
        (
            "<d>A <![CDATA[dog]]> runs.</d>",
            fixed("Ein ]]> Hund.", ((0, 0), (1, 1), (2, 2))),
            "<d>Ein <![CDATA[]]]]><![CDATA[>]]> Hund.</d>",
        ),
        (  # in what is kept (a script), CDATA stays as it was, byte for byte
            "<d><script><![CDATA[ if (a &lt; b && c) ]]></script><p><![CDATA[A dog.]]></p></d>",
            upper,
            "<d><script><![CDATA[ if (a &lt; b && c) ]]></script><p><![CDATA[A DOG.]]></p></d>",
        ),
    ],
)
def test_cdata_text_is_translated_as_text_and_stays_cdata(document, translate, expected):
    """Once left in English, silently. Written back, each section reads as it was
    translated: no entity in it, no "]]>" ending it early."""
    out = translate_document(document, "xml", translate).text
    assert out == expected
    assert _cdata_text(out) == _cdata_text(expected)


@pytest.mark.parametrize(
    "fragment, expected",
    [
        (  # the segment: no root
            "Select <parmname>Multiple Languages</parmname> and add the languages you want.",
            "SELECT <parmname>MULTIPLE LANGUAGES</parmname> AND ADD THE LANGUAGES YOU WANT.",
        ),
        ("<p>A dog.</p>\n<p>A cat.</p>", "<p>A DOG.</p>\n<p>A CAT.</p>"),  # several roots
        ("First <b>one</b> then <i>two</i> end", "FIRST <b>ONE</b> THEN <i>TWO</i> END"),
        # XML's own entities and character references: read as text, written escaped
        ("Tom &amp; Jerry caf&#233; &lt;3 <ph>x</ph>", "TOM &amp; JERRY CAFÉ &lt;3 <ph>X</ph>"),
        ("A dog runs.", "A DOG RUNS."),  # text alone
        ("", ""),
        ("<!-- c --><?pi x?>A <b>dog</b>.", "<!-- c --><?pi x?>A <b>DOG</b>."),
    ],
)
def test_an_xml_fragment_is_translated_as_the_content_of_an_element(fragment, expected):
    from xml.etree import ElementTree

    out = translate_document(fragment, "xml", upper).text
    assert out == expected
    assert tags(out, "xml") == tags(fragment, "xml")
    ElementTree.fromstring(f"<r>{out}</r>")  # well-formed, as the content of an element


def test_a_full_xml_document_is_kept_byte_for_byte_outside_its_text():
    document = (
        '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE doc [<!ENTITY e "x">]>\n'
        "<!-- head -->\n<doc a='1'  b=\"2\">\n  <p>A dog &e; &amp; <b>a cat</b>.</p>\n</doc>\n"
    )
    assert translate_document(document, "xml", upper).text == document.replace(
        "A dog &e; &amp; <b>a cat</b>.", "A DOG &e; &amp; <b>A CAT</b>."
    )


def test_cdata_in_html_is_kept_as_html_reads_it():
    """HTML has no CDATA outside SVG and MathML: a bogus comment to its parser."""
    out = translate_document("<p>A <![CDATA[dog]]> runs.</p>", "html", upper).text
    assert out == "<p>A <![CDATA[dog]]> RUNS.</p>"


def test_subtitle_override_tags_and_bad_timings():
    subs = "1\n00:00:01,000 --> 00:00:02,000\n{\\an8}A man walks.\n"
    assert "{\\an8}A MAN WALKS." in translate_document(subs, "srt", upper).text
    huge = "1\n99999999999:00:01,000 --> 99999999999:00:02,000\nA man walks.\n\n"
    with pytest.raises(SubtitleError, match="not a SubRip"):
        translate_document(huge, "srt", upper)


@pytest.mark.parametrize("forms", [0, 99999999])
def test_a_catalogue_with_impossible_plural_forms_is_one_line(forms):
    po = (
        f'msgid ""\nmsgstr ""\n"Plural-Forms: nplurals={forms}; plural=n;\\n"\n\n'
        'msgid "a file"\nmsgid_plural "files"\nmsgstr[0] ""\n'
    )
    with pytest.raises(CatalogError, match=f"nplurals={forms}"):
        translate_document(po, "po", upper)


@pytest.mark.parametrize(
    "message",
    [
        "<b>{name:<10}</b> is riding a bike.",
        "A dog runs with <b>{{ a && b }}</b>.",
        "Save <b>file</b> & exit",
        "Use <b>a</b> if x < y",
        "<b>Tom</b> &copy; 2020",
        "<i>Tom & Jerry < run.</i>",
    ],
)
def test_a_message_is_text_with_tags_not_html(message):
    assert translate_messages([message], same) == [message]
    po = f'msgid "{message}"\nmsgstr ""\n'
    assert translate_document(po, "po", same).text == f'msgid "{message}"\nmsgstr "{message}"\n'
    cue = f"1\n00:00:01,000 --> 00:00:02,000\n{message}\n"
    assert translate_document(cue, "srt", same).text == cue


def test_po_messages_keep_their_lines_and_tabs():
    po = (
        'msgid "Usage: dog [OPTIONS]\\n\\nRuns the dog.\\n"\nmsgstr ""\n\n'
        'msgid "Line one.\\nLine two with a dog."\nmsgstr ""\n\n'
        '#, c-format\nmsgid "A man:\\t%d bikes"\nmsgstr ""\n'
    )
    out = translate_document(po, "po", reverse).text  # each line, each column, reversed
    assert out == (
        'msgid "Usage: dog [OPTIONS]\\n\\nRuns the dog.\\n"\nmsgstr ""\n'
        '"[OPTIONS] dog Usage:\\n"\n"\\n"\n"dog. the Runs\\n"\n\n'
        'msgid "Line one.\\nLine two with a dog."\nmsgstr ""\n'
        '"one. Line\\n"\n"dog. a with two Line"\n\n'
        '#, c-format\nmsgid "A man:\\t%d bikes"\nmsgstr "man: A\\t%d bikes"\n'
    )


def test_a_po_file_is_checked_and_only_its_new_msgstrs_are_written():
    with pytest.raises(CatalogError, match="line 1 is not a keyword and a quoted string"):
        translate_document('msgid "A dog\nmsgstr ""\n', "po", upper)
    po = (
        '# a comment\nmsgid "x"\nmsgstr "\\x41"\n\n'
        'msgid "a long message"\nmsgstr ""\n"already translated, '
        'wrapped as its writer wrapped it"\n\n'
        'msgid "a dog"\nmsgstr ""\n\n#~ msgid "old"\n#~ msgstr "alt"\n'
    )
    assert translate_document(po, "po", upper).text == po.replace(
        'msgid "a dog"\nmsgstr ""', 'msgid "a dog"\nmsgstr "A DOG"'
    )


def test_a_sentence_that_cannot_fill_its_cues_is_translated_cue_by_cue():
    subs = "".join(
        f"{k}\n00:00:0{k},000 --> 00:00:0{k + 1},000\n{text}\n\n"
        for k, text in enumerate(["Yes,", "yes,", "yes,", "yes."], 1)
    )
    assert translate_document(subs, "srt", first_word).text == subs  # no cue left blank


def test_a_cue_with_tags_is_one_sentence_on_its_lines():
    seen = []

    def translate(texts):
        seen.extend(texts)
        return upper(texts)

    cue = (
        "1\n00:00:01,000 --> 00:00:02,000\n<i>A man is riding a bike</i>\n<i>down the street.</i>\n"
    )
    assert translate_document(cue, "srt", translate).text == (
        "1\n00:00:01,000 --> 00:00:02,000\n<i>A MAN IS RIDING A BIKE</i>\n<i>DOWN THE STREET.</i>\n"
    )
    assert seen == ["A man is riding a bike down the street."]


@pytest.mark.parametrize(
    "subs",
    [  # no cue numbers; a loosely written timing; CRLF line ends and no final blank line
        "00:00:01,000 --> 00:00:02,000\nA dog runs.\n\n00:00:02,000 --> 00:00:03,000\nA cat.\n",
        "1\n00:00:01,5 --> 00:01:75,000\nA dog runs.\n",
        "7\r\n00:00:01,000 --> 00:00:02,000\r\nA dog\r\nruns.",
    ],
)
def test_subtitle_numbers_and_timing_lines_are_kept_as_written(subs):
    expected = subs.replace("A dog", "A DOG").replace("runs.", "RUNS.").replace("A cat", "A CAT")
    assert translate_document(subs, "srt", upper).text == expected


@pytest.mark.parametrize(
    "po",
    [
        "",
        "# just a comment\n",
        'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n',
        'msgid "Done"\nmsgstr "Fertig"',
    ],
)
def test_a_po_file_with_nothing_to_translate_comes_back_as_it_was(po):
    assert translate_document(po, "po", upper).text == po


@pytest.mark.parametrize(
    "po, expected",
    [
        (  # a comment after the last entry
            'msgid "A dog runs."\nmsgstr ""\n\n# trailing comment about nothing\n',
            'msgid "A dog runs."\nmsgstr "A DOG RUNS."\n\n# trailing comment about nothing\n',
        ),
        (  # an obsolete entry with its previous msgid after it
            'msgid "A dog runs."\nmsgstr ""\n\n#~| msgid "Older."\n#~ msgid "Old."\n'
            '#~ msgstr "Alt."',
            'msgid "A dog runs."\nmsgstr "A DOG RUNS."\n\n#~| msgid "Older."\n#~ msgid "Old."\n'
            '#~ msgstr "Alt."',
        ),
        (  # every plural form's lines, their continuations too, and only those
            'msgid "a dog"\nmsgid_plural "dogs"\nmsgstr[0] ""\n""\nmsgstr[1] ""\n# after\n',
            'msgid "a dog"\nmsgid_plural "dogs"\nmsgstr[0] "A DOG"\nmsgstr[1] "DOGS"\n# after\n',
        ),
        (  # CRLF line ends, and none at the end of the file
            'msgid "x"\r\nmsgstr "y"\r\n\r\nmsgid "a dog"\r\nmsgid_plural "dogs"\r\n'
            'msgstr[0] ""\r\nmsgstr[1] ""',
            'msgid "x"\r\nmsgstr "y"\r\n\r\nmsgid "a dog"\r\nmsgid_plural "dogs"\r\n'
            'msgstr[0] "A DOG"\r\nmsgstr[1] "DOGS"',
        ),
        (  # an indented entry
            '  msgid "A dog runs."\n  msgstr ""\n',
            '  msgid "A dog runs."\n  msgstr "A DOG RUNS."\n',
        ),
    ],
)
def test_a_po_file_gets_only_its_msgstr_lines_new_with_its_line_ends_and_indents(po, expected):
    assert translate_document(po, "po", upper).text == expected


@pytest.mark.parametrize(
    "subs",
    [  # blank lines between cues, a line of spaces after a cue's text, CRLF
        "1\n00:00:01,000 --> 00:00:02,000\nA man is riding a bike.\n\n\n\n"
        "2\n00:00:03,000 --> 00:00:04,000\nTwo dogs play.\n\n\n",
        "1\n00:00:01,000 --> 00:00:02,000\nA cat sleeps.\n \n",
        "1\r\n00:00:01,000 --> 00:00:02,000\r\nA man is riding\r\na bike.\r\n\r\n\r\n"
        "2\r\n00:00:03,000 --> 00:00:04,000\r\nA cat sleeps.\r\n \r\n",
    ],
)
def test_the_lines_after_a_cue_are_kept_and_not_counted_as_its_lines(subs):
    expected = subs
    for words in ("A man is riding", "a bike.", "Two dogs play.", "A cat sleeps."):
        expected = expected.replace(words, words.upper())
    assert translate_document(subs, "srt", upper).text == expected


@pytest.mark.parametrize(
    "cue, texts, expected",
    [
        (
            "- A dog runs.\n- <i>A cat sleeps.</i>",
            ["A dog runs.", "A cat sleeps."],
            "- A DOG RUNS.\n- <i>A CAT SLEEPS.</i>",
        ),
        (  # no tags; a speaker over two lines, the second starting with a minus
            "-A man is riding\n-5 degrees.\n– Two dogs.",
            ["A man is riding -5 degrees.", "Two dogs."],
            "-A MAN IS RIDING\n-5 DEGREES.\n– TWO DOGS.",
        ),
    ],
)
def test_each_speaker_of_a_cue_is_a_text_of_their_own_after_their_dash(cue, texts, expected):
    seen = []

    def translate(batch):
        seen.extend(batch)
        return upper(batch)

    subs = "1\n00:00:03,000 --> 00:00:04,000\n{}\n\n"
    assert translate_document(subs.format(cue), "srt", translate).text == subs.format(expected)
    assert seen == texts


def test_the_one_table_names_every_format_its_suffixes_and_what_refusals_say():
    """The formats are listed once (`FORMATS`): the CLI's `--format` and a file's suffix,
    the API's `format=` read them there; the line that refuses binary input points there."""
    from mtkit.documents.formats import FORMATS, output_format

    assert (
        list(FORMATS)
        == ["html", "xml", "srt", "po", "xliff"] + "docx pptx xlsx odt odp epub".split()
    )
    for known in FORMATS.values():
        for suffix in known.suffixes:
            assert output_format(None, Path(f"page{suffix.upper()}")).kind == known.name
    assert output_format(None, Path("notes.txt")).kind == "text"
    assert output_format(None, None).kind == "text"
    with pytest.raises(
        OptionError,
        match="must be text, jsonl, html, xml, srt, po, xliff, docx, pptx, xlsx, odt, odp or "
        "epub, got 'x'",
    ):
        output_format("x")


def test_a_file_s_format_is_looked_up_once_by_its_suffix():
    """`format_of`: the API's and the CLI's input file and the server's uploads: a
    format's suffix in any case, .txt as text, None for one no format has, and a PDF
    refused in one line that says why; `suffixes` lists them (plain text's first)."""
    from mtkit.documents.formats import FORMATS, REFUSED, format_of, suffixes

    assert format_of("report.DOCX") == "docx" and format_of(Path("a/b.xliff")) == "xliff"
    assert format_of("notes.txt") == "text" and suffixes("text") == (".txt",)
    assert format_of("corpus.de") is None and format_of("noname") is None
    assert format_of("a.docm") is None
    for name in ("paper.pdf", "PAPER.PDF", Path("x/y.Pdf")):
        with pytest.raises(OptionError, match=r"^PDF is not translated: ") as refused:
            format_of(name)
        assert str(refused.value) == REFUSED[".pdf"] and refused.value.option == "format"
    assert suffixes()[0] == ".txt" and ".pdf" not in suffixes()
    assert set(suffixes()) == {".txt", *(s for f in FORMATS.values() for s in f.suffixes)}
    assert all(format_of(f"a{suffix}") is not None for suffix in suffixes())


def test_documents_of_one_call_are_translated_together_round_by_round():
    """Every document's texts of a round go to one call of `translate` (html's runs, the
    srt cues' rounds, po's messages), and each document comes out as it does alone."""
    from mtkit.documents.formats import translate_documents

    calls: list[list[str]] = []

    def counted(texts: list[str]) -> list[Translation]:
        calls.append(texts)
        return upper(texts)

    for format, documents in (
        ("html", ["<p>A <b>dog</b> runs.</p>", "<p>Two cats.</p>", "<p></p>"]),
        ("srt", [SRT, "1\n00:00:01,000 --> 00:00:02,000\n<i>A man</i> walks.\n", SRT]),
        ("po", [PO, 'msgid "A dog"\nmsgstr ""\n', "# nothing\n"]),
    ):
        alone = [translate_document(d, format, upper).text for d in documents]
        calls.clear()
        together = [t.text for t in translate_documents(documents, format, counted)]
        assert together == alone
        rounds = len(calls)
        calls.clear()
        for d in documents:
            translate_document(d, format, counted)
        assert rounds < len(calls)


def test_a_runs_text_is_anchored_at_its_tags_and_its_numbers():
    """What markup sends to translate names where placing reads links: each mark's span
    (nested ones too, and atoms) and each number, in the text the model reads."""
    from mtkit.documents.markup import prepare

    (text,) = prepare(
        "<p>  Plain words. A <b>bold <i>x</i></b> and 42 here.<br/></p>", "html"
    ).texts
    assert text == "Plain words. A bold x and 42 here."
    assert sorted(text.anchors) == sorted(
        [(15, 21), (20, 21), (26, 28), (len(text), len(text) + 1)]  # (<br> holds a space)
    )
    assert not text.touched(0, 12) and text.touched(12, len(text))


def test_a_sentence_away_from_tags_and_numbers_is_searched_without_the_links_pass(
    tiny_engine, monkeypatch
):
    """A document's sentences that no tag or number touches skip the teacher-forced
    links' pass (a sixth of a document's time on the main job's model); the document
    comes out exactly as when every sentence is linked."""
    from mtkit.core.search_options import SearchOptions
    from mtkit.engines import session as session_module
    from mtkit.engines.session import Session

    aligned: list[int] = []
    with_alignments = type(tiny_engine).with_alignments

    def counted(self, sources, hyps, layer, encoded=None, wanted=None):
        aligned.append(len(sources) if wanted is None else sum(wanted))
        return with_alignments(self, sources, hyps, layer, encoded, wanted)

    monkeypatch.setattr(type(tiny_engine), "with_alignments", counted)
    document = (
        "<p>The dog runs. A man <b>walks</b> home. Two girls sit.</p>"
        "<p>A cat sleeps. It has 3 toys.</p><h1>No tags at all here.</h1>"
    )
    session = Session(tiny_engine, SearchOptions(beam=2), split=True)
    (partly,) = session.translate_texts([document], "html")
    assert sum(aligned) == 2  # "A man walks home." and "It has 3 toys."
    aligned.clear()
    monkeypatch.setattr(session_module, "_wants_links", lambda *a: True)
    (fully,) = session.translate_texts([document], "html")
    assert sum(aligned) == 6
    assert partly.text == fully.text
