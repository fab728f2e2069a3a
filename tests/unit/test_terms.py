"""Terminology, the text side (`mtkit.core.terms`): constraints files, glossaries, whole-word
matching, term accuracy."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from mtkit.core.terms import (
    Glossary,
    TermScore,
    TermsError,
    combine,
    occurs,
    read_constraints,
    term_accuracy,
)


def write(tmp_path, data: bytes | str, name: str = "terms.txt"):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def test_constraints_one_line_per_input_line_phrases_split_on_tabs(tmp_path):
    path = write(tmp_path, "Farbe\tNew York\n\n  Haus \t\t Baum\t\n \t \nletzte")
    assert read_constraints(path) == [
        [("Farbe",), ("New York",)],
        [],
        [("Haus",), ("Baum",)],
        [],
        [("letzte",)],
    ]


def test_constraints_bom_dropped_crlf_accepted_phrase_twice_required_once(tmp_path):
    path = write(tmp_path, b"\xef\xbb\xbfHaus\r\n\r\nBaum\tBaum\r\n")
    assert read_constraints(path) == [[("Haus",)], [], [("Baum",)]]


def test_constraints_empty_file_has_no_lines(tmp_path):
    assert read_constraints(write(tmp_path, b"")) == []
    assert read_constraints(write(tmp_path, b"\n")) == [[]]


def test_invalid_utf8_names_the_file_and_line(tmp_path):
    path = write(tmp_path, b"gut\nauch gut\nschl\xffcht\n")
    with pytest.raises(TermsError) as e:
        read_constraints(path)
    assert str(e.value) == f"{path}: line 3 is not valid UTF-8 (byte 4: b'\\xffcht')"
    bad = write(tmp_path, b"\xc3\tx\n", "bad.tsv")
    with pytest.raises(TermsError, match=re.escape(f"{bad}: line 1 is not valid UTF-8")):
        Glossary.read(bad)


def test_missing_file_and_folder_are_oserrors_that_say_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt: no such file"):
        read_constraints(tmp_path / "missing.txt")
    with pytest.raises(IsADirectoryError, match="is a folder, not a text file"):
        Glossary.read(tmp_path)


def test_glossary_alternatives_in_file_order_comments_and_blank_lines(tmp_path):
    path = write(
        tmp_path,
        "# en\tde\n\ncolour\tFarbe\nhouse\tHaus\ncolour\tFärbung\n"
        "colour\tFarbe\r\n  \n house \t Gebäude\t\n",
        "g.tsv",
    )
    glossary = Glossary.read(path)
    assert len(glossary) == 2
    assert glossary.entries == {"colour": ("Farbe", "Färbung"), "house": ("Haus", "Gebäude")}
    assert glossary.constraints("the house has colour") == [
        ("Haus", "Gebäude"),
        ("Farbe", "Färbung"),
    ]


@pytest.mark.parametrize(
    ("line", "got"),
    [
        ("just one field", "got 1 field: 'just one field'"),
        ("a\tb\tc", "got 3 fields: 'a\\tb\\tc'"),
        ("\tonly target", "got 1 field: '\\tonly target'"),
    ],
)
def test_glossary_bad_line_names_file_line_and_what_it_got(tmp_path, line, got):
    path = write(tmp_path, f"# ok\ncat\tKatze\n{line}\n", "g.tsv")
    with pytest.raises(TermsError) as e:
        Glossary.read(path)
    assert str(e.value) == f"{path}: line 3: expected 'source term<TAB>target term', {got}"


def test_glossary_bad_line_shows_a_long_line_shortened(tmp_path):
    path = write(tmp_path, "x" * 100 + "\n", "g.tsv")
    with pytest.raises(TermsError, match=re.escape(f"got 1 field: '{'x' * 57}...'")):
        Glossary.read(path)


def test_glossary_matches_whole_words_case_sensitively():
    glossary = Glossary({"cat": ["Katze"], "Dog": ["Hund"]})
    assert glossary.constraints("a category of cats") == []
    assert glossary.constraints("Cat and dog") == []
    assert glossary.constraints("the cat, the Dog.") == [("Katze",), ("Hund",)]
    assert glossary.constraints("cat_food and bobcat") == []  # _ is a word character


def test_glossary_each_term_once_in_order_of_first_occurrence():
    glossary = Glossary({"cat": ["Katze"], "dog": ["Hund"], "kitty": ["Katze"]})
    assert glossary.constraints("dog cat dog cat kitty") == [("Hund",), ("Katze",)]


def test_longest_term_wins_and_the_shorter_inside_it_is_not_required():
    glossary = Glossary(
        {"York": ["York"], "New York": ["New York"], "New": ["neu"], "New York City": ["NYC"]}
    )
    assert glossary.constraints("in New York") == [("New York",)]
    assert glossary.constraints("New York City") == [("NYC",)]
    assert glossary.constraints("New York and York") == [("New York",), ("York",)]
    # "New York" is not a whole word in "New Yorker": the shorter "New" is.
    assert glossary.constraints("a New Yorker") == [("neu",)]


def test_unicode_word_characters_are_word_characters():
    glossary = Glossary({"Straße": ["street"], "über": ["over"]})
    assert glossary.constraints("die Straßen") == []
    assert glossary.constraints("die Straße, über alles") == [("street",), ("over",)]
    assert glossary.constraints("darüber") == []
    assert occurs("東京", "東京 は") and not occurs("東京", "東京都")


def test_terms_with_regex_metacharacters_match_literally():
    glossary = Glossary({"C++": ["C++"], "a.b": ["A.B"], "(x)": ["[x]"]})
    assert glossary.constraints("C++ and a.b (x)") == [("C++",), ("A.B",), ("[x]",)]
    assert glossary.constraints("Cxx and aXb x") == []
    assert occurs("C++", "in C++.") and not occurs("a.b", "axb")
    assert occurs("$1.00", "costs $1.00 now") and not occurs("a|b", "a")


def test_glossary_matches_as_a_term_by_term_search_does_many_terms():
    # The trie regex against the plain rule, on terms that share prefixes.
    words = ["ab", "abc", "abd", "b", "bc", "a", "c d", "abc d", "d"]
    glossary = Glossary({w: [w.upper()] for w in words})
    for line in ["abc d abd", "a b c d", "abcd ab", "d c d ab", "bc abc"]:
        found = [
            m.group()
            for m in re.finditer(
                r"(?<!\w)(?:"
                + "|".join(map(re.escape, sorted(words, key=len, reverse=True)))
                + r")(?!\w)",
                line,
            )
        ]
        assert glossary.constraints(line) == list(dict.fromkeys((w.upper(),) for w in found))


def test_glossary_of_terms_each_a_prefix_of_the_next_still_matches():
    # Nested past what re's parser recurses into: the flat alternation, the same matches.
    glossary = Glossary({"a" * n: [str(n)] for n in range(1, 600)})
    assert glossary.constraints("aaa " + "a" * 599 + " b") == [("3",), ("599",)]


def test_empty_glossary_requires_nothing(tmp_path):
    glossary = Glossary.read(write(tmp_path, "# nothing yet\n", "g.tsv"))
    assert len(glossary) == 0 and glossary.constraints("anything") == []


def test_combine_merges_line_by_line_dropping_repeats():
    from_file = [[("Haus",)], [], [("Baum",), ("Haus",)]]
    from_glossary = [[("Haus",), ("Farbe", "Färbung")], [("Hund",)], [("Haus",)]]
    assert combine(from_file, from_glossary) == [
        [("Haus",), ("Farbe", "Färbung")],
        [("Hund",)],
        [("Baum",), ("Haus",)],
    ]
    assert combine(from_file) == from_file and combine() == []
    with pytest.raises(ValueError, match=r"different lengths: \[3, 1\]"):
        combine(from_file, [[]])


def test_term_accuracy_counts_a_constraint_found_by_any_alternative():
    hypotheses = ["Die Färbung des Hauses", "ein Hund", "Katzenfutter"]
    required = [[("Farbe", "Färbung"), ("Haus",)], [("Hund",)], [("Katze",)]]
    result = term_accuracy(hypotheses, required)
    assert result == TermScore(found=2, total=4)
    assert result.accuracy == 0.5 and result.text == "term accuracy 50.0% (2/4)"


def test_term_score_text_cuts_not_rounds():
    assert TermScore(190, 200).text == "term accuracy 95.0% (190/200)"
    assert TermScore(2, 3).text == "term accuracy 66.6% (2/3)"
    assert TermScore(1999, 2000).text == "term accuracy 99.9% (1999/2000)"
    assert TermScore(0, 7).text == "term accuracy 0.0% (0/7)"


def test_no_terms_required_is_not_a_score():
    result = term_accuracy(["a", "b"], [[], []])
    assert result == TermScore(0, 0) and math.isnan(result.accuracy)
    assert result.text == "term accuracy n/a (no terms required)"


def test_term_accuracy_line_count_mismatch_is_one_line():
    with pytest.raises(TermsError) as e:
        term_accuracy(["one"], [[], []])
    assert str(e.value) == "1 hypothesis but terms for 2 lines"
    with pytest.raises(TermsError, match="^3 hypotheses but terms for 1 line$"):
        term_accuracy(["a", "b", "c"], [[]])


def test_occurs_refuses_an_empty_phrase():
    with pytest.raises(ValueError, match="empty phrase"):
        occurs("", "text")


def test_terms_loads_no_torch():
    code = "import sys, mtkit.core.terms; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
