"""Sentences in, sentences out (`mtkit.documents.sentences`, `mtkit.core.translation.joined`,
`mtkit.engines.session`): a line of several sentences is translated sentence by sentence
and joined back on its line."""

from __future__ import annotations

import io
import json

from mtkit.core.hypothesis import Hypothesis
from mtkit.core.search_options import SearchOptions
from mtkit.core.textio import OutputFormat
from mtkit.core.translation import Translation, confidence, joined
from mtkit.documents.sentences import sentence_spans, separator, split
from mtkit.engines.session import translate_stream

LINE = "A man is riding a bike. Two dogs play in the snow.  A woman sings!"


def test_sentences_are_exact_pieces_of_the_line_with_only_spaces_between():
    spans = sentence_spans("  " + LINE + " ")
    pieces = ["A man is riding a bike.", "Two dogs play in the snow.", "A woman sings!"]
    assert [("  " + LINE + " ")[a:b] for a, b in spans] == pieces
    assert split(LINE) == pieces


def test_abbreviations_numbers_and_unpunctuated_lines_are_not_split():
    assert split("Am 3. Mai kam Dr. Müller z.B. mit dem Zug. Er blieb.", "de") == [
        "Am 3. Mai kam Dr. Müller z.B. mit dem Zug.",
        "Er blieb.",
    ]
    assert split("The U.S. economy grew 2.5% in Jan. 2020.") == [
        "The U.S. economy grew 2.5% in Jan. 2020."
    ]
    assert split("a line without an end") == ["a line without an end"]
    assert split("   ") == [] and split("") == []
    # a language without rules of its own is split with English's
    assert split("One. Two.", "xx") == ["One.", "Two."]


def test_whitespace_inside_a_sentence_never_keeps_a_line_whole():
    """The splitter collapses whitespace: a double space (a tag without words taken out of
    the text, a placeholder) once made its sentences unfindable, and the whole line was
    translated as one sentence; a line break of hard-wrapped markup ended a sentence."""
    assert split("A man is riding a  bike. Two dogs play in the snow.") == [
        "A man is riding a  bike.",
        "Two dogs play in the snow.",
    ]
    wrapped = "A man in a red shirt is riding\n   a bike down the street. A dog\n   runs."
    assert split(wrapped) == [
        "A man in a red shirt is riding\n   a bike down the street.",
        "A dog\n   runs.",
    ]
    assert sentence_spans("\tOne.\t\tTwo  three. ") == [(1, 5), (7, 18)]


def test_sentences_are_joined_with_a_space_except_in_unspaced_scripts():
    assert separator("de") == " " and separator(None) == " "
    assert separator("zh") == "" and separator("ja-JP") == ""


def test_joined_counts_words_and_links_over_the_whole_line():
    one = Translation("A b.", "X y z.", -1.0, -0.5, ("▁X", "▁y", "▁z."), ((0, 0), (1, 2)))
    two = Translation("C d e.", "W.", -2.0, -1.0, ("▁W.",), ((2, 0),))
    line = joined("A b. C d e.", [one, two])
    assert line.text == "X y z. W."
    assert line.alignment == ((0, 0), (1, 2), (4, 3))  # "e." is source word 4, "W." target 3
    assert line.tokens == ("▁X", "▁y", "▁z.", "▁W.")
    assert abs(line.confidence - (-0.5 * 4 - 1.0 * 2) / 6) < 1e-9
    assert line.sentences == (one, two)
    assert joined("A b.", [one]) is one


def test_confidence_is_the_mean_log_probability_per_token_with_eos():
    assert confidence(Hypothesis([5, 6, 7], -2.0, -1.5)) == -0.5
    assert confidence(Hypothesis([], 0.0, 0.0)) == 0.0


def _one_by_one(engine, sentences, opts):
    texts = [engine.tgt_vocab.decode(engine.translate([s], opts)[0][0].tokens) for s in sentences]
    return " ".join(t for t in texts if t)


def test_a_line_of_sentences_is_translated_sentence_by_sentence(tiny_engine):
    opts = SearchOptions(beam=2, max_len_a=1.0, max_len_b=3)
    source = f"{LINE}\n\nHi.\n{LINE}\n".encode()
    sink = io.StringIO()
    assert translate_stream(tiny_engine, io.BytesIO(source), sink, opts, split=True) == 4
    out = sink.getvalue().split("\n")
    expected = _one_by_one(tiny_engine, split(LINE), opts)
    assert out == [expected, "", _one_by_one(tiny_engine, ["Hi."], opts), expected, ""]
    whole = io.StringIO()
    translate_stream(tiny_engine, io.BytesIO(LINE.encode()), whole, opts, split=False)
    assert (
        whole.getvalue()
        == tiny_engine.tgt_vocab.decode(tiny_engine.translate([LINE], opts)[0][0].tokens) + "\n"
    )


def test_jsonl_records_each_sentence_and_a_prefixed_line_stays_whole(tiny_engine):
    opts = SearchOptions(beam=2, max_len_a=1.0, max_len_b=3, alignments=True)
    records = [{"src": LINE, "id": 7}, {"src": LINE, "prefix": "Ein"}]
    sink = io.StringIO()
    translate_stream(
        tiny_engine,
        io.BytesIO("\n".join(json.dumps(r) for r in records).encode()),
        sink,
        opts,
        output=OutputFormat("jsonl"),
        split=True,
    )
    first, second = (json.loads(x) for x in sink.getvalue().splitlines())
    assert first["id"] == 7 and first["source"] == LINE
    assert [s["source"] for s in first["sentences"]] == split(LINE)
    assert (
        " ".join(s["translation"] for s in first["sentences"] if s["translation"])
        == (first["translation"])
    )
    assert all(s["confidence"] <= 0 for s in first["sentences"]) and first["confidence"] <= 0
    words = len(first["translation"].split())
    assert all(int(t) < words for link in first["alignment"].split() for t in link.split("-")[1:])
    assert "sentences" not in second  # a target prefix belongs to the whole line
