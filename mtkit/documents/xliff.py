"""XLIFF 1.2 and 2.x (2.0, 2.1, 2.2): the files translators' tools exchange, translated
unit by unit.

Each translatable unit's source is translated into its target with its inline codes
carried through as tags, by `mtkit.documents.markup`'s placement (a source is one run:
paired codes, 1.2's `g` and `mrk`, 2.x's `pc` and `mrk`, go around the target words
aligned to the words they held; standalone ones, 1.2's `x`, 2.x's `ph` and `cp`,
beside their neighbouring word; the codes that open and close a span, 1.2's `bpt`/`ept`
and `bx`/`ex`, 2.x's `sc`/`ec` and `sm`/`em`, as one paired element where both stand in
the same element, so that the closing one stays after the opening one, around the words
they held; apart, each beside its word). The codes whose content is the original
format's own code (1.2's `bpt`, `ept`, `ph`, `it`, with any `sub` inside them: a `sub`'s
text is not translated) and text marked not to be translated (1.2's `mrk mtype="protected"`, 2.x's
`mrk translate="no"`) are atoms: kept whole, verbatim. A CDATA section in a source is
translated as text and written as CDATA.

What is translated: in 1.2, each `trans-unit` (not `translate="no"`, by itself or by the
`group` around it) whose `target` is missing or empty (no text: `<target/>`, or only
empty segments, as Trados prepares them); where it has a `seg-source` with
`mrk mtype="seg"` segments, each segment is translated on its own and the target is
the `seg-source` with each segment's content translated (its `mrk`s, same `mid`s, as
Okapi and Trados write them). In 2.x, each `segment` of each `unit` (not
`translate="no"`, by itself or by its group or file) whose `target` is missing or
empty; an `ignorable` is kept. A unit (1.2) or segment (2.x) with a target already
written is kept as it is: its target is a translator's (asked, `retranslate`, it is
translated again and marked as the others are).

A new target goes right after its source (after `seg-source` in 1.2), indented as the
source is, with the source's namespace prefix; 1.2's is marked
`state="needs-review-translation" state-qualifier="leveraged-mt"` (the 1.2
specification's values for a machine translation a translator should review), a 2.x
segment gets `state="translated" subState="mtkit:mt"`. An empty target already in the
file is filled (and given those attributes, the others kept). The target language is
written where the file names none (1.2: each `file`'s `target-language`, after its
`source-language`; 2.x: the root's `trgLang`, after `srcLang`): the language the call
translates into; a file that names another language is refused, in one line (one that
names the same language with a region, `de-AT` for `de`, keeps its own).

Everything else is kept as written, character for character: the file is read into
markup's tree (`markup.parse`, which keeps every tag, comment, declaration and space as
it stands) and only the new targets and attributes are written into it. The file is
checked first with lxml (no network, no DTD loaded, no entity expanded): it must be
well-formed (one line, with the line and column, where it is not), XLIFF (its root
`xliff` in an XLIFF namespace), without entity declarations (a DOCTYPE that declares
entities is refused: a hostile file's "billion laughs"), at most `MAX_CHARS` characters
and `markup.MAX_DEPTH` elements deep.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mtkit.core.errors import UserError
from mtkit.core.translation import Translation
from mtkit.documents import markup
from mtkit.documents.elements import safe_parser
from mtkit.documents.rounds import Rounds

NAMESPACE = "urn:oasis:names:tc:xliff:document:"  # + 1.2, 2.0 (2.1's too), 2.2
MAX_CHARS = 1 << 27  # the longest XLIFF file read: 128 Mi characters
# 1.2's codes that hold the original format's code (kept whole, never translated)
NATIVE = frozenset({"bpt", "ept", "ph", "it"})
# How a machine translation is marked for review
MARKED_1 = {"state": "needs-review-translation", "state-qualifier": "leveraged-mt"}
MARKED_2 = {"state": "translated", "subState": "mtkit:mt"}


class XliffError(UserError, ValueError):
    """An XLIFF file that cannot be read or translated as asked (one line)."""


def rounds(document: str, target: str | None = None, retranslate: bool = False) -> Rounds[str]:
    """The XLIFF `document` with its untranslated units translated into `target` (a
    language code; None: the file's own) (`mtkit.documents.rounds.Rounds`, one round);
    with `retranslate`, the units whose target a translator filled too (marked as
    machine translations like the others)."""
    xliff = Xliff.read(document, target, retranslate)
    translated = yield [run.text for run in xliff.runs if run.text]
    return xliff.written(iter(translated))


@dataclass
class Run:
    """The content of a source (or of one of its segments) to translate: the text the
    model reads (`text`, "" where it holds no letter or digit: it is copied as it is)
    and what `markup.finish` needs to put the translation back around its codes."""

    prepared: markup.Prepared
    source: str  # the content as written
    text: str

    @classmethod
    def of(cls, nodes: list, version: int) -> Run:
        coded = _coded(nodes, version)
        root = markup.Element("", "", "", coded)
        prepared = markup.Prepared(
            root, [coded], [markup.flatten(coded, markup.inline_roles(root))]
        )
        text = prepared.texts[0] if coded else ""
        source = "".join(n.raw() for n in nodes)
        return cls(prepared, source, text if any(c.isalnum() for c in text) else "")

    def translated(self, translations: Iterator[Translation]) -> str:
        """The content translated (the next of `translations`), or as it was."""
        if not self.text:
            return self.source
        return markup.finish(self.prepared, [next(translations)])


def _coded(nodes: list, version: int) -> list:
    """`nodes` (a source's content) as its run holds them: a code holding native code
    (1.2's `bpt`, `ept`, `ph`, `it`) and text not to be translated (1.2's
    `mrk mtype="protected"`; `translate="no"` is markup's own rule) as one atom, written
    as it stands; an element's children so judged; and each pair of codes that open and
    close (1.2's `bpt`/`ept`, 2.x's `sc`/`ec` and `sm`/`em`) as one element around what
    lies between them (`_paired`), so that placement keeps the closing one after the
    opening one, around the words they held."""
    out = []
    for node in nodes:
        if not isinstance(node, markup.Element) or isinstance(node, markup.Cdata):
            out.append(node)
            continue
        name = _local(node.start)
        if (version == 1 and name in NATIVE) or (name == "mrk" and PROTECTED.search(node.start)):
            out.append(markup.Raw(node.raw()))
        else:
            children = _coded(node.children, version)
            out.append(markup.Element(node.name, node.start, node.end, children))
    return _paired(out, version)


# An opening code: its closing one, and what names the pair on each (1.2: `rid` where
# both have one, else `id`; 2.x: the opening one's `id`, the closing one's `startRef`)
PAIRS = {
    1: {"bpt": ("ept", "id", "id"), "bx": ("ex", "id", "id")},
    2: {"sc": ("ec", "id", "startRef"), "sm": ("em", "id", "startRef")},
}


def _paired(nodes: list, version: int) -> list:
    """`nodes` with each opening code and the closing one that matches it among its
    later siblings (`PAIRS`) made one element (`PAIRED`: its tags are the two codes as
    written) holding the nodes between them; pairs nest as elements do (a closing code
    that would cross another pair, or has no opening one, stays an atom)."""
    out: list = []
    open_: list[tuple[str, str, str, int]] = []  # (closing name, its attribute, id, where)
    for node in nodes:
        raw = node.raw()
        name = _local(raw) if raw.startswith("<") and raw[1:2] not in "!?" else ""
        attributes = _attributes(raw) if name else {}
        if name in PAIRS[version] and attributes.get("isolated") != "yes":
            closing, mine, theirs = PAIRS[version][name]
            if "rid" in attributes:
                mine = theirs = "rid"
            if mine in attributes:
                open_.append((closing, theirs, attributes[mine], len(out)))
        elif open_ and name == open_[-1][0] and attributes.get(open_[-1][1]) == open_[-1][2]:
            at = open_.pop()[3]
            out[at:] = [markup.Element(PAIRED, out[at].raw(), raw, out[at + 1 :])]
            continue
        out.append(node)
    return out


PAIRED = "#paired"  # (the name of an element made of two codes: no element's name)
PROTECTED = re.compile(r"""\smtype\s*=\s*["']protected["']""")


@dataclass
class Job:
    """A target to write: its content from `pieces` (a `Run` for each source or segment
    translated, as written between them: a seg-source's `mrk` tags), written into the
    tree by `write`."""

    pieces: list  # str | Run
    write: Callable[[str], None]


class Xliff:
    """One XLIFF file being translated, in steps: `read` (`check` it, `pair` markup's
    tree with lxml's, `set_language`, `find_units`: the targets to write and the runs
    to translate), then `written` (each run's translation placed, each target written
    into the tree, the tree written out again)."""

    def __init__(self, document: str, target: str | None, retranslate: bool = False):
        self.document = document
        self.target = target
        self.retranslate = retranslate  # filled targets are translated again
        self.root = None  # lxml's root element
        self.namespace = ""  # the root's
        self.version = 1  # 1 or 2
        self.tree = markup.Element("", "")
        self.node_of: dict = {}  # lxml element -> markup's Element
        self.runs: list[Run] = []
        self.jobs: list[Job] = []

    @classmethod
    def read(cls, document: str, target: str | None, retranslate: bool = False) -> Xliff:
        xliff = cls(document, target, retranslate)
        xliff.check()
        xliff.pair()
        xliff.set_language()
        xliff.find_units(xliff.root, translate=True)
        return xliff

    # -- check: well-formed, safe, XLIFF -----------------------------------------------------

    def check(self) -> None:
        from lxml import etree

        if len(self.document) > MAX_CHARS:
            raise XliffError(
                f"the XLIFF file holds {len(self.document)} characters; mtkit reads files of "
                f"up to {MAX_CHARS}"
            )
        try:
            root = etree.fromstring(self.document.encode("utf-8"), safe_parser("utf-8"))
        except etree.XMLSyntaxError as e:
            line, column = e.position
            raise XliffError(
                f"the XLIFF is not well-formed: {e.msg} (line {line}, column {column})"
            ) from None
        dtd = root.getroottree().docinfo.internalDTD
        if dtd is not None and any(True for _ in dtd.iterentities()):
            raise XliffError(
                "the XLIFF's DOCTYPE declares entities; mtkit reads XLIFF without them"
            )
        namespace = etree.QName(root).namespace or ""
        version = root.get("version", namespace.removeprefix(NAMESPACE))
        if etree.QName(root).localname != "xliff" or not (
            namespace.startswith(NAMESPACE) or (not namespace and version.startswith("1."))
        ):
            raise XliffError(
                f"not an XLIFF file: its root element is <{etree.QName(root).localname}> "
                f"in namespace {namespace or 'none'}, not <xliff> in {NAMESPACE}..."
            )
        if version[:2] not in ("1.", "2."):
            raise XliffError(f"XLIFF version {version!r}: mtkit reads 1.x and 2.x")
        self.root, self.namespace, self.version = root, namespace, int(version[0])

    def pair(self) -> None:
        """Read the file into markup's tree (every character kept) and pair each of its
        elements with lxml's, in document order."""
        from lxml import etree

        try:
            self.tree = markup.parse(self.document, "xml")
        except markup.MarkupError as e:
            raise XliffError(str(e)) from None
        ours = [e for e in _elements(self.tree) if e is not self.tree]
        theirs = [e for e in self.root.iter() if isinstance(e.tag, str)]
        if len(ours) != len(theirs) or any(
            _local(a.start) != etree.QName(b).localname for a, b in zip(ours, theirs, strict=True)
        ):
            raise XliffError("the XLIFF could not be read whole: check its markup")
        self.node_of = dict(zip(theirs, ours, strict=True))

    # -- the target language -------------------------------------------------------------

    def set_language(self) -> None:
        """Each 1.2 `file`'s `target-language` (2.x: the root's `trgLang`) checked
        against the language translated into, written where missing."""
        if self.version == 1:
            holders = list(self.root.iterchildren(self._tag("file")))
            name, after = "target-language", "source-language"
        else:
            holders, name, after = [self.root], "trgLang", "srcLang"
        for holder in holders:
            given = holder.get(name)
            if given is None:
                if self.target:
                    node = self.node_of[holder]
                    node.start = _with_attributes(node.start, {name: self.target}, after)
            elif self.target and _primary(given) != _primary(self.target):
                raise XliffError(
                    f"the XLIFF's {name} is {given}, but this translates into {self.target}"
                )

    # -- find_units: the targets to write -------------------------------------------------

    def find_units(self, element, translate: bool) -> None:
        for child in element.iterchildren(tag=self._tag("*")):
            says = child.get("translate")
            go = translate if says is None else says != "no"
            local = child.tag.rpartition("}")[2]
            if self.version == 1 and local == "trans-unit":
                if go:
                    self.unit_1(child)
            elif self.version == 2 and local == "segment":
                if go:
                    self.segment_2(child)
            elif local in ("file", "group", "unit", "body"):
                self.find_units(child, go)

    def unit_1(self, unit) -> None:
        """A 1.2 trans-unit: its target from its source, or segment by segment from its
        seg-source."""
        source = unit.find(self._tag("source"))
        if source is None:
            return
        segmented = unit.find(self._tag("seg-source"))
        segments = (
            [m for m in segmented.iter(self._tag("mrk")) if m.get("mtype") == "seg"]
            if segmented is not None
            else []
        )
        if segments:
            self.add(unit, segmented, self.segmented(segmented, segments), MARKED_1, None)
        else:
            self.add(unit, source, [Run.of(self.node_of[source].children, 1)], MARKED_1, None)

    def segmented(self, segmented, segments) -> list:
        """A seg-source's content as pieces: the text between its segments (as written)
        and a `Run` for each segment's content, between its `mrk` tags."""
        wanted = {id(self.node_of[m]) for m in segments}
        pieces: list = []

        def walk(node) -> None:
            if id(node) in wanted:
                pieces.extend([node.start, Run.of(node.children, 1), node.end])
            elif isinstance(node, markup.Element) and not isinstance(node, markup.Cdata):
                pieces.append(node.start)
                for c in node.children:
                    walk(c)
                pieces.append(node.end)
            else:
                pieces.append(node.raw())

        for c in self.node_of[segmented].children:
            walk(c)
        return pieces

    def segment_2(self, segment) -> None:
        """A 2.x segment: its target from its source; the segment marked translated."""
        source = segment.find(self._tag("source"))
        if source is not None:
            runs = [Run.of(self.node_of[source].children, 2)]
            self.add(segment, source, runs, None, self.node_of[segment])

    def add(self, unit, after, pieces: list, attributes: dict | None, marked) -> None:
        """A target for `unit` (lxml), written after its `after` element (its source or
        seg-source), from `pieces` (`Run`s, and what is written between them): a new
        one, or the empty one it has. An empty target is one without text: none at all
        (`<target/>`), or only codes or empty segments (`<target><mrk mtype="seg"
        mid="1"/></target>`, as Trados prepares one), which is filled where the source
        has words to translate. None where its target has text (a translator's; with
        `retranslate` it is replaced too) or its source is empty. `attributes`: the
        target's marks (1.2); `marked`: the element that gets 2.x's (the segment)."""
        target = unit.find(self._tag("target"))
        runs = [p for p in pieces if isinstance(p, Run)]
        if (
            target is not None
            and not self.retranslate
            and (
                "".join(target.itertext()).strip()
                or (len(target) and not any(r.text for r in runs))
            )
        ):
            return
        if not any(run.text or run.source.strip() for run in runs):
            return
        if target is not None:
            write = _filled(self.node_of[target], attributes)
        else:
            write = _inserted(self.node_of[unit], self.node_of[after], attributes)
        if marked is not None:
            marked.start = _with_attributes(marked.start, MARKED_2)
        self.runs += runs
        self.jobs.append(Job(pieces, write))

    # -- written: the translations placed --------------------------------------------------

    def written(self, translations: Iterator[Translation]) -> str:
        """The file with every target written (`translations`: the runs' with text, in
        order)."""
        done = {id(run): run.translated(translations) for run in self.runs}
        for job in self.jobs:
            job.write("".join(done[id(p)] if isinstance(p, Run) else p for p in job.pieces))
        return self.tree.raw()

    def _tag(self, local: str) -> str:
        return f"{{{self.namespace}}}{local}" if self.namespace else local


def _filled(node: markup.Element, attributes: dict | None) -> Callable[[str], None]:
    """How the target `node` (empty, or a translator's to replace) gets its content (and
    `attributes`, its others kept)."""

    def write(content: str) -> None:
        start = _with_attributes(node.start, attributes or {})
        if not node.end:  # <target/>
            start = re.sub(r"\s*/>$", ">", start)
            node.end = f"</{_name(node.start)}>"
        node.start, node.children = start, [markup.Raw(content)]

    return write


def _inserted(
    parent: markup.Element, after: markup.Element, attributes: dict | None
) -> Callable[[str], None]:
    """How a new target is written into `parent` right after `after`: on a line of its
    own where `after` is on one (indented as `after` is, with the file's line end),
    with `after`'s namespace prefix."""
    at = next(k for k, c in enumerate(parent.children) if c is after)
    before = parent.children[at - 1] if at else None
    space = before.source if isinstance(before, markup.Text) and not before.source.strip() else ""
    if "\n" in space:
        space = ("\r\n" if "\r\n" in space else "\n") + space.rpartition("\n")[2]
    prefix = _name(after.start).rpartition(":")[0]
    name = f"{prefix}:target" if prefix else "target"
    marks = "".join(f' {k}="{v}"' for k, v in (attributes or {}).items())

    def write(content: str) -> None:
        parent.children.insert(at + 1, markup.Raw(f"{space}<{name}{marks}>{content}</{name}>"))

    return write


def _elements(node) -> list:
    """markup's elements in `node` (itself first), in document order (CDATA is none)."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, markup.Element) and not isinstance(n, markup.Cdata):
            out.append(n)
            stack.extend(reversed(n.children))
    return out


def _name(tag: str) -> str:
    """A tag's name as written: "<xlf:g id='1'>" -> "xlf:g"."""
    return NAME.match(tag).group(1)


NAME = re.compile(r"</?\s*([^\s/>]*)")


def _local(tag: str) -> str:
    """A start tag's element name without its prefix: "<xlf:g id='1'>" -> "g"."""
    return _name(tag).rpartition(":")[2]


def _primary(language: str) -> str:
    """A language code's language: "de-DE" -> "de"."""
    return re.split(r"[-_]", language.strip().lower())[0]


def _attributes(start: str) -> dict[str, str]:
    """A start tag's attributes, as written (entities and all)."""
    at = len(_name(start)) + 1
    return {m.group(2): m.group(4)[1:-1] for m in ATTRIBUTE.finditer(start, at)}


# An attribute of a start tag, its value whole (a quoted value holds no attribute)
ATTRIBUTE = re.compile(r"""(\s+)([^\s=/>]+)(\s*=\s*)("[^"]*"|'[^']*')""")


def _with_attributes(start: str, values: dict[str, str], after: str | None = None) -> str:
    """The start tag `start` with each of `values` set: an attribute it has keeps its
    place and quotes, with the new value; one it lacks is added after attribute `after`
    (where it has one), else after its last attribute. Every other character as written."""
    for name, value in values.items():
        value = html.escape(value)
        found = {m.group(2): m for m in ATTRIBUTE.finditer(start, len(_name(start)) + 1)}
        if name in found:
            quoted = found[name].span(4)
            start = start[: quoted[0] + 1] + value + start[quoted[1] - 1 :]
            continue
        at = found[after].end() if after in found else len(re.sub(r"\s*/?>$", "", start))
        start = start[:at] + f' {name}="{value}"' + start[at:]
    return start
