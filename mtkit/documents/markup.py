"""HTML and XML translated with their tags carried through.

A document is read into a tree (`parse`) with Python's own HTML parser, which hands back
each tag exactly as written (attribute quotes and order, entities), so the output holds
exactly the input's tags, byte for byte. Text to translate comes in runs: the text of a
block (a paragraph, a list item, a cell) with its inline tags (`<b>`, `<a href>`,
`<ph>`...) taken out; which elements are inline, blocks, nested or kept is
`mtkit.documents.elements`' (HTML's content model, ITS 2.0 rules, vocabularies' defaults,
the caller's `MarkupRules`), judged once per tree (`_Roles`). Each run is translated as
one line (sentence by sentence) with word alignments, and each inline element is put back
around the target words aligned to its source words (`place`), nested as it was; an
element whose words found no partner, and anything without words (`<br>`, `<img>`, a
comment, `<code>` inside a sentence, a nested element such as a footnote, its own text
translated on its own), goes where its neighbouring word went. `<code>`, `<pre>`,
`<script>`, `<style>`, `translate="no"` (and ITS' `its:translate="no"` and translate
rules), comments, declarations (a DOCTYPE with its internal subset) and processing
instructions are kept untouched, each whole whatever `>` it holds. XML is a document (an
XML declaration or a DOCTYPE, one root) or a fragment (a segment: the content of an
implied element, text and elements side by side, no declaration); either must be
well-formed (one line where it is not, its line and column the text's own). A CDATA
section's text is translated as text (inline, as `<b>` is) and written back as CDATA; in
HTML a misnested or stray tag is kept as it stands, with a warning that the parse is a
best effort.
"""

from __future__ import annotations

import html
import logging
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from itertools import pairwise

from mtkit.core.errors import OptionError, UserError
from mtkit.core.translation import Anchored, Translation
from mtkit.documents import elements
from mtkit.documents.elements import BLOCK, INLINE, NESTED, PLAIN, MarkupRules
from mtkit.documents.placeholders import NUMBER, PLACEHOLDER, restore_numbers

log = logging.getLogger(__name__)

VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
KEPT = frozenset("code pre script style textarea kbd samp var".split())  # never translated
BREAKS = frozenset({"br", "hr"})  # words on either side are two words
# Elements whose end tag HTML lets a writer leave out: closed by a sibling's start, or by
# their parent's end, without a warning.
OPTIONAL_END = frozenset(
    "li dt dd p option optgroup tr td th thead tbody tfoot colgroup rt rp html head body".split()
)
CLOSES_SIBLING = {
    "li": {"li"},
    "dt": {"dt", "dd"},
    "dd": {"dt", "dd"},
    "p": {"p"},
    "option": {"option"},
    "tr": {"tr"},
    "td": {"td", "th"},
    "th": {"td", "th"},
}
WORD = re.compile(r"\S+")
PUNCT = ".,:!?…»«\"')"  # not ";", which ends an escaped "&amp;"


class MarkupError(UserError, ValueError):
    """A document that cannot be read as the format it was given as (one line)."""


@dataclass
class Element:
    name: str
    start: str  # the start tag as written
    end: str = ""  # the end tag as written ("" for a void or self-closed element, or none)
    children: list = field(default_factory=list)  # Element | Text | Raw

    def raw(self) -> str:
        return self.start + "".join(c.raw() for c in self.children) + self.end


# An element's own say: translate="no" (HTML's, XHTML's), its:translate="no"/"yes" and
# its:withinText="yes"/"no"/"nested" (ITS 2.0's local markup).
TRANSLATE = re.compile(r"""\s(?:its:)?translate\s*=\s*["']?(yes|no)\b""", re.I)
WITHIN_TEXT = re.compile(r"""\sits:withinText\s*=\s*["'](yes|no|nested)["']""")


@dataclass
class Text:
    source: str  # as written, entities and all

    def raw(self) -> str:
        return self.source

    @property
    def text(self) -> str:
        return html.unescape(self.source)


@dataclass
class Raw:
    """A comment, a declaration, a processing instruction, CDATA in HTML (a bogus
    comment there), a stray end tag."""

    source: str

    def raw(self) -> str:
        return self.source


class Cdata(Element):
    """A CDATA section in XML: its text is translated as text (a `Text` child, held
    escaped as text between tags is), the section kept around it (`_cdata_written`)."""

    def __init__(self, content: str):
        super().__init__("#cdata", CDATA_OPEN, CDATA_CLOSE, [Text(html.escape(content, False))])

    def raw(self) -> str:
        return self.start + html.unescape(self.children[0].raw()) + self.end


CDATA_OPEN, CDATA_CLOSE = "<![CDATA[", "]]>"
MAX_DEPTH = 128  # elements open at once: deeper documents are refused, in one line


class _Reader(HTMLParser):
    """Python's HTML parser, keeping each construct exactly as written: a handler adds its
    node with a guess at its text, and the parser's next `updatepos(i, j)`, which it calls
    right after with the span the construct took, gives the node its text, rawdata[i:j]
    (an entity without its ";", a bogus comment, CDATA, a DOCTYPE as they stand)."""

    def __init__(self, xml: bool):
        super().__init__(convert_charrefs=False)
        self.xml = xml
        self.root = Element("", "")
        self.open = [self.root]
        self.problems: list[str] = []
        self._exact: Callable[[str], None] | None = None
        self._run_node: Text | None = None  # the text being read, and its pieces so far
        self._run: list[str] = []

    def updatepos(self, i: int, j: int) -> int:
        if self._exact is not None and j > i:
            self._exact(self.rawdata[i:j])
        self._exact = None
        return super().updatepos(i, j)

    def parse_html_declaration(self, i: int) -> int:
        """A DOCTYPE ends at the ">" after its internal subset, whose declarations,
        quoted values and comments may hold a ">" (HTML's parser ends it at the first);
        in XML a CDATA section is one (`Cdata`), ended by the first "]]>". A "<![" that
        opens no section Python's parser knows is a bogus comment in HTML, one line in
        XML (where that parser raised an AssertionError)."""
        rawdata = self.rawdata
        if rawdata[i : i + 9].lower() == "<!doctype":
            end = _doctype_end(rawdata, i + 9)
            if end < 0 and not self.xml:  # (HTML's own: to the first ">")
                return super().parse_html_declaration(i)
            if end > 0:
                self.handle_decl(rawdata[i + 2 : end - 1])
            return end
        if self.xml and rawdata.startswith(CDATA_OPEN, i):
            end = rawdata.find(CDATA_CLOSE, i + len(CDATA_OPEN))
            if end > 0:
                self._add(Cdata(rawdata[i + len(CDATA_OPEN) : end]))
                return end + len(CDATA_CLOSE)
            return -1
        try:
            return super().parse_html_declaration(i)
        except AssertionError:  # "<![" with no known keyword after it: "<![foo[", "<![ x"
            if self.xml:
                raise MarkupError(
                    f"the XML is not well-formed: {rawdata[i : i + 20]!r} is no CDATA section"
                ) from None
            return self.parse_bogus_comment(i)  # (as HTML reads it: to the first ">")

    def parse_pi(self, i: int) -> int:
        """A processing instruction ends at "?>" (its data may hold a ">": `<?php if
        ($a > 1) ?>`); in HTML, one without a "?>" ends at the first ">", as HTML's own
        parser ends every one."""
        end = self.rawdata.find("?>", i + 2)
        if end < 0:
            return -1 if self.xml else super().parse_pi(i)
        self.handle_pi(self.rawdata[i + 2 : end + 1])
        return end + 2

    def set_cdata_mode(self, elem, **kwargs):
        if not self.xml:  # in XML a script or a style holds elements like any other
            super().set_cdata_mode(elem, **kwargs)

    def _add(self, node):
        """Add `node` to the open element; a text next to a text joins it (entities arrive
        as pieces of one text: the pieces are kept in a list, `_run`, and joined once by
        `_end_run`, so a text of n entities is read in time linear in n). Returns the
        node that holds it."""
        children = self.open[-1].children
        if isinstance(node, Text) and children and children[-1] is self._run_node:
            self._run.append(node.source)
            return self._run_node
        self._end_run()
        children.append(node)
        if isinstance(node, Text):
            self._run_node, self._run = node, [node.source]
        return node

    def _end_run(self) -> None:
        """The text being read gets its pieces, joined."""
        if self._run_node is not None:
            self._run_node.source = "".join(self._run)
            self._run_node, self._run = None, []

    def _text(self, guess: str) -> None:
        self._add(Text(guess))
        run, at = self._run, len(self._run) - 1

        def exact(raw: str) -> None:
            run[at] = raw

        self._exact = exact

    def _raw(self, guess: str) -> None:
        node = self._add(Raw(guess))
        self._exact = lambda raw: setattr(node, "source", raw)

    def handle_starttag(self, tag, attrs):
        if not self.xml and self.open[-1].name in CLOSES_SIBLING.get(tag, ()):
            self.open.pop()  # <li>one<li>two: the first ends where the second starts
        element = Element(tag, self.get_starttag_text() or "")
        self._add(element)
        if self.xml or tag not in VOID:
            self.open.append(element)
            if len(self.open) > MAX_DEPTH:
                raise MarkupError(
                    f"the document nests elements more than {MAX_DEPTH} deep; mtkit reads "
                    "documents up to that depth"
                )

    def handle_startendtag(self, tag, attrs):
        self._add(Element(tag, self.get_starttag_text() or ""))

    def handle_endtag(self, tag):
        names = [e.name for e in self.open[1:]]
        if tag not in names:
            self.problems.append(f"a stray end tag </{tag}>")
            self._raw(f"</{tag}>")
            return
        if names[-1] != tag and (self.xml or names[-1] not in OPTIONAL_END):
            self.problems.append(f"</{tag}> closes <{names[-1]}>, which was left open")
        while self.open[-1].name != tag:
            self.open.pop()
        element = self.open.pop()
        element.end = f"</{tag}>"

        def exact(raw: str) -> None:
            element.end = raw
            if self.xml and _name(raw) != _name(element.start):
                self.problems.append(f"{raw} closes {element.start} (names differ in case)")

        self._exact = exact

    def handle_data(self, data):
        self._add(Text(data))

    def handle_entityref(self, name):
        if self.xml and html.unescape(f"&{name};") == f"&{name};":  # the document's own
            self._raw(f"&{name};")  # entity, kept as it stands (an atom in its run)
        else:
            self._text(f"&{name};")

    def handle_charref(self, name):
        self._text(f"&#{name};")

    def handle_comment(self, data):
        self._raw(f"<!--{data}-->")

    def handle_decl(self, decl):
        self._raw(f"<!{decl}>")

    def handle_pi(self, data):
        self._raw(f"<?{data}>")

    def unknown_decl(self, data):
        self._raw(f"<![{data}]]>")


def _doctype_end(text: str, at: int) -> int:
    """Where the DOCTYPE whose name starts at `at` in `text` ends (just after its ">"),
    or -1 where it does not: a ">" in a quoted value, or anywhere in the internal subset
    ("[...]": its declarations, comments and processing instructions, its parameter
    entities), does not end it."""
    subset = False
    while at < len(text):
        skipped = ('"', "'", "<!--", "<?") if subset else ('"', "'")
        opening = next((x for x in skipped if text.startswith(x, at)), "")
        if opening:  # to the end of what it opens
            close = text.find(SKIPPED[opening], at + len(opening))
            if close < 0:
                return -1
            at = close + len(SKIPPED[opening])
            continue
        if text[at] in "[]":
            subset = text[at] == "["
        elif text[at] == ">" and not subset:
            return at + 1
        at += 1
    return -1


SKIPPED = {'"': '"', "'": "'", "<!--": "-->", "<?": "?>"}  # in a DOCTYPE: what ends each


def _name(tag: str) -> str:
    """A tag's name as written: "<Doc a='1'>" -> "Doc"."""
    match = re.match(r"</?\s*([^\s/>]+)", tag)
    return match.group(1) if match else ""


def parse(document: str, format: str) -> Element:
    """The document as a tree whose `raw()` is the document again, character for
    character. XML must be well-formed (a `MarkupError` says where it is not)."""
    reader = _Reader(xml=format == "xml")
    reader.feed(document)
    rest = reader.rawdata  # what the parser could not finish: an unterminated construct
    if "<" in rest:
        start = rest[rest.index("<") :]
        raise MarkupError(
            f"the {format.upper()} ends inside an unterminated tag or comment: {start[:40]!r}"
        )
    reader.close()
    reader._end_run()
    left = [e.name for e in reader.open[1:]]
    if format == "xml" and (reader.problems or left):
        why = reader.problems[0] if reader.problems else f"<{left[-1]}> is never closed"
        raise MarkupError(f"the XML is not well-formed: {why}")
    if reader.problems:
        log.warning("the HTML is read as best it can be: %s", reader.problems[0])
    tree = reader.root
    if tree.raw() != document:  # the parser dropped something (an unterminated construct)
        raise MarkupError(
            f"the {format.upper()} could not be read whole: check for an unterminated tag "
            "or comment"
        )
    if format == "xml":
        _check_xml(document, tree)  # (after the reader's own, more particular, messages)
    return tree


def _check_xml(document: str, tree: Element) -> None:
    """A `MarkupError` where `document` (read as `tree`) is not well-formed XML, by an
    XML parser's rules (expat's): entities declared (in a fragment, XML's five and
    character references), attributes unique, `&` and `<` escaped in text, and, in a
    document (`_is_document`: an XML declaration or a DOCTYPE), one root. The tree is
    read by Python's HTML parser, which keeps every character as written but judges none
    of these. A document without an element (only a declaration, comments, whitespace)
    has nothing to translate: it is kept as it is, as an empty text in a batch is."""
    from xml.parsers import expat

    fragment = not _is_document(tree)
    parser = expat.ParserCreate()
    try:
        if fragment:  # the content of an implied element, which the error's place leaves out
            parser.Parse(FRAGMENT_OPEN, False)
        parser.Parse(document, not fragment)
        if fragment:
            parser.Parse(FRAGMENT_CLOSE, True)
    except expat.ExpatError as e:
        no_element = expat.errors.codes[expat.errors.XML_ERROR_NO_ELEMENTS]
        if e.code == no_element and not any(isinstance(c, Element) for c in tree.children):
            return
        lines = XML_LINES.split(document)  # (as expat counts them: \u2028 ends none)
        number, column = e.lineno, e.offset
        if fragment and number == 1:
            column -= len(FRAGMENT_OPEN)
        if number > len(lines):  # (in the implied element's end: at the text's end)
            number, column = len(lines), len(lines[-1])
        line = lines[number - 1] if number > 0 else ""
        raise MarkupError(
            f"the XML is not well-formed: {expat.ErrorString(e.code)}: line {number}, "
            f"column {max(column, 0)} ({line.strip()[:40]!r})"
        ) from None


# The implied element a fragment is the content of (ITS' prefix declared in it, as
# segments use it undeclared); checked inside it, and read so by lxml (`_Roles`).
FRAGMENT_OPEN = f'<mtkit-fragment xmlns:its="{elements.ITS}">'
FRAGMENT_CLOSE = "</mtkit-fragment>"
XML_DECLARATION = re.compile(r"<\?xml[\s?]")


def _is_document(tree: Element) -> bool:
    """Whether XML read as `tree` is a document, not a fragment: it starts with an XML
    declaration or holds a DOCTYPE (neither can stand inside an element)."""
    return any(
        isinstance(c, Raw) and (XML_DECLARATION.match(c.source) or c.source.startswith("<!DOCTYPE"))
        for c in tree.children
    )


XML_LINES = re.compile(r"\r\n|\r|\n")  # what ends a line in XML


# ---- runs: a block's text with its inline tags taken out ---------------------------------


class _Roles:
    """Each element of one tree judged once (`mtkit.documents.elements`): whether it is
    kept untranslated, and its role, inline, block or nested, by the first that names it
    of: its own ITS attribute (XML), the caller's tag lists (DeepL's), the caller's ITS
    rules file, the document's `its:rules` (XML), the caller's outline_detection=False
    (inline), the vocabulary's defaults (HTML's content model; in XML DITA's, DocBook's
    or XHTML's), and in XML whether it stands in running text. And, by id, the elements
    found to hold words or to sit whole inside a run, so that each is asked once however
    many elements it lies in."""

    def __init__(self, tree: Element, xml: bool, rules: MarkupRules = PLAIN):
        self.xml = xml
        self.rules = rules
        self.roles: dict[int, str] = {}
        self.kept_ids: set[int] = set()
        self.worded: dict[int, bool] = {}
        self.inlined: dict[int, bool] = {}
        if rules.its_rules and not xml:
            option = rules.spelled("its_rules")
            raise OptionError(
                f"{option} is for xml documents (HTML's elements are judged by its content model)",
                option,
            )
        order = [(e, parent) for e, parent in _elements(tree) if not isinstance(e, Cdata)]
        within, translate = self._its(tree, [e for e, _ in order]) if xml else ({}, {})
        vocabulary = self._vocabulary(tree) if xml else None
        for at, (element, parent) in enumerate(order):
            role = self._role(element, within.get(at), vocabulary)
            if role is None:  # nothing names it: inline where it stands in running text
                role = INLINE if _in_running_text(parent) else BLOCK
            self.roles[id(element)] = role
            if self._kept(element, translate.get(at), vocabulary):
                self.kept_ids.add(id(element))

    def _vocabulary(self, tree: Element) -> elements.Vocabulary | None:
        first = next((c.start for c in tree.children if isinstance(c, Element)), "")
        top = [c.source for c in tree.children if isinstance(c, Raw)]
        doctype = next((x for x in top if x.startswith("<!DOCTYPE")), "")
        return elements.vocabulary(first, doctype)

    def _its(self, tree: Element, order: list[Element]) -> tuple[dict, dict]:
        """The withinText and translate values ITS rules give elements (by their place in
        `order`): the document's own `its:rules`, then the caller's (a later rule wins)."""
        document = tree.raw()
        if not self.rules.its_rules and elements.ITS not in document:
            return {}, {}
        etree = elements.lxml_etree()

        fragment = not _is_document(tree)
        text = FRAGMENT_OPEN + document + FRAGMENT_CLOSE if fragment else document
        try:
            # (the text's UTF-8, whatever encoding its declaration names: it was read already)
            root = etree.fromstring(text.encode("utf-8"), elements.safe_parser("utf-8"))
        except etree.XMLSyntaxError as e:  # (well-formed, but its namespaces are not)
            log.warning("the XML's ITS rules are left out: %s", e)
            root = None
        if root is None:
            return {}, {}
        found = [e for e in root.iter() if isinstance(e.tag, str)][1 if fragment else 0 :]
        if len(found) != len(order):
            log.warning("the XML's ITS rules are left out: its elements could not be matched")
            return {}, {}
        place = {e: k for k, e in enumerate(found)}
        try:
            own = elements.ItsRule.read(root, "the document's its:rules")
        except ValueError as e:
            raise MarkupError(str(e)) from None
        plain = [r for r in own if elements.PLAIN_SELECTOR.fullmatch(r.selector)]
        if len(plain) < len(own) or len(plain) > elements.MAX_DOCUMENT_RULES:
            log.warning(
                "the document's ITS rules are read up to %d whose selectors are paths of "
                "names (//ph, //*[@code]); %d left out",
                elements.MAX_DOCUMENT_RULES,
                len(own) - len(plain[: elements.MAX_DOCUMENT_RULES]),
            )
        own = tuple(plain[: elements.MAX_DOCUMENT_RULES])
        within: dict[int, str] = {}
        translate: dict[int, str] = {}
        for rule in (*own, *self.rules.its_rules):
            try:
                matched = root.xpath(rule.selector, namespaces=dict(rule.namespaces))
            except etree.XPathError as e:  # (a prefix the document does not declare)
                log.warning("the ITS rule %r is left out: %s", rule.selector, e)
                continue
            values = within if rule.kind == "withinText" else translate
            for e in matched if isinstance(matched, list) else ():
                if e in place:
                    values[place[e]] = rule.value
        return within, translate

    def _name(self, element: Element) -> str:
        """`element`'s name: in XML as written (its case is its own), in HTML in lower case."""
        return _name(element.start) if self.xml else element.name

    def _role(self, element: Element, its: str | None, vocabulary) -> str | None:
        own = WITHIN_TEXT.search(element.start) if self.xml else None
        if own:
            return elements.WITHIN_TEXT[own.group(1)]
        named = self.rules.role(self._name(element))
        if named:
            return named
        if its:
            return elements.WITHIN_TEXT[its]
        if not self.rules.outline_detection:
            return INLINE
        local = self._name(element).rpartition(":")[2]
        if not self.xml or vocabulary is None:  # HTML's content model (XHTML's too)
            return BLOCK if local in elements.HTML_BLOCKS else INLINE
        return vocabulary.role(local)

    def _kept(self, element: Element, its: str | None, vocabulary) -> bool:
        own = TRANSLATE.search(element.start)
        if own:
            return own.group(1).lower() == "no"
        name = self._name(element)
        if self.rules.ignored(name):
            return True
        if its:
            return its == "no"
        local = name.rpartition(":")[2]
        if self.xml and name.startswith("its:") and local == "rules":
            return True  # (ITS' rules are about the document, not in it)
        return local in KEPT or (vocabulary is not None and local in vocabulary.kept)

    def kept(self, node) -> bool:
        return id(node) in self.kept_ids

    def role(self, node) -> str:
        return self.roles.get(id(node), INLINE)  # (CDATA's text is text, inline)

    def inline(self, node) -> bool:
        """Whether `node` belongs in the run of text around it: not a block, and holding
        no block (a nested element's own text is a run of its own; kept code is whole)."""
        if not isinstance(node, Element):
            return True
        if id(node) not in self.inlined:
            role = self.role(node)
            self.inlined[id(node)] = role != BLOCK and (
                role == NESTED
                or node.name in VOID
                or self.kept(node)
                or all(self.inline(c) for c in node.children)
            )
        return self.inlined[id(node)]

    def has_words(self, node) -> bool:
        """Whether `node` holds text of its run worth translating: a letter or a digit
        (punctuation, a symbol, a zero-width space alone are kept as they are); a kept or
        nested element holds none of its run's."""
        if isinstance(node, Text):
            return any(c.isalnum() for c in node.text)
        if not isinstance(node, Element) or self.kept(node) or self.role(node) == NESTED:
            return False
        if id(node) not in self.worded:
            self.worded[id(node)] = any(self.has_words(c) for c in node.children)
        return self.worded[id(node)]


def _elements(tree: Element) -> list[tuple[Element, Element]]:
    """Every element under `tree` with its parent, in document order."""
    out: list[tuple[Element, Element]] = []
    stack = [(c, tree) for c in reversed(tree.children)]
    while stack:
        node, parent = stack.pop()
        if isinstance(node, Element):
            out.append((node, parent))
            stack.extend((c, node) for c in reversed(node.children))
    return out


def _in_running_text(parent: Element) -> bool:
    """Whether `parent` holds text of its own (not blank) beside its elements: an element
    there stands in running text."""
    return any(
        (isinstance(c, Text) and c.text.strip())
        or (isinstance(c, Cdata) and c.children[0].text.strip())
        or (isinstance(c, Raw) and c.source.startswith("&"))
        for c in parent.children
    )


@dataclass
class Mark:
    """An inline element (or an atom: a void tag, a comment, kept code) in a run: the
    characters of the run's text it covers, and its marks inside."""

    node: object
    start: int
    end: int
    atom: bool
    inner: list[Mark] = field(default_factory=list)
    glued: tuple[bool, bool] = (False, False)  # no space before it, after it


def flatten(nodes: list, roles: _Roles) -> tuple[str, list[Mark]]:
    """The text of a run of inline nodes (entities decoded) and its marks, outermost first
    (an element holding none of the run's words, as kept code or a footnote, an atom)."""
    flat = _Flattener(roles)
    marks = flat.walk(nodes)
    text = "".join(flat.parts)
    _glue(marks, text)
    return text, marks


class _Flattener:
    """A run's text as it is written out (`parts`, `length` characters so far), and the
    tree's `roles` (which elements hold words of the run)."""

    def __init__(self, roles: _Roles) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.roles = roles

    def write(self, text: str) -> None:
        self.parts.append(text)
        self.length += len(text)

    def walk(self, children: list) -> list[Mark]:
        marks: list[Mark] = []
        for node in children:
            at = self.length
            if isinstance(node, Text):
                text = node.text
                last = 0
                for m in PLACEHOLDER.finditer(text):  # a placeholder is an atom
                    self.write(text[last : m.start()])
                    placeholder = Raw(html.escape(m.group(), quote=False))
                    marks.append(Mark(placeholder, self.length, self.length, True))
                    last = m.end()
                self.write(text[last:])
            elif isinstance(node, Element) and self.roles.has_words(node):
                inner = self.walk(node.children)
                marks.append(Mark(node, at, self.length, False, inner))
            else:
                if isinstance(node, Element) and node.name in BREAKS:
                    # the words either side are two; the mark holds this space, and
                    # the characters beyond it say whether the break touched them
                    self.write(" ")
                marks.append(Mark(node, at, self.length, True))
        return marks


def _glue(marks: list[Mark], text: str) -> None:
    """Record, for each mark, whether text or another atom (`{a}{b}`, `<br><br>`)
    touches it on either side in the source."""

    def touches(i: int) -> bool:
        return 0 <= i < len(text) and not text[i].isspace()

    every = _every(marks)
    for m in every:
        m.glued = (touches(m.start - 1), touches(m.end))
    atoms = [m for m in every if m.atom]
    for a, b in pairwise(atoms):
        if a.end == b.start:
            a.glued, b.glued = (a.glued[0], True), (True, b.glued[1])


def _every(marks: list[Mark]) -> list[Mark]:
    """`marks` and the marks inside them, in document order."""
    out: list[Mark] = []
    stack = [iter(marks)]
    while stack:
        mark = next(stack[-1], None)
        if mark is None:
            stack.pop()
        else:
            out.append(mark)
            stack.append(iter(mark.inner))
    return out


def runs(tree: Element, roles: _Roles) -> list[list]:
    """The runs of the tree to translate, in document order (a nested element's own
    before the run it stands in, which is written with them: `_nested_written`): lists
    of sibling nodes."""
    found: list[list] = []

    def visit(element: Element) -> None:
        if roles.kept(element):
            return
        run: list = []
        for child in element.children:
            if roles.inline(child):
                run.append(child)
                continue
            flush(run)
            run = []
            if isinstance(child, Element):
                visit(child)
        flush(run)

    def flush(run: list) -> None:
        for node in run:
            for nested in _nested_in(node, roles):
                visit(nested)
        if run:
            found.append(run)

    visit(tree)
    return [r for r in found if any(roles.has_words(n) for n in r)]


def _nested_in(node, roles: _Roles) -> list[Element]:
    """The nested elements (a footnote: a text of its own) in inline `node`, outermost."""
    if not isinstance(node, Element) or roles.kept(node):
        return []
    if roles.role(node) == NESTED:
        return [node]
    return [n for c in node.children for n in _nested_in(c, roles)]


# ---- placing tags around the target words ------------------------------------------------


def _words(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in WORD.finditer(text)]


LETTER = re.compile(r"[^\W_]")  # a character that str.isalnum() holds true of


def place(text: str, marks: list[Mark], translation: Translation) -> str:
    """The translation of a run with its marks put back: each element around the target
    words aligned to the source words it covered (clamped into its parent, kept off its
    earlier siblings; around all of its parent's target words where it held all of its
    parent's source words), each atom before the target word of the source word it
    preceded."""
    return _Placement(text, marks, translation).restore(marks)


class _Placement:
    """One run's marks put back around its translation (`restore`), in two steps over what
    this holds: `layout` (each mark's target words, outermost first) and `render` (the
    target words written out with the tags between them, into `pieces`). It holds the
    source words (spans of the run's text, a kept word cut where a mark cuts it), the
    target words and the links between them, and lookups made once over them, so that
    each question a step asks of the words (which a mark covers, the nearest linked word,
    where the letters are) takes constant or logarithmic time however long the run is."""

    def __init__(self, text: str, marks: list[Mark], translation: Translation):
        target = translation.text.split()
        links = [(s, t) for s, t in translation.alignment or () if t < len(target)]
        self.text = text
        self.src_words, self.target, self.joined, links = _cut_kept_words(
            text, marks, target, links
        )
        self.partners: dict[int, set[int]] = {}
        for s, t in links:
            self.partners.setdefault(s, set()).add(t)
        self.bounds = {s: (min(ts), max(ts)) for s, ts in self.partners.items()}
        self.starts = [a for a, _ in self.src_words]
        self.ends = [b for _, b in self.src_words]
        self.starting_at = {a: s for s, a in enumerate(self.starts)}
        self.ending_at = {b: s for s, b in enumerate(self.ends)}
        # the first linked source word at or after each word, and the last one before it
        n = len(self.src_words)
        self.linked_from: list[int | None] = [None] * (n + 1)
        self.linked_before: list[int | None] = [None] * (n + 1)
        for w in range(n - 1, -1, -1):
            self.linked_from[w] = w if w in self.partners else self.linked_from[w + 1]
        for w in range(1, n + 1):
            linked = w - 1 in self.partners
            self.linked_before[w] = w - 1 if linked else self.linked_before[w - 1]
        self.letters = [m.start() for m in LETTER.finditer(text)]  # all in words
        self.densest_of: dict[tuple[int, int], tuple[int, int] | None] = {}
        self.pieces: list[str] = []
        self.spaced = False  # a word was written and no space since

    def restore(self, marks: list[Mark]) -> str:
        end = len(self.target)
        self.render(self.layout(marks, 0, end, range(len(self.src_words))), 0, end)
        return "".join(self.pieces)

    # -- layout: each mark's target words ---------------------------------------------------

    def layout(
        self, children: list[Mark], lo: int, hi: int, words: range
    ) -> list[tuple[Mark, int, int, list]]:
        """Each child's target words, in target order, none overlapping the one before. A
        child that holds all its parent's source `words` holds all the parent's target
        words (alignments miss words, and a model adds some): its siblings go to the edge
        on their side of it."""
        whole = next((m for m in children if not m.atom and self.holds_all(m, words)), None)
        spans = sorted(
            ((self.where(m, whole, lo, hi), k, m) for k, m in enumerate(children)),
            key=lambda x: (x[0][0], x[0][1] > x[0][0], x[1]),
        )
        out, floor = [], lo
        for (start, stop), _, mark in spans:
            if out and self.yields(out[-1], mark, start, stop, floor):
                # the sibling before ends with this one's only words: it gives them up
                last, first = out[-1][0], out[-1][1]
                out[-1] = (
                    last,
                    first,
                    start,
                    self.layout(last.inner, first, start, self.covered(last)),
                )
                floor = start
            start = max(start, floor)
            stop = max(stop, start)
            out.append(
                (mark, start, stop, self.layout(mark.inner, start, stop, self.covered(mark)))
            )
            floor = stop
        return out

    @staticmethod
    def yields(before: tuple, mark: Mark, start: int, stop: int, floor: int) -> bool:
        """Whether the sibling laid out `before` gives its last target words up to
        `mark`, whose words are [start, stop): where they are the end of the sibling's
        (the two source words linked to the same target word), which keeps words of its
        own before them, and `mark` would be left without any otherwise."""
        last, first = before[0], before[1]
        return not mark.atom and not last.atom and first < start < stop == floor == before[2]

    def where(self, mark: Mark, whole: Mark | None, lo: int, hi: int) -> tuple[int, int]:
        if whole is None:
            return self.span(mark, lo, hi)
        if mark is whole:
            return lo, hi
        edge = lo if mark.end <= whole.start else hi
        return edge, edge

    def span(self, mark: Mark, lo: int, hi: int) -> tuple[int, int]:
        """Target words [start, stop) for `mark`, inside [lo, hi)."""
        run = None if mark.atom else self.densest(self.covered(mark))
        if run is None:
            at = self.anchor(bisect_left(self.starts, mark.start))
            at = min(max(at, lo), hi)
            return at, at
        first, last = run
        start, stop = max(first, lo), min(last + 1, hi)
        return (start, stop) if start < stop else (min(start, hi), min(start, hi))

    def covered(self, mark: Mark) -> range:
        """The source words `mark` covers a character of."""
        return range(bisect_right(self.ends, mark.start), bisect_left(self.starts, mark.end))

    def densest(self, words: range) -> tuple[int, int] | None:
        """The densest run of the target words linked to source `words` (`_densest`), or
        None where none is linked; worked out once for each range of words (the marks
        inside one word all cover that word)."""
        key = (words.start, words.stop)
        if key not in self.densest_of:
            aligned = sorted({t for s in words for t in self.partners.get(s, ())})
            self.densest_of[key] = _densest(aligned) if aligned else None
        return self.densest_of[key]

    def anchor(self, word: int) -> int:
        """Where the gap before source word `word` falls in the target."""
        at = min(word, len(self.src_words))
        after, before = self.linked_from[at], self.linked_before[at]
        if after is not None:
            return self.bounds[after][0]
        if before is not None:
            return self.bounds[before][1] + 1
        return 0 if word == 0 else len(self.target)

    def holds_all(self, mark: Mark, words: range) -> bool:
        """Whether `mark` holds every letter and digit of source `words` (its parent's)."""
        if not words:
            return False
        first = bisect_left(self.letters, self.starts[words.start])
        stop = bisect_left(self.letters, self.ends[words.stop - 1])
        return (
            first < stop and mark.start <= self.letters[first] and self.letters[stop - 1] < mark.end
        )

    # -- render: the target words with the tags between them -------------------------------

    def render(self, laid: list, lo: int, hi: int) -> None:
        at = lo
        for mark, start, stop, inner in laid:
            for t in range(at, start):
                self.word(t)
            at = max(at, start)
            node = mark.node
            left, right = self.glue(mark, start) if start == stop else (False, False)
            if mark.atom:
                self.opening(node.raw(), left)
                self.spaced = not right
                continue
            self.opening(node.start, left or (start < stop and self.joined[start]))
            self.render(inner, start, stop)
            self.close(mark)
            if start == stop:  # no words: it keeps the source's spacing, as an atom does
                self.spaced = not right
            at = max(at, stop)
        for t in range(at, hi):
            self.word(t)

    def word(self, t: int) -> None:
        if self.spaced and not self.joined[t]:
            self.pieces.append(" ")
        self.pieces.append(html.escape(self.target[t], quote=False))
        self.spaced = True

    def opening(self, raw: str, glued: bool = False) -> None:
        if self.spaced and not glued:
            self.pieces.append(" ")
        self.spaced = False
        self.pieces.append(raw)

    def close(self, mark: Mark) -> None:
        """Close an element: punctuation that ends its target words but not its source
        text goes after the end tag."""
        moved = ""
        if self.pieces and not self.ends_in_punctuation(mark):
            last = self.pieces[-1]
            stripped = last.rstrip(PUNCT)
            if stripped and stripped != last:
                self.pieces[-1], moved = stripped, last[len(stripped) :]
        self.pieces.append(mark.node.end + moved)

    def ends_in_punctuation(self, mark: Mark) -> bool:
        """Whether the source text `mark` covers ends, spaces aside, in punctuation: its
        last character that is not a space is the last one of the last word (or piece)
        that starts inside it."""
        w = bisect_left(self.starts, mark.end) - 1
        if w < 0:
            return False
        last = min(self.ends[w], mark.end) - 1
        return last >= mark.start and self.text[last] in PUNCT

    def glue(self, mark: Mark, at: int) -> tuple[bool, bool]:
        """Whether `mark`, with no target words of its own, touches the target words
        before and after `at` as it touched the source's: only a partner of the source
        word it touched, ending (before it) or starting (after it) as that word did, with
        a letter or digit or not (`{x}.` is not glued to "den" of "den Händen.")."""
        left, right = mark.glued
        before, after = self.ending_at.get(mark.start), self.starting_at.get(mark.end)
        if before is not None:
            left = left and self.alike(before, at - 1, -1)
        if after is not None:
            right = right and self.alike(after, at, 0)
        return left, right

    def alike(self, s: int, t: int, side: int) -> bool:
        a, b = self.src_words[s]
        return t in self.partners.get(s, ()) and (
            self.text[a:b][side].isalnum() == self.target[t][side].isalnum()
        )


def _cut_kept_words(
    text: str, marks: list[Mark], target: list[str], links: list[tuple[int, int]]
) -> tuple[list[tuple[int, int]], list[str], list[bool], list[tuple[int, int]]]:
    """The source words (spans of `text`), the target words, whether each target word
    joins the one before, and the links between them; a word the translation kept as
    it was (a name, a number, "H2O": it is its one partner's only partner) is cut, in
    both, where a mark starts or ends inside it, and its pieces linked one to one, so
    that a tag inside such a word lands on the same characters (`H<sub>2</sub>O`)."""
    words = _words(text)
    links = [(s, t) for s, t in links if s < len(words) and t < len(target)]
    cuts = sorted({x for m in _every(marks) for x in (m.start, m.end)})
    partners: dict[int, list[int]] = {}
    sources: dict[int, list[int]] = {}
    for s, t in links:
        partners.setdefault(s, []).append(t)
        sources.setdefault(t, []).append(s)
    src: list[tuple[int, int]] = []
    first_src: list[int] = []  # each source word's first piece
    cut: dict[int, list[tuple[int, int]]] = {}  # a kept target word: its pieces' spans
    for s, (a, b) in enumerate(words):
        inside = cuts[bisect_right(cuts, a) : bisect_left(cuts, b)]
        ts = partners.get(s, [])
        if inside and len(ts) == 1 and sources[ts[0]] == [s] and target[ts[0]] == text[a:b]:
            bounds = [a, *inside, b]
            cut[ts[0]] = [(p - a, q - a) for p, q in pairwise(bounds)]
        else:
            bounds = [a, b]
        first_src.append(len(src))
        src += pairwise(bounds)
    tgt: list[str] = []
    joined: list[bool] = []
    first_tgt: list[int] = []
    for t, w in enumerate(target):
        first_tgt.append(len(tgt))
        spans = cut.get(t, [(0, len(w))])
        tgt += [w[p:q] for p, q in spans]
        joined += [False] + [True] * (len(spans) - 1)
    pieces: list[tuple[int, int]] = []
    for s, t in links:
        n = len(cut[t]) if t in cut else 1  # a kept word's pieces, one to one
        pieces += [(first_src[s] + k, first_tgt[t] + k) for k in range(n)]
    return src, tgt, joined, pieces


def _densest(words: list[int], gap: int = 1) -> tuple[int, int]:
    """The run of sorted target `words` (no more than `gap` words missing between two)
    that holds the most of them, as (first, last): a stray link far from the others
    does not stretch a tag over the words between."""
    runs, start = [], 0
    for k in range(1, len(words) + 1):
        if k == len(words) or words[k] - words[k - 1] > gap + 1:
            runs.append((k - start, -start, words[start], words[k - 1]))
            start = k
    _, _, first, last = max(runs)
    return first, last


# ---- the whole document --------------------------------------------------------------------


@dataclass
class Prepared:
    """A document read and its runs found: the texts to translate (`texts`), and what
    `finish` needs to put their translations back."""

    tree: Element
    runs: list[list]
    flat: list[tuple[str, list[Mark]]]

    @property
    def texts(self) -> list[Anchored]:
        """Each run's text the model reads, anchored (`Anchored`) where its marks and its
        numbers are: placing a mark, or putting a number back, reads the links of the
        words around it; a sentence away from them needs none."""
        out = []
        for text, marks in self.flat:
            _, trail, start = _edges(text, marks)
            inner = text[start:trail].strip()
            anchors = [(m.start - start, m.end - start) for m in _all_marks(marks)]
            anchors += [m.span() for m in NUMBER.finditer(inner)]
            out.append(Anchored(inner, anchors))
        return out


def _all_marks(marks: list[Mark]) -> Iterator[Mark]:
    for m in marks:
        yield m
        yield from _all_marks(m.inner)


ALL_INLINE = MarkupRules(outline_detection=False)  # no element splits a sentence


def inline_roles(tree: Element) -> _Roles:
    """The roles of an XML `tree` whose every element is inline but those its own ITS
    attributes say otherwise (a format's inline codes: XLIFF's), for `flatten`."""
    return _Roles(tree, True, ALL_INLINE)


def prepare(document: str, format: str, rules: MarkupRules = PLAIN) -> Prepared:
    """`document` (html or xml) read, and the runs of text it holds to translate, its
    elements judged by the standards and the caller's `rules` (`_Roles`)."""
    tree = parse(document, format)
    roles = _Roles(tree, format == "xml", rules)
    found = runs(tree, roles)
    return Prepared(tree, found, [flatten(run, roles) for run in found])


def finish(prepared: Prepared, translated: list[Translation]) -> str:
    """The document with each run replaced by its translation (`translated`, one per
    run, with word alignments), its tags put back (`place`), numbers checked
    (`restore_numbers`)."""
    replaced: dict[int, str] = {}
    for run, (text, marks), t in zip(prepared.runs, prepared.flat, translated, strict=True):
        lead, trail, start = _edges(text, marks)
        inner = text[start:trail].strip()
        marks = _nested_written(_cdata_marked(_shift(marks, -start)), replaced)
        body = place(inner, marks, restore_numbers(t))
        replaced[id(run[0])] = text[:lead] + _cdata_written(body) + text[trail:]
        for node in run[1:]:
            replaced[id(node)] = ""
    return _render_tree(prepared.tree, replaced)


def rounds(
    document: str, format: str, rules: MarkupRules = PLAIN
) -> Generator[list[str], list[Translation], str]:
    """`document` (html or xml) translated run by run, its tags carried through, its
    elements judged with the caller's `rules` (`mtkit.documents.rounds.Rounds`: every
    run in one round)."""
    prepared = prepare(document, format, rules)
    translated = yield prepared.texts
    return finish(prepared, translated)


def _shift(marks: list[Mark], by: int) -> list[Mark]:
    return [
        Mark(m.node, max(m.start + by, 0), max(m.end + by, 0), m.atom, _shift(m.inner, by), m.glued)
        for m in marks
    ]


def _edges(text: str, marks: list[Mark]) -> tuple[int, int, int]:
    """Where a run's translated body starts and ends in `text` (the whitespace outside
    it, before the first mark and after the last, is kept as it was), and where the text
    the model reads starts within it."""
    lead = len(text) - len(text.lstrip())
    trail = len(text.rstrip())
    if marks:
        lead = min(lead, min(m.start for m in marks))
        trail = max(trail, max(m.end for m in marks))
    body = text[lead:trail]
    return lead, trail, lead + len(body) - len(body.lstrip())


def _cdata_marked(marks: list[Mark]) -> list[Mark]:
    """`marks` with each CDATA section that has words (`Cdata`) in them written between
    stand-ins, which `_cdata_written` finds where the tags of a run were placed."""
    return [
        replace(
            m,
            node=Element(m.node.name, CDATA_MARKED[0], CDATA_MARKED[1], m.node.children)
            if isinstance(m.node, Cdata) and not m.atom
            else m.node,
            inner=_cdata_marked(m.inner),
        )
        for m in marks
    ]


def _nested_written(marks: list[Mark], replaced: dict[int, str]) -> list[Mark]:
    """`marks` with each atom that is an element holding nodes written as it now reads: a
    nested element (a footnote) holds its own runs' translations, in `replaced` already
    (`runs` finds them first); any other reads as it was. (A mark with nothing to change
    is kept as it is.)"""
    out = []
    for m in marks:
        if m.atom and isinstance(m.node, Element) and m.node.children:
            m = replace(m, node=Raw(_render_tree(m.node, replaced)))
        elif m.inner:
            inner = _nested_written(m.inner, replaced)
            if any(a is not b for a, b in zip(inner, m.inner, strict=True)):
                m = replace(m, inner=inner)
        out.append(m)
    return out


CDATA_MARKED = ("\x00<![CDATA[", "]]>\x00")  # (no XML holds a NUL)
MARKED_CDATA = re.compile(r"\x00<!\[CDATA\[(.*?)\]\]>\x00", re.S)


def _cdata_written(body: str) -> str:
    """A run's translation with its CDATA sections (between `_cdata_marked`'s
    stand-ins) written as CDATA: their text, escaped as all text is written, as it
    reads (a CDATA section holds no entities), and a "]]>" in it, which would end the
    section, split across two."""
    return MARKED_CDATA.sub(lambda m: _cdata(html.unescape(m.group(1))), body)


def _cdata(text: str) -> str:
    """`text` as one CDATA section (or, where it holds "]]>", two)."""
    return (
        CDATA_OPEN + text.replace(CDATA_CLOSE, "]]" + CDATA_CLOSE + CDATA_OPEN + ">") + CDATA_CLOSE
    )


def _render_tree(tree: Element, replaced: dict[int, str]) -> str:
    """The document again, each node in `replaced` (by id) as written there."""
    out: list[str] = []
    _write_tree(tree, replaced, out)
    return "".join(out)


def _write_tree(node, replaced: dict[int, str], out: list[str]) -> None:
    """`node` written into `out` (one list: each character copied once, however deep)."""
    if id(node) in replaced:
        out.append(replaced[id(node)])
    elif isinstance(node, Cdata):  # its text, written as CDATA again
        text: list[str] = []
        _write_tree(node.children[0], replaced, text)
        out.append(_cdata(html.unescape("".join(text))))
    elif isinstance(node, Element):
        out.append(node.start)
        for c in node.children:
            _write_tree(c, replaced, out)
        out.append(node.end)
    else:
        out.append(node.raw())


def tags(document: str, format: str = "html") -> list[str]:
    """Every tag (and comment, declaration) of `document` as written, sorted: to
    compare an output's with its input's."""
    out: list[str] = []

    def walk(node) -> None:
        if isinstance(node, Element):
            out.extend(x for x in (node.start, node.end) if x)
            for c in node.children:
                walk(c)
        elif isinstance(node, Raw):
            out.append(node.source)

    walk(parse(document, format))
    return sorted(out)
