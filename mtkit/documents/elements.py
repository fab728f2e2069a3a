"""Which elements of a document are inline (inside a sentence), blocks (a sentence's
edge), nested (a text of their own standing inside a sentence, as a footnote) or kept
untranslated, by the standards, and by what a caller says (`MarkupRules`).

HTML: its content model, phrasing content and every element HTML does not name are
inline, the elements of flow content that are not phrasing (`HTML_BLOCKS`) are blocks.
XML: W3C ITS 2.0's `withinText` and `translate` data categories, as an element's own
`its:withinText` / `its:translate` attribute, as the rules of a user's rules file
(`MarkupRules.its_rules`), as the `its:rules` inside the document
(`ItsRule.read`: selectors are XPath, evaluated by lxml), then the vocabulary's defaults
(DITA, DocBook, XHTML: `Vocabulary`, told by the document's namespace or DOCTYPE; a
segment with neither gets the names DITA and DocBook agree on) and, for an element nothing
names, whether it stands in running text (non-blank text beside it in its parent: inline)
or not (a block). DeepL's options (`ignore_tags`, `non_splitting_tags`, `splitting_tags`,
`outline_detection`) are a caller's rules, above all but an element's own ITS attribute.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mtkit.core.errors import OptionError
from mtkit.core.search_options import flag

ITS = "http://www.w3.org/2005/11/its"
XHTML = "http://www.w3.org/1999/xhtml"
DOCBOOK = "http://docbook.org/ns/docbook"
INLINE, BLOCK, NESTED = "inline", "block", "nested"
WITHIN_TEXT = {"yes": INLINE, "no": BLOCK, "nested": NESTED}  # ITS' values, as roles
MAX_RULES_BYTES = 1 << 20  # a rules file larger than this is refused (one line)


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# HTML's flow content that is not phrasing content (and the elements that only stand in
# it: list items, table parts, a document's head): each a block. Every other element,
# phrasing content and names HTML does not have alike, is inline. (script, style,
# template, textarea, select and noscript are phrasing in HTML's model but hold no
# sentence of the text around them: blocks here.)
HTML_BLOCKS = _names(
    "address article aside blockquote body caption center col colgroup dd details dialog "
    "dir div dl dt fieldset figcaption figure footer form frame frameset h1 h2 h3 h4 h5 h6 "
    "head header hgroup hr html legend li main menu nav noscript ol optgroup option p pre "
    "script search section select style summary table tbody td template textarea tfoot th "
    "thead title tr ul"
)


@dataclass(frozen=True)
class Vocabulary:
    """An XML vocabulary's defaults: its `inline`, `blocks`, `nested` and `kept`
    (code: never translated) elements, by local name."""

    name: str
    inline: frozenset[str] = frozenset()
    blocks: frozenset[str] = frozenset()
    nested: frozenset[str] = frozenset()
    kept: frozenset[str] = frozenset()

    def role(self, local: str) -> str | None:
        """INLINE, BLOCK or NESTED for an element named `local`; None: not named."""
        if local in self.nested:
            return NESTED
        if local in self.inline:
            return INLINE
        if local in self.blocks:
            return BLOCK
        return None


DITA = Vocabulary(
    "DITA",
    inline=_names(
        "ph b i u sup sub tt line-through overline keyword term q tm xref cite data text "
        "state boolean image uicontrol wintitle menucascade shortcut codeph apiname option "
        "parmname synph kwd var delim oper sep repsep filepath msgph msgnum systemoutput "
        "userinput cmdname varname abbreviated-form equation-inline markupname xmlelement "
        "xmlatt textentity parameterentity numcharref xmlnsname xmlpi"
    ),
    blocks=_names(
        "p li ul ol sl sli dl dlentry dt dd dlhead dthd ddhd section sectiondiv bodydiv div "
        "title titlealts navtitle searchtitle shortdesc abstract body conbody taskbody "
        "refbody topic concept task reference glossentry glossterm glossdef step steps "
        "steps-unordered steps-informal substep substeps cmd info stepresult stepxmp context "
        "prereq result postreq example note lq fig figgroup table tgroup thead tbody row entry "
        "colspec simpletable sthead strow stentry choices choice choicetable chhead chrow "
        "choption chdesc choptionhd chdeschd tutorialinfo refsyn properties prophead property "
        "proptype propvalue propdesc prolog metadata related-links link linktext desc linkpool "
        "linklist map topicref topicmeta bookmap pre codeblock msgblock screen lines "
        "draft-comment required-cleanup object foreign unknown"
    ),
    nested=_names("fn indexterm"),
    kept=_names("codeph codeblock"),
)
DOCBOOK_VOCABULARY = Vocabulary(
    "DocBook",
    inline=_names(
        "emphasis literal filename command guilabel guimenu guimenuitem guisubmenu guibutton "
        "guiicon keycap keycombo keysym menuchoice shortcut mousebutton link ulink olink xref "
        "quote phrase citetitle citation firstterm glossterm acronym abbrev application "
        "productname trademark superscript subscript replaceable option parameter envar "
        "varname function classname methodname property constant type returnvalue systemitem "
        "userinput computeroutput prompt uri email personname firstname surname orgname "
        "foreignphrase wordasword markup tag token symbol errorcode errorname errortext "
        "errortype database hardware inlinemediaobject inlineequation footnoteref anchor date "
        "code citerefentry refentrytitle manvolnum sgmltag interface exceptionname package"
    ),
    blocks=_names(
        "para simpara formalpara listitem itemizedlist orderedlist variablelist varlistentry "
        "term title subtitle titleabbrev section sect1 sect2 sect3 sect4 sect5 simplesect "
        "chapter appendix preface article book part info bookinfo articleinfo abstract note "
        "tip warning caution important example informalexample figure informalfigure table "
        "informaltable tgroup thead tbody tfoot row entry colspec blockquote epigraph "
        "programlisting screen synopsis literallayout mediaobject imageobject textobject "
        "caption procedure step substeps stepalternatives glossary glossentry glossdef "
        "qandaset qandaentry question answer sidebar bibliography index toc refentry "
        "refnamediv refsect1 refsect2 refsynopsisdiv calloutlist callout segmentedlist "
        "seglistitem seg simplelist member address legalnotice revhistory revision "
        "authorgroup author copyright"
    ),
    nested=_names("footnote indexterm remark"),
    kept=_names("code programlisting screen synopsis"),
)


def _agreed(a: Vocabulary, b: Vocabulary) -> Vocabulary:
    """The names `a` and `b` give the same role (or only one of them names): what a
    segment that says nothing of its vocabulary gets (`link` is a block in DITA and inline
    in DocBook: the running text decides)."""

    def only(mine: frozenset[str], other: Vocabulary, same: frozenset[str]) -> frozenset[str]:
        named = other.inline | other.blocks | other.nested
        return frozenset(n for n in mine if n not in named or n in same)

    return Vocabulary(
        "DITA or DocBook",
        inline=only(a.inline, b, b.inline) | only(b.inline, a, a.inline),
        blocks=only(a.blocks, b, b.blocks) | only(b.blocks, a, a.blocks),
        nested=only(a.nested, b, b.nested) | only(b.nested, a, a.nested),
        kept=a.kept | b.kept,
    )


SEGMENTS = _agreed(DITA, DOCBOOK_VOCABULARY)


def vocabulary(first_tag: str, doctype: str) -> Vocabulary | None:
    """The vocabulary of an XML document whose first start tag is `first_tag` and whose
    DOCTYPE (as written, "" where none) is `doctype`; None: XHTML (HTML's model)."""
    if XHTML in first_tag:
        return None
    if DOCBOOK in first_tag or "docbook" in doctype.lower():
        return DOCBOOK_VOCABULARY
    if "dita" in doctype.lower() or "ditaarch" in first_tag:
        return DITA
    return SEGMENTS


@dataclass(frozen=True)
class ItsRule:
    """One ITS 2.0 global rule: `kind` (withinText or translate), the XPath `selector`
    of the elements it names, its value (withinText: yes, no or nested; translate: yes
    or no) and the namespaces the selector's prefixes mean (its rules element's)."""

    kind: str
    selector: str
    value: str
    namespaces: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def read(root, where: str) -> tuple[ItsRule, ...]:
        """The withinText and translate rules of every `its:rules` element in the lxml tree
        `root`, in document order (a later rule wins: ITS' order); a `ValueError` naming
        `where` for one whose value or selector is wrong."""
        etree = lxml_etree()

        out = []
        for rules in root.iter(f"{{{ITS}}}rules"):
            for rule in rules:
                if not isinstance(rule.tag, str):
                    continue
                kind = {"withinTextRule": "withinText", "translateRule": "translate"}.get(
                    etree.QName(rule).localname
                )
                if etree.QName(rule).namespace != ITS or kind is None:
                    continue  # (another data category's rule: not ours to apply)
                value = rule.get(kind, "")
                allowed = WITHIN_TEXT if kind == "withinText" else ("yes", "no")
                selector = rule.get("selector", "")
                if value not in allowed:
                    raise ValueError(
                        f"{where}: its:{kind}Rule {kind}={value!r} must be "
                        f"{', '.join(list(allowed)[:-1])} or {list(allowed)[-1]} "
                        f"(line {rule.sourceline})"
                    )
                namespaces = tuple((k, v) for k, v in rule.nsmap.items() if k)
                try:
                    etree.XPath(selector, namespaces=dict(namespaces))
                except etree.XPathError as e:
                    raise ValueError(
                        f"{where}: its:{kind}Rule selector {selector!r} is not XPath: {e} "
                        f"(line {rule.sourceline})"
                    ) from None
                out.append(ItsRule(kind, selector, value, namespaces))
        return tuple(out)


# A document's own rules come from whoever wrote it, and an XPath can cost as much as its
# writer likes (`//*[count(//*) > 0]`): a document's selectors are only paths of names
# (`//ph`, `//d:ph`, `/doc/p/*`), each step with at most an attribute test (`//*[@code]`,
# `//ph[@type='x']`), joined by `|`; a rules file's (the user's own) are any XPath.
_STEP = (
    r"/{1,2}(?:[\w.-]+:)?(?:[\w.-]+|\*)"  # a name (with its prefix) or *
    r"""(?:\[@(?:[\w.-]+:)?[\w.-]+(?:\s*=\s*(?:'[^']*'|"[^"]*"))?\])?"""  # [@a] or [@a='v']
)
PLAIN_SELECTOR = re.compile(rf"\s*(?:{_STEP})+(?:\s*\|\s*(?:{_STEP})+)*\s*")
MAX_DOCUMENT_RULES = 256


def lxml_etree():
    """lxml's etree, or one line saying how to install it (ITS rules are read with it)."""
    try:
        from lxml import etree
    except ImportError:
        raise OptionError(
            "ITS rules are read with the lxml package: pip install 'mtkit[documents]'"
        ) from None
    return etree


_PARSERS = threading.local()  # each thread's safe parsers, by encoding (lxml's parsers
# are not to be shared between threads: the server's sessions run in several)


def safe_parser(encoding: str | None = None):
    """lxml's parser for documents from strangers, made once per thread and encoding: no
    entity expansion beyond XML's own, no DTD loaded, nothing fetched, no huge trees;
    `encoding`: the bytes' own, whatever the document declares (None: as it declares).
    Every reader of XML in mtkit's documents parses with it."""
    made = getattr(_PARSERS, "made", None)
    if made is None:
        made = _PARSERS.made = {}
    if encoding not in made:
        etree = lxml_etree()
        made[encoding] = etree.XMLParser(
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            huge_tree=False,
            recover=False,
            encoding=encoding,
        )
    return made[encoding]


def _tag_names(value, name: str) -> frozenset[str]:
    """A tag list as DeepL takes it: comma-separated names, or a list of them."""
    if value is None:
        return frozenset()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple | set | frozenset) or not all(
        isinstance(x, str) for x in items
    ):
        raise OptionError(
            f"{name} must be tag names, comma-separated or as a list, got {value!r}", name
        )
    names = [x.strip() for item in items for x in item.split(",") if x.strip()]
    for x in names:
        if not TAG_NAME.fullmatch(x):
            raise OptionError(f"{name}: {x!r} is not a tag name", name)
    return frozenset(names)


TAG_NAME = re.compile(r"[^\W\d][\w.:-]*")


def _yes_no(value, name: str) -> bool:
    """A boolean as DeepL's clients send it: true/false, 1/0, or "1"/"0" in a form."""
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false"):
        return value.strip().lower() in ("1", "true")
    raise OptionError(f"{name} must be true or false (1 or 0), got {value!r}", name)


@dataclass(frozen=True)
class MarkupRules:
    """What a caller says of a document's elements, beside what the standards say:
    `ignore_tags` (kept untranslated, as translate="no"), `non_splitting_tags` (inline),
    `splitting_tags` (blocks), `outline_detection` (False: every element but the
    splitting ones is inline, as DeepL's outline_detection=0) and `its_rules` (a rules
    file's ITS 2.0 rules, above the document's own). Built checked by `checked`, which
    keeps the options given as the caller spells them (`named`: each option's name and
    its spelling, for an error)."""

    ignore_tags: frozenset[str] = frozenset()
    non_splitting_tags: frozenset[str] = frozenset()
    splitting_tags: frozenset[str] = frozenset()
    outline_detection: bool = True
    its_rules: tuple[ItsRule, ...] = ()
    named: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @classmethod
    def checked(
        cls,
        *,
        ignore_tags=None,
        non_splitting_tags=None,
        splitting_tags=None,
        outline_detection=None,
        its_rules=None,
        spell: Callable[[str], str] = flag,
    ) -> MarkupRules:
        """The rules, each value checked, each error one line naming its option by
        `spell` (the CLI's --ignore-tags, the API's and DeepL's ignore_tags): tag lists
        as comma-separated text or a list of names, `outline_detection` a boolean (or
        DeepL's "0"/"1"), `its_rules` the path of an ITS rules file (None: none)."""
        given = dict(
            ignore_tags=ignore_tags,
            non_splitting_tags=non_splitting_tags,
            splitting_tags=splitting_tags,
            outline_detection=outline_detection,
            its_rules=its_rules,
        )
        return cls(
            _tag_names(ignore_tags, spell("ignore_tags")),
            _tag_names(non_splitting_tags, spell("non_splitting_tags")),
            _tag_names(splitting_tags, spell("splitting_tags")),
            outline_detection is None or _yes_no(outline_detection, spell("outline_detection")),
            () if its_rules is None else read_rules_file(its_rules, spell("its_rules")),
            tuple(
                (name, spell(name)) for name, value in given.items() if value not in (None, "", [])
            ),
        )

    @property
    def option(self) -> str:
        """The first option given, as the caller spells it (an error names it)."""
        return self.named[0][1] if self.named else "markup rules"

    def spelled(self, name: str) -> str:
        """Option `name` as the caller spells it."""
        return dict(self.named).get(name, name)

    def role(self, name: str) -> str | None:
        """The role the caller's tag lists give an element `name` (its name as written, or
        its local name), or None."""
        local = name.rpartition(":")[2]
        if name in self.splitting_tags or local in self.splitting_tags:
            return BLOCK
        if name in self.non_splitting_tags or local in self.non_splitting_tags:
            return INLINE
        return None

    def ignored(self, name: str) -> bool:
        return name in self.ignore_tags or name.rpartition(":")[2] in self.ignore_tags


PLAIN = MarkupRules()  # the standards alone


def read_rules_file(path, name: str) -> tuple[ItsRule, ...]:
    """The ITS rules in the file at `path` (`ItsRule.read`); one line naming option
    `name` where it cannot be read, is not XML, or holds no its:rules."""
    etree = lxml_etree()

    if not isinstance(path, str | Path):
        raise OptionError(f"{name} must be the path of an ITS rules file, got {path!r}", name)
    path = Path(path)
    try:
        if path.stat().st_size > MAX_RULES_BYTES:
            raise OptionError(f"{name} {path}: larger than {MAX_RULES_BYTES} bytes", name)
        data = path.read_bytes()
    except OSError as e:
        raise OptionError(f"{name} {path}: {e.strerror or e}", name) from None
    try:
        root = etree.fromstring(data, safe_parser())
    except etree.XMLSyntaxError as e:
        raise OptionError(f"{name} {path}: not well-formed XML: {e}", name) from None
    try:
        rules = ItsRule.read(root.getroottree().getroot(), f"{name} {path}")
    except ValueError as e:
        raise OptionError(str(e), name) from None
    if not any(True for _ in root.iter(f"{{{ITS}}}rules")):
        raise OptionError(
            f'{name} {path}: no its:rules element (xmlns:its="{ITS}", version="2.0")', name
        )
    return rules
