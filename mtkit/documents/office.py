"""Office documents and e-books: docx, pptx, xlsx (Office Open XML), odt and odp
(OpenDocument), epub. Each is a zip of XML parts; a file's bytes in, the same kind of
file's bytes out.

The parts that hold text are translated paragraph by paragraph (Word's `w:p`, a slide's
`a:p`, a spreadsheet's shared or inline string `si`/`is`, ODF's `text:p` and `text:h`),
each as one run of `mtkit.documents.markup`: the paragraph's runs become inline elements
there, so that each run's formatting lands on the target words aligned to its source
words (`markup.finish`), and back into runs after. Runs whose formatting is the same
(Word's `w:rPr`, DrawingML's `a:rPr` without its spell-check marks, a spreadsheet's
`rPr`) are one: those split by spell-check or revision marks (`w:proofErr`, dropped: the
program marks spelling again) are merged first, and the least formatted run's formatting
is the paragraph's plain text (`Paragraph.plain`: text the placement puts outside every
other run gets it; each run formatted otherwise is a tag, and comes back one run). A
hyperlink (`w:hyperlink`, `text:a`), an insertion (`w:ins`), a content control
(`w:sdt`: its runs in its `w:sdtContent`), an ODF `text:span` is an element around its
runs, placed as markup places `<a>`; a field (a complex field's runs
from its `begin` to its `end`, `w:fldSimple`, `a:fld`, ODF's fields), a bookmark, a
comment's marks, a drawing, a footnote's reference (its text is a paragraph of its own),
a tab and a break are kept as they are, as tags without words (tabs and breaks part the
words either side). Placeholders and numbers as in markup.

Which parts hold text: in Office Open XML, those `[Content_Types].xml` names (Word's
document, headers, footers, footnotes, endnotes, comments; slides and their notes; the
shared strings, and a sheet's inline strings); in OpenDocument `content.xml` and
`styles.xml` (headers, footers); in an epub each XHTML item of its package's manifest,
translated as markup's xml (`markup.prepare`). Every other member is copied as it is:
the same name, order, date, compression and bytes; a part without a paragraph to
translate keeps its bytes too. The parts are read with lxml (no DTD, no entity, no
network) and the translated ones written with it.

A file from a stranger is hostile: it is checked whole before a member is unpacked
(`Container.read`), and what it cannot be is one line (`OfficeError`): not a zip, more
than `MAX_MEMBERS` members, a member's name that leaves the folder it unpacks into (`../`,
an absolute path, a drive), an encrypted member, more than `MAX_UNPACKED` bytes
unpacked (the declared sizes summed: a zip bomb is refused before it is inflated, and
`zipfile` inflates no member past its declared size, whose checksum it checks), a part
that is not well-formed XML or declares a DOCTYPE, and a file without its format's
required parts.
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from collections.abc import Callable, Iterator
from copy import deepcopy
from dataclasses import dataclass, field
from html import escape
from posixpath import dirname, join, normpath

from mtkit.core.errors import UserError
from mtkit.core.translation import Translation
from mtkit.documents import markup
from mtkit.documents.elements import safe_parser
from mtkit.documents.rounds import Rounds

MAX_MEMBERS = 10_000  # members of one file
MAX_UNPACKED = 1 << 29  # bytes of all its members unpacked: 512 MiB
MAX_PART = 1 << 27  # bytes of one XML part read: 128 MiB

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
S = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
TYPES = "http://schemas.openxmlformats.org/package/2006/content-types"
CONTAINER = "urn:oasis:names:tc:opendocument:xmlns:container"
OPF = "http://www.idpf.org/2007/opf"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


class OfficeError(UserError, ValueError):
    """An office document or e-book that cannot be read or translated (one line)."""


def rounds(data: bytes, format: str) -> Rounds[bytes]:
    """The file `data` (docx, pptx, xlsx, odt, odp or epub: `format`) translated
    (`mtkit.documents.rounds.Rounds`, one round: every paragraph of every part)."""
    container = Container.read(data, format)
    parts = [Part.of(name, container.members[name], format) for name in container.texts]
    translated = yield [text for part in parts for text in part.texts]
    done = iter(translated)
    return container.written({part.name: part.written(done) for part in parts})


# ---- the container: a zip checked whole, its members, written back -----------------------

# What reading a damaged zip raises (zlib's error for a broken deflate stream, a
# NotImplementedError for a method or version zipfile does not read)
UNREADABLE = (
    zipfile.BadZipFile,
    zlib.error,
    OSError,
    EOFError,
    ValueError,
    RuntimeError,
    NotImplementedError,
)


@dataclass
class Container:
    """A zip's members (`infos`, in order; `members`, name -> bytes), read after every
    check (`read`), and which of them hold text for `format` (`texts`: `text_parts`)."""

    format: str
    infos: list[zipfile.ZipInfo]
    members: dict[str, bytes]
    comment: bytes = b""
    texts: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, data: bytes, format: str) -> Container:
        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
        except UNREADABLE:
            raise OfficeError(
                f"the input is not {_a(format)} file: it is not a zip archive"
            ) from None
        with archive:
            infos = archive.infolist()
            _check_members(infos, format)
            members: dict[str, bytes] = {}
            for info in infos:
                try:
                    with archive.open(info) as member:
                        content = member.read(info.file_size + 1)
                except UNREADABLE as e:
                    raise OfficeError(
                        f"the {format} file's member {info.filename!r} is damaged: "
                        + " ".join(str(e).split())
                    ) from None
                if len(content) != info.file_size:
                    raise OfficeError(f"the {format} file's member {info.filename!r} is damaged")
                members[info.filename] = content
            comment = archive.comment
        container = cls(format, infos, members, comment)
        container.texts = container.text_parts()  # (its required parts, checked)
        return container

    def text_parts(self) -> list[str]:
        """The members that hold text, in the zip's order; one line where a part the
        format requires is missing."""
        if self.format in ("docx", "pptx", "xlsx"):
            if "[Content_Types].xml" not in self.members:
                raise OfficeError(f"not {_a(self.format)} file: it has no [Content_Types].xml")
            types = _content_types(self.members["[Content_Types].xml"])
            main = MAIN_PART[self.format]
            if not any(t.endswith(main) for t in types.values()):
                raise OfficeError(
                    f"not {_a(self.format)} file: it has no {main.split('.')[0]} part"
                )
            wanted = {n for n, t in types.items() if TEXT_TYPES[self.format].search(t)}
        elif self.format in ("odt", "odp"):
            if "content.xml" not in self.members:
                raise OfficeError(f"not {_a(self.format)} file: it has no content.xml")
            wanted = {"content.xml", "styles.xml"}
        else:
            wanted = set(self._chapters())
        return [i.filename for i in self.infos if i.filename in wanted]

    def _chapters(self) -> list[str]:
        """An epub's XHTML items, from the package (OPF) its container names."""
        if "META-INF/container.xml" not in self.members:
            raise OfficeError("not an epub file: it has no META-INF/container.xml")
        root = _xml(self.members["META-INF/container.xml"], "META-INF/container.xml")
        found = root.find(f".//{{{CONTAINER}}}rootfile")
        package = found.get("full-path", "") if found is not None else ""
        if package not in self.members:
            raise OfficeError(
                f"the epub's package document {package or '(none named)'!r} is missing"
            )
        opf = _xml(self.members[package], package)
        items = []
        for item in opf.iter(f"{{{OPF}}}item"):
            if item.get("media-type") == "application/xhtml+xml" and item.get("href"):
                name = normpath(join(dirname(package), _unquote(item.get("href"))))
                if name in self.members:
                    items.append(name)
        return items

    def written(self, replaced: dict[str, bytes]) -> bytes:
        """The zip again: each member with its name, date, attributes, comment and
        compression, in its place, its bytes those in `replaced` or its own."""
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            for info in self.infos:
                copy = zipfile.ZipInfo(info.filename, info.date_time)
                copy.compress_type = info.compress_type
                copy.external_attr, copy.create_system = info.external_attr, info.create_system
                copy.comment = info.comment
                archive.writestr(copy, replaced.get(info.filename, self.members[info.filename]))
            archive.comment = self.comment
        return out.getvalue()


def _a(format: str) -> str:
    """A format's name with its article: "a docx", "an epub"."""
    return f"an {format}" if format[0] in "aeiox" else f"a {format}"


def _check_members(infos: list[zipfile.ZipInfo], format: str) -> None:
    """Every check a zip's listing allows, before a member is unpacked."""
    if len(infos) > MAX_MEMBERS:
        raise OfficeError(
            f"the {format} file has {len(infos)} members; mtkit reads files of up to {MAX_MEMBERS}"
        )
    seen: set[str] = set()
    total = 0
    for info in infos:
        name = info.filename
        parts = re.split(r"[/\\]", name)
        if (
            name.startswith(("/", "\\"))
            or re.match(r"[A-Za-z]:", name)
            or ".." in parts
            or "\x00" in name
        ):
            raise OfficeError(
                f"the {format} file holds a member named {name!r}, outside its folder"
            )
        if name in seen:
            raise OfficeError(f"the {format} file holds two members named {name!r}")
        seen.add(name)
        if info.flag_bits & 0x1:
            raise OfficeError(f"the {format} file's member {name!r} is encrypted")
        total += info.file_size
        if total > MAX_UNPACKED:
            raise OfficeError(
                f"the {format} file is too large: its members unpack to more than "
                f"{MAX_UNPACKED} bytes"
            )


# What a format's main part's content type ends with, and the types of its parts with text
MAIN_PART = {
    "docx": "document.main+xml",
    "pptx": "presentation.main+xml",
    "xlsx": "sheet.main+xml",
}
TEXT_TYPES = {
    "docx": re.compile(
        r"wordprocessingml\.(document\.main|template\.main|header|footer|footnotes|endnotes"
        r"|comments)\+xml$|ms-word\.(document|template)\.macroEnabled(\.main)?\+xml$"
    ),
    "pptx": re.compile(r"presentationml\.(slide|notesSlide)\+xml$"),
    "xlsx": re.compile(r"spreadsheetml\.(sharedStrings|worksheet)\+xml$"),
}


def _content_types(data: bytes) -> dict[str, str]:
    """`[Content_Types].xml`'s overrides: member name -> content type."""
    root = _xml(data, "[Content_Types].xml")
    return {
        o.get("PartName", "").lstrip("/"): o.get("ContentType", "")
        for o in root.iter(f"{{{TYPES}}}Override")
    }


def _unquote(href: str) -> str:
    from urllib.parse import unquote

    return unquote(href.split("#")[0])


def _xml(data: bytes, name: str):
    """A part's XML root, read by lxml safely: no network, no DTD, no entity; one line
    where it is not well-formed, is too long, or declares a DOCTYPE."""
    from lxml import etree

    if len(data) > MAX_PART:
        raise OfficeError(f"the part {name!r} is too large: {len(data)} bytes, at most {MAX_PART}")
    try:
        root = etree.fromstring(data, safe_parser())
    except etree.XMLSyntaxError as e:
        raise OfficeError(
            f"the part {name!r} is not well-formed XML: {' '.join(str(e.msg).split())}"
        ) from None
    if root.getroottree().docinfo.doctype:
        raise OfficeError(f"the part {name!r} declares a DOCTYPE, which no office part has")
    return root


# ---- a part: its paragraphs --------------------------------------------------------------


@dataclass
class Part:
    """One member that holds text: its texts to translate (`texts`: an XML part's
    paragraphs', an epub chapter's runs), and its bytes once they are (`written`)."""

    name: str
    data: bytes
    paragraphs: list[Paragraph] = field(default_factory=list)
    root: object = None  # lxml's, for an XML part
    chapter: markup.Prepared | None = None  # an epub's XHTML, read by markup
    encoding: str = "utf-8"  # (the chapter's)

    @classmethod
    def of(cls, name: str, data: bytes, format: str) -> Part:
        if format == "epub":
            return cls._chapter(name, data)
        if format == "xlsx" and b"inlineStr" not in data and b"sharedStrings" not in name.encode():
            return cls(name, data)  # a sheet without inline strings: kept as it is
        root = _xml(data, name)
        found = [Paragraph.of(p, DIALECTS[format]) for p in root.iter(*PARAGRAPHS[format])]
        return cls(name, data, [p for p in found if p.text], root)

    @classmethod
    def _chapter(cls, name: str, data: bytes) -> Part:
        from mtkit.core.textio import document_encoding, read_document

        encoding = document_encoding(data, XML_DECLARED)
        try:
            prepared = markup.prepare(read_document(data, encoding), "xml")
        except markup.MarkupError as e:
            raise OfficeError(f"the epub's {name!r}: {e}") from None
        return cls(name, data, chapter=prepared, encoding=encoding)

    @property
    def texts(self) -> list[str]:
        if self.chapter is not None:
            return self.chapter.texts
        return [p.text for p in self.paragraphs]

    def written(self, translations: Iterator[Translation]) -> bytes:
        """The part's bytes, its texts' translations (the next of `translations`)
        written; its own where it has none."""
        from lxml import etree

        from mtkit.core.textio import write_document

        if self.chapter is not None:
            done = [next(translations) for _ in self.chapter.texts]
            if not done:
                return self.data
            return write_document(markup.finish(self.chapter, done), self.encoding, True)
        if not self.paragraphs:
            return self.data
        for paragraph in self.paragraphs:
            paragraph.finish(next(translations))
        tree = self.root.getroottree()
        return etree.tostring(
            tree,
            xml_declaration=True,
            encoding=tree.docinfo.encoding or "UTF-8",
            standalone=tree.docinfo.standalone,
        )


XML_DECLARED = re.compile(rb"\A\s*<\?xml[^>]*?\bencoding\s*=\s*[\"']([\w.:-]+)")


def _q(namespace: str, *locals_: str) -> tuple[str, ...]:
    return tuple(f"{{{namespace}}}{name}" for name in locals_)


PARAGRAPHS = {
    "docx": _q(W, "p"),
    "pptx": _q(A, "p"),
    "xlsx": _q(S, "si", "is"),
    "odt": _q(TEXT, "p", "h"),
    "odp": _q(TEXT, "p", "h"),
}


@dataclass(frozen=True)
class Dialect:
    """How one family of formats writes a paragraph: its runs (`run`, with their
    formatting `props` and their text `text`: Word's `w:r`, `w:rPr`, `w:t`), what a
    paragraph starts and ends with that stays there (`head`, `tail`), the elements that
    wrap runs (`wraps`: placed around their words), those that part words (`breaks`), the
    ones dropped (`dropped`: spell-check marks), where a complex field begins and ends
    (`field`: its element, the attribute that says which), the wraps whose runs stand in
    a child of theirs (`held`: Word's content control, `w:sdt`, holds its runs in its
    `w:sdtContent`, beside its properties, kept), the props' attributes that
    are no formatting (`unformatted`: spell-check marks), whether text stands in a
    paragraph or a wrap by itself (`bare`: ODF's), and whether a text element whose
    spaces matter says so (`spaces_marked`: `xml:space="preserve"`; DrawingML keeps
    every `a:t`'s spaces)."""

    run: str = ""
    props: str = ""
    text: str = ""
    head: frozenset[str] = frozenset()
    tail: frozenset[str] = frozenset()
    wraps: frozenset[str] = frozenset()
    breaks: frozenset[str] = frozenset()
    dropped: frozenset[str] = frozenset()
    field: tuple[str, str] = ("", "")
    held: tuple[tuple[str, str], ...] = ()  # (wrap, the child holding its runs)
    unformatted: frozenset[str] = frozenset()
    bare: bool = False
    spaces_marked: bool = True


DIALECTS = {
    "docx": Dialect(
        run=f"{{{W}}}r",
        props=f"{{{W}}}rPr",
        text=f"{{{W}}}t",
        head=frozenset(_q(W, "pPr")),
        wraps=frozenset(_q(W, "hyperlink", "ins", "smartTag", "sdt")),
        breaks=frozenset(_q(W, "tab", "br", "cr")),
        dropped=frozenset(_q(W, "proofErr", "lastRenderedPageBreak")),
        field=(f"{{{W}}}fldChar", f"{{{W}}}fldCharType"),
        held=((f"{{{W}}}sdt", f"{{{W}}}sdtContent"),),
        unformatted=frozenset(),
    ),
    "pptx": Dialect(
        run=f"{{{A}}}r",
        props=f"{{{A}}}rPr",
        text=f"{{{A}}}t",
        head=frozenset(_q(A, "pPr")),
        tail=frozenset(_q(A, "endParaRPr")),
        breaks=frozenset(_q(A, "br")),
        unformatted=frozenset({"err", "dirty", "noProof", "smtClean"}),
        spaces_marked=False,
    ),
    "xlsx": Dialect(
        run=f"{{{S}}}r",
        props=f"{{{S}}}rPr",
        text=f"{{{S}}}t",
        tail=frozenset(_q(S, "phoneticPr")),
    ),
    "odf": Dialect(
        wraps=frozenset(_q(TEXT, "span", "a", "meta")),
        breaks=frozenset(_q(TEXT, "s", "tab", "line-break")),
        dropped=frozenset(),
        bare=True,
    ),
}
DIALECTS["odt"] = DIALECTS["odp"] = DIALECTS["odf"]


@dataclass
class Piece:
    """What a tag of a paragraph's run stands for: a run's formatting around its text
    (`props`, an lxml element or None: `kind` "run"), an element around runs (`shell`,
    its own plain formatting `base`: "wrap"), or elements kept as they are (`make`:
    "atom")."""

    kind: str
    props: object = None
    shell: object = None
    base: object = None  # a wrap's Container
    make: Callable[[], list] | None = None


@dataclass
class Plain:
    """The plain text of a paragraph or a wrap: its `props` (the formatting most of its
    letters carry; None: none, or bare text where the dialect has it), and whether it is
    a spreadsheet string's `t` alone, without a run (`plain_t`)."""

    props: object = None
    plain_t: bool = False  # xlsx: a string of plain text alone is a `t`, no run


class Paragraph:
    """One paragraph being translated, in steps: `of` (its content read into markup's
    nodes, each run, wrap and kept element a tag `n` stands for: `pieces`), then
    `finish` (the translation placed by `markup.finish`, and read back into runs)."""

    def __init__(self, element, dialect: Dialect):
        self.element = element
        self.dialect = dialect
        self.pieces: list[Piece] = []
        self.head: list = []
        self.tail: list = []
        self.base = Plain()
        self.prepared: markup.Prepared | None = None
        self.text = ""

    @classmethod
    def of(cls, element, dialect: Dialect) -> Paragraph:
        paragraph = cls(element, dialect)
        d = dialect
        content = []
        for child in element:
            if child.tag in d.head and not content:
                paragraph.head.append(child)
            elif child.tag in d.tail:
                paragraph.tail.append(child)
            else:
                content.append(child)
        paragraph.base = paragraph.plain(element, content)
        nodes = paragraph.nodes(element.text if d.bare else None, content, paragraph.base)
        if nodes:
            coded = markup.Element("", "", "", nodes)
            paragraph.prepared = markup.Prepared(
                coded, [nodes], [markup.flatten(nodes, markup.inline_roles(coded))]
            )
            text = paragraph.prepared.texts[0]
            paragraph.text = text if any(c.isalnum() for c in text) else ""
        return paragraph

    # -- of: the content as markup's nodes -----------------------------------------------

    def key(self, props) -> bytes:
        """A run's formatting, as compared: its props without spell-check marks."""
        if props is None:
            return b""
        from lxml import etree

        if self.dialect.unformatted and any(a in props.attrib for a in self.dialect.unformatted):
            props = deepcopy(props)
            for a in self.dialect.unformatted:
                props.attrib.pop(a, None)
        return etree.tostring(props, method="c14n")

    def plain(self, element, content: list) -> Plain:
        """The plain formatting of `content` (runs, directly): the least formatted
        run's (the fewest formatting elements and attributes; of those, the one most
        letters carry), so that each run formatted otherwise is a tag around its words,
        and stays one run wherever the translation puts them."""
        d = self.dialect
        if d.bare:
            return Plain()
        rank: dict[bytes, tuple[int, int]] = {}  # key -> (-formatting, letters)
        props_of: dict[bytes, object] = {}
        for child in content:
            if child.tag == d.run:
                props = child.find(d.props)
                letters = sum(len(t.text or "") for t in child.iter(d.text))
            elif child.tag == d.text:  # xlsx: a string's text outside its runs
                props, letters = None, len(child.text or "")
            else:
                continue
            key = self.key(props)
            formatted, had = self.formatting(props), rank.get(key, (0, 0))[1]
            rank[key] = (-formatted, had + letters)
            props_of.setdefault(key, props)
        if not rank or not any(child.tag == d.run for child in content):
            return Plain(None, plain_t=bool(rank))
        key = max(rank, key=lambda k: rank[k])
        return Plain(props_of[key])

    def formatting(self, props) -> int:
        """How much formatting `props` holds: its elements and attributes, but for the
        language and spell-check marks."""
        if props is None:
            return 0
        ignored = self.dialect.unformatted | {"lang"}
        attributes = sum(1 for a in props.attrib if a.rpartition("}")[2] not in ignored)
        elements = sum(1 for e in props.iter() if e is not props and "lang" not in str(e.tag))
        return attributes + elements

    def tag(self, piece: Piece, name: str = "r") -> tuple[str, str]:
        self.pieces.append(piece)
        n = len(self.pieces) - 1
        return f'<{name} n="{n}">', f"</{name}>"

    def atom(self, make: Callable[[], list], breaks: bool = False):
        start, _ = self.tag(Piece("atom", make=make), "br" if breaks else "x")
        return markup.Element("br" if breaks else "x", start[:-1] + "/>", "", [])

    def nodes(self, text: str | None, content: list, base: Plain) -> list:
        """Markup's nodes for `content` (children of a paragraph or a wrap, after its
        `text`, bare ODF text) whose plain formatting is `base`'s."""
        d = self.dialect
        out: list = []
        texts: list[tuple[bytes | None, object, str]] = []  # runs' text not yet written

        def text_of(props, value: str) -> None:
            key = None if props is _BARE else self.key(props)
            if texts and texts[-1][0] == key:
                texts[-1] = (key, props, texts[-1][2] + value)
            else:
                texts.append((key, props, value))

        def flush() -> None:
            base_key = None if d.bare else self.key(base.props)
            for key, props, value in texts:
                escaped = markup.Text(escape(value, quote=False))
                if key is None or key == base_key:
                    out.append(escaped)
                else:
                    start, end = self.tag(Piece("run", props=props))
                    out.append(markup.Element("r", start, end, [escaped]))
            texts.clear()

        def kept(make, breaks: bool = False) -> None:
            flush()
            out.append(self.atom(make, breaks))

        if text:
            text_of(_BARE, text)
        field: list = []  # a complex field's runs, from its begin to its end
        depth = 0
        for child in content:
            if not isinstance(child.tag, str):  # a comment, a processing instruction
                kept(_same(child))
            elif child.tag in d.dropped:
                pass
            elif depth or (d.field[0] and child.tag == d.run and _field(child, d) == "begin"):
                field.append(child)
                for c in child.iter(d.field[0]) if d.field[0] else ():
                    kind = c.get(d.field[1])
                    depth += 1 if kind == "begin" else -1 if kind == "end" else 0
                if depth <= 0:
                    depth = 0
                    kept(_same(*field))
                    field = []
            elif child.tag == d.run:
                props = child.find(d.props)
                for c in child:
                    if c.tag == d.props or c.tag in d.dropped:
                        continue
                    if c.tag == d.text:
                        text_of(props, c.text or "")
                    else:
                        kept(_in_run(child, props, c), c.tag in d.breaks)
            elif child.tag == d.text:  # xlsx: a string's plain text
                text_of(None, child.text or "")
            elif child.tag in d.wraps and _holder(child, d) is not None:
                flush()
                holder = _holder(child, d)
                inner = self.plain(holder, list(holder))
                start, end = self.tag(Piece("wrap", shell=child, base=inner), "w")
                children = self.nodes(holder.text if d.bare else None, list(holder), inner)
                out.append(markup.Element("w", start, end, children))
            else:
                kept(_same(child), child.tag in d.breaks)
            if d.bare and child.tail:
                text_of(_BARE, child.tail)
        if field:
            kept(_same(*field))
        flush()
        return out

    # -- finish: the translation placed, read back into runs ---------------------------

    def finish(self, translation: Translation) -> None:
        from lxml import etree

        placed = markup.finish(self.prepared, [translation])
        tree = etree.fromstring(f"<p>{placed}</p>".encode(), safe_parser("utf-8"))
        element = self.element
        keep_text = element.text if not self.dialect.bare else None
        for child in list(element):
            element.remove(child)
        element.text = keep_text
        for child in self.head:
            element.append(child)
        self.fill(element, tree, self.base)
        for child in self.tail:
            child.tail = None
            element.append(child)

    def fill(self, parent, placed, base: Plain) -> None:
        """`placed`'s content (text and the tags `pieces` name) written into `parent`:
        its text with `base`'s formatting. A run or wrap left without words keeps the
        source's spaces on both sides (markup's rule for an element, which a browser
        collapses); in a paragraph's runs two spaces in a row are text, and one goes."""
        self.write(parent, placed.text, base)
        before = placed.text or ""
        for tag in placed:
            piece = self.pieces[int(tag.get("n"))]
            words = "".join(tag.itertext())
            if (
                piece.kind != "atom"
                and not words
                and before.endswith(" ")
                and (tag.tail or "").startswith(" ")
            ):
                tag.tail = tag.tail[1:]
            if tag.tail or words or piece.kind == "atom":  # (an atom is no space)
                before = tag.tail or words or "\N{OBJECT REPLACEMENT CHARACTER}"
            if piece.kind == "atom":
                for element in piece.make():
                    element.tail = None
                    parent.append(element)
            elif piece.kind == "run":
                # (a run none of whose words the translation has a partner for is
                # kept empty, as markup keeps such an element: the runs stay as many)
                self.write(parent, "".join(tag.itertext()), Plain(piece.props), empty=True)
            else:
                shell = piece.shell
                holder = _holder(shell, self.dialect)
                kept_text = holder.text if not self.dialect.bare else None
                for child in list(holder):
                    holder.remove(child)
                holder.text, shell.tail = kept_text, None
                parent.append(shell)
                self.fill(holder, tag, piece.base)
            self.write(parent, tag.tail, base)

    def write(self, parent, text: str | None, base: Plain, empty: bool = False) -> None:
        """`text` written at the end of `parent`, with `base`'s formatting (nothing where
        it is empty, unless `empty`: an empty run)."""
        from lxml import etree

        text = text or ""
        if not text and not (empty and not self.dialect.bare):
            return
        d = self.dialect
        if d.bare:
            if len(parent):
                parent[-1].tail = (parent[-1].tail or "") + text
            else:
                parent.text = (parent.text or "") + text
            return
        if base.plain_t:
            holder = etree.SubElement(parent, d.text)
        else:
            run = etree.SubElement(parent, d.run)
            if base.props is not None:
                run.append(deepcopy(base.props))
            holder = etree.SubElement(run, d.text)
        holder.text = text
        if d.spaces_marked and (text != text.strip() or "  " in text):
            holder.set(XML_SPACE, "preserve")


_BARE = object()  # (ODF's text, by itself in a paragraph)


def _holder(wrap, d: Dialect):
    """The element that holds a wrap's runs: the wrap, or its child that `d.held` names
    (None where it has none: the wrap is kept as it is)."""
    for tag, held in d.held:
        if wrap.tag == tag:
            return wrap.find(held)
    return wrap


def _field(run, d: Dialect) -> str:
    found = run.find(d.field[0])
    return found.get(d.field[1], "") if found is not None else ""


def _same(*elements) -> Callable[[], list]:
    """Elements kept: the same ones, in their place."""
    return lambda: list(elements)


def _in_run(run, props, child) -> Callable[[], list]:
    """A run's element that is no text (a tab, a break, a drawing, a reference), kept:
    a run of its own, with the run's formatting."""

    def make() -> list:
        from lxml import etree

        own = etree.Element(run.tag, nsmap=None)
        if props is not None:
            own.append(deepcopy(props))
        own.append(child)
        return [own]

    return make
