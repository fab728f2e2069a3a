"""Terminology, the text side: the constraints a line's translation must contain, read from
a `--constraints` file or found by a glossary in the source line, and term accuracy, the
share of them a translation has. No torch here: the torch-free text I/O layer uses it (and
so the CTranslate2 path); the constrained search itself lives with the engines.

A *constraint* is a tuple of one or more alternative target phrases, any one of which must
appear; a line's constraints are a list of them. A phrase "appears" as whole words: not
preceded or followed by a word character (`\\w`, Unicode), case as given (`occurs`).
"""

from __future__ import annotations

import codecs
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from mtkit.core.errors import UserError, plural

Constraint = tuple[str, ...]  # alternatives: any one of them must appear

_END = ""  # the key that marks, in a trie node, where a term ends (no character is "")


class TermsError(UserError, ValueError):
    """A constraints file or glossary that cannot be read, or terms that do not line up
    with the hypotheses (one line, naming the file and the line)."""


def _read_lines(path: str | Path) -> list[str]:
    """A UTF-8 file's lines: a byte-order mark dropped, `\\r\\n` taken as `\\n`, a last line
    without newline counted. Split on "\\n" alone, as `mtkit.core.textio.read_lines` splits the
    hypotheses, so that line numbers agree. Invalid UTF-8 is an error naming the line, not
    replaced: a term with U+FFFD in it would never be found, silently."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a text file")
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)  # read once: a pipe works too
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, start = data.count(b"\n", 0, e.start) + 1, data.rfind(b"\n", 0, e.start) + 1
        raise TermsError(
            f"{path}: line {line} is not valid UTF-8 (byte {e.start - start}: "
            f"{data[e.start : e.start + 4]!r})"
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _unique(items):
    """`items` in order, each once."""
    return list(dict.fromkeys(items))


def read_constraints(path: str | Path) -> list[list[Constraint]]:
    """The `--constraints` file: one line per input line, its phrases separated by tabs,
    each a constraint of its own; an empty line has none. Phrases are stripped, empty
    fields skipped, a phrase given twice on a line required once."""
    return [
        _unique((p,) for phrase in line.split("\t") if (p := phrase.strip()))
        for line in _read_lines(path)
    ]


@functools.lru_cache(maxsize=4096)
def _phrase_pattern(phrase: str) -> re.Pattern:
    if not phrase:
        raise ValueError("an empty phrase occurs everywhere")
    return re.compile(rf"(?<!\w){re.escape(phrase)}(?!\w)")


def occurs(phrase: str, text: str) -> bool:
    """Whether `phrase` is in `text` as whole words: "cat" is in "a cat." but not in
    "category", nor in "Cat"."""
    return _phrase_pattern(phrase).search(text) is not None


class Glossary:
    """Source terms and their target terms: which constraints a source line requires.

    `entries` maps each source term to its alternatives (several target terms: any one
    will do). Matching is case-sensitive, whole words, leftmost-longest: in "in New York"
    with both "New York" and "York" in the glossary, only "New York" is required.
    """

    def __init__(self, entries: Mapping[str, Sequence[str]]):
        checked: dict[str, Constraint] = {}
        for source, targets in entries.items():
            targets = (targets,) if isinstance(targets, str) else targets
            if not source or not targets or not all(targets):
                raise ValueError(
                    f"a glossary entry needs a source term and target terms, "
                    f"got {source!r}: {targets!r}"
                )
            checked[source] = tuple(_unique(targets))
        self.entries = MappingProxyType(checked)  # read-only: the pattern is built from it
        self._pattern = _terms_pattern(checked) if checked else None

    @classmethod
    def read(cls, path: str | Path) -> Glossary:
        """A TSV glossary: `source term<TAB>target term` a line (fields stripped, empty ones
        skipped as in a constraints file: a trailing tab is no third field); blank lines and
        lines that start with `#` skipped; a source term on several lines has each target
        as an alternative, in file order, each once."""
        entries: dict[str, list[str]] = {}
        for n, line in enumerate(_read_lines(path), 1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = [f for field in line.split("\t") if (f := field.strip())]
            if len(fields) != 2:
                raise TermsError(
                    f"{path}: line {n}: expected 'source term<TAB>target "
                    f"term', got {plural(len(fields), 'field')}: "
                    f"{shorten(line)!r}"
                )
            entries.setdefault(fields[0], []).append(fields[1])
        return cls(entries)

    def __len__(self) -> int:
        return len(self.entries)

    def constraints(self, line: str) -> list[Constraint]:
        """The constraints `line` requires: the targets of each source term in it, in order
        of first occurrence, each once (two terms with the same targets: once)."""
        if self._pattern is None:
            return []
        return _unique(self.entries[m.group()] for m in self._pattern.finditer(line))


def shorten(text: str, limit: int = 60) -> str:
    """At most `limit` characters of `text`, "..." at the end where it was cut (a term or
    line echoed in a message: a runaway one is not printed whole)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _terms_pattern(terms) -> re.Pattern:
    """One regex for every term, whole words, longest first at each position.

    The alternatives are a character trie, not a flat `a|b|c` (which re tries one by one at
    every position: far slower with thousands of terms); where one term is a prefix of another,
    the greedy `(...)?` tries the longer first and backs off to the shorter where the
    longer is not followed by a word boundary ("New" in "New Yorker"). A trie nested
    deeper than re's parser recurses (hundreds of terms each a prefix of the next) falls
    back to the flat alternation, longest first: slower, the same matches."""
    trie: dict = {}
    for term in terms:
        node = trie
        for ch in term:
            node = node.setdefault(ch, {})
        node[_END] = {}
    try:
        return re.compile(rf"(?<!\w){_trie_pattern(trie)}(?!\w)")
    except RecursionError:
        flat = "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True))
        return re.compile(rf"(?<!\w)(?:{flat})(?!\w)")


def _trie_pattern(node: dict) -> str:
    """The regex for the term endings below `node`."""
    branches = []
    for ch, child in node.items():
        if ch == _END:
            continue
        run = [ch]
        while len(child) == 1 and _END not in child:  # no branch, no term ends: one literal
            ((ch, child),) = child.items()
            run.append(ch)
        branches.append(re.escape("".join(run)) + _trie_pattern(child))
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    return f"(?:{body})?" if _END in node else body


def combine(*per_line: list[list[Constraint]]) -> list[list[Constraint]]:
    """Several per-line lists of constraints (a constraints file's, a glossary's) merged
    line by line, in order, a constraint already on the line dropped."""
    if len({len(lines) for lines in per_line}) > 1:
        raise ValueError(
            f"per-line constraints of different lengths: {[len(lines) for lines in per_line]}"
        )
    return [_unique(c for line in lines for c in line) for lines in zip(*per_line, strict=True)]


@dataclass(frozen=True)
class TermScore:
    found: int  # constraints with one of their alternatives in the hypothesis
    total: int  # constraints required

    @property
    def accuracy(self) -> float:
        """found / total; NaN where no term was required: neither 0% nor 100%, and a NaN
        cannot pass for a score in an average."""
        return self.found / self.total if self.total else float("nan")

    @property
    def text(self) -> str:
        """ "term accuracy 95.0% (190/200)", or "term accuracy n/a (no terms required)". The
        percentage is cut, not rounded, to one decimal: 1999/2000 reads 99.9%, since 100.0%
        with a term missing would say none is."""
        if not self.total:
            return "term accuracy n/a (no terms required)"
        tenths = 1000 * self.found // self.total  # integers: no float lands just below
        return f"term accuracy {tenths // 10}.{tenths % 10}% ({self.found}/{self.total})"


def term_accuracy(hypotheses: list[str], required: list[list[Constraint]]) -> TermScore:
    """How many of each line's constraints its hypothesis has (any one alternative, as
    whole words)."""
    if len(hypotheses) != len(required):
        raise TermsError(
            f"{plural(len(hypotheses), 'hypothesis', 'hypotheses')} but terms "
            f"for {plural(len(required), 'line')}"
        )
    found = sum(
        any(occurs(phrase, hyp) for phrase in constraint)
        for hyp, line in zip(hypotheses, required, strict=True)
        for constraint in line
    )
    return TermScore(found, sum(map(len, required)))
