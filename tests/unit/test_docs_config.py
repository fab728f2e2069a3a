"""The documentation's statements about the config and the options hold in the code.

- docs/configuration.md names every section of `Config` (and no other), documents every
  field of each section's dataclass in that section (and no key that is not one), and
  its default column agrees with the dataclass's defaults;
- every `section.key` the pages write in backticks (`train.lr`, `data.train.1.weight`)
  is a config key;
- every `--flag` a page shows for an `mtkit <command>` (in a shell block, in an inline
  command, or inline after the command's bare name: `translate --split/--no-split`) is
  one of that command's options in the Typer app, and a bare inline `--flag` is an
  option of some mtkit command or of a script under benchmarks/.

Each check is a function of the documents' text that returns its faults, so the test at
the end can show that a renamed key or option is caught.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import typing
from pathlib import Path

import typer

import mtkit.cli
from mtkit.core.config import Config

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = [f.name for f in dataclasses.fields(Config)]
EXTENSIONS = {"bin", "json", "pt", "safetensors", "spm", "yaml", "gz", "md", "txt", "en", "de"}


def doc_pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def where(page: Path) -> str:
    return f"docs/{page.name}" if page.parent.name == "docs" else page.name


def yaml_name(field: dataclasses.Field) -> str:
    return field.name.rstrip("_")  # `from_` is `from` in YAML


def section_class(name: str) -> type:
    return typing.get_type_hints(Config)[name]


def nested(cls: type) -> dict[str, type]:
    """The fields of `cls` that are dataclasses themselves (a corpus, `multiway`)."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = typing.get_args(hint)
        inner = args[0] if args and dataclasses.is_dataclass(args[0]) else hint
        if dataclasses.is_dataclass(inner):
            out[name] = inner
    return out


def outside_fences(text: str) -> str:
    """`text` with its fenced blocks' lines blank (line numbers kept)."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)


def config_sections(text: str) -> dict[str, str]:
    """configuration.md's `## `name`` sections: name -> its text."""
    parts = re.split(r"^## `(\w+)`\s*$", text, flags=re.M)
    sections = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        sections[name] = re.split(r"^## ", body, flags=re.M)[0]
    return sections


def table_rows(body: str) -> list[tuple[list[str], str]]:
    """Each table row's keys (the backticked names of its first cell) and its default."""
    rows = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not line.lstrip().startswith("|") or set(cells[0]) <= set("- "):
            continue
        keys = re.findall(r"`(\w+)`", cells[0])
        if keys:
            rows.append((keys, cells[1]))
    return rows


def same_default(shown: str, value: typing.Any) -> bool:
    """Whether a default as the table writes it (`bpe`, 2,000,000, 7e-4, none, 0 (off),
    `[]` (all)) is the dataclass's."""
    shown = re.sub(r"\s*\(.*\)$", "", shown.replace("`", "")).strip()
    if shown == value:
        return True
    if shown in ("none", "[]"):
        return not value
    if isinstance(value, bool):
        return shown == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(shown.replace(",", "")) == value
        except ValueError:
            return False
    return shown == str(value)


def config_faults(text: str) -> list[str]:
    """What configuration.md (`text`) says about the config that the code does not."""
    faults = []
    intro = text.split("\n## ", 1)[0].split("\n\n")[1]  # after the title
    named = re.findall(r"`(\w+)`", intro)
    if sorted(named) != sorted(SECTIONS):
        faults.append(f"the introduction names the sections {named}, the config has {SECTIONS}")
    sections = config_sections(text)
    if sorted(sections) != sorted(SECTIONS):
        faults.append(f"the page has sections {sorted(sections)}, the config {sorted(SECTIONS)}")
    for name, body in sections.items():
        if name not in SECTIONS or not dataclasses.is_dataclass(section_class(name)):
            continue
        cls = section_class(name)
        fields = {yaml_name(f): f for f in dataclasses.fields(cls)}
        documented = set()
        for keys, shown in table_rows(body):
            values = [v.strip() for v in shown.split(",")] if shown else []
            if len(values) != len(keys):  # one default for all, or 2,000,000
                values = [shown] * len(keys)
            for key, value in zip(keys, values, strict=True):
                documented.add(key)
                if key not in fields:
                    faults.append(f"{name}.{key} is documented but not a config key")
                    continue
                default = fields[key].default
                if (
                    value
                    and default is not dataclasses.MISSING
                    and not dataclasses.is_dataclass(default)
                ):
                    if not same_default(value, default):
                        faults.append(f"{name}.{key}: documented default {value!r}, is {default!r}")
        for key in sorted(fields.keys() - documented):
            faults.append(f"{name}.{key} is a config key the page does not document")
        mentioned = set(re.findall(r"`(\w+)`", outside_fences(body)))
        for key, inner in nested(cls).items():
            for sub in dataclasses.fields(inner):
                if yaml_name(sub) not in mentioned:
                    faults.append(f"{name}.{key}'s key {yaml_name(sub)} is not documented")
    return faults


def key_exists(parts: list[str]) -> bool:
    """Whether a dotted key (`data.train.1.weight`) is a key of the config."""
    cls: typing.Any = Config
    for part in parts:
        if part.isdigit():
            continue  # an item of a list of corpora
        if not dataclasses.is_dataclass(cls):
            return False
        hints = typing.get_type_hints(cls)
        names = {yaml_name(f): f.name for f in dataclasses.fields(cls)}
        if part not in names:
            return False
        hint = hints[names[part]]
        args = typing.get_args(hint)
        cls = args[0] if args and dataclasses.is_dataclass(args[0]) else hint
    return True


def dotted_key_faults(pages: list[Path]) -> list[str]:
    faults = []
    pattern = re.compile(rf"(?<![\w./-])((?:{'|'.join(SECTIONS)})(?:\.\w+)+)")
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for span in re.findall(r"`([^`]+)`", line):
                for key in pattern.findall(span):
                    parts = key.split(".")
                    if parts[-1] in EXTENSIONS:
                        continue  # a file name: model.bin, train.en
                    if not key_exists(parts):
                        faults.append(f"{where(page)}:{number}: `{key}` is not a config key")
    return faults


def cli_commands() -> dict[str, set[str]]:
    """Each command's path (`translate`, `explain shapes`) and its option names."""
    out = {}

    def walk(command, path: list[str]) -> None:
        names = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
        out[" ".join(path)] = {o for o in names if o.startswith("-")} | {"--help"}
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(mtkit.cli.app), [])
    return out


def shown_commands(pages: list[Path]) -> list[tuple[str, list[str]]]:
    """(where, words after `mtkit`) of every command the pages show: the lines of shell
    blocks and inline code, cut at pipes, lists and comments; an inline span that starts
    with a command's bare name (`translate --shortlist`) counts as that command."""
    commands = list(cli_commands())
    out = []
    for page in pages:
        text, language = page.read_text(encoding="utf-8"), None
        lines = text.splitlines()
        for number, line in enumerate(lines, 1):
            fence = re.match(r"^\s*```\s*(\w*)", line)
            if fence:
                language = None if language is not None else fence.group(1) or "text"
                continue
            if language == "console":  # `$ mtkit ...`, unless shown failing on purpose
                shows_error = number < len(lines) and lines[number].startswith("error:")
                spans = [line[2:]] if line.startswith("$ ") and not shows_error else []
            elif language is not None:
                spans = [line] if language in ("bash", "sh", "shell") else []
            else:
                spans = re.findall(r"`([^`]+)`", line)
            for span in spans:
                try:
                    lexer = shlex.shlex(span, posix=True, punctuation_chars=";&|<>")
                    lexer.whitespace_split, lexer.commenters = True, "#"
                    words = list(lexer)
                except ValueError:
                    continue
                starts = [i for i, w in enumerate(words) if w == "mtkit"]
                if language is None and words and words[0] in commands and words[0]:
                    starts.append(-1)
                for start in starts:
                    rest = []
                    for word in words[start + 1 :]:
                        if word and set(word) <= set(";&|<>"):
                            break
                        rest.append(word)
                    out.append((f"{where(page)}:{number}", rest))
    return out


def bare_flags(pages: list[Path]) -> list[tuple[str, str]]:
    """(where, flag) of each inline span that is an option alone (`--workers 2`)."""
    out = []
    for page in pages:
        for number, line in enumerate(outside_fences(page.read_text("utf-8")).splitlines(), 1):
            for span in re.findall(r"`(--[a-z][\w-]*)[^`]*`", line):
                out.append((f"{where(page)}:{number}", span))
    return out


# Other tools' options that the pages name beside mtkit's own, and whose they are.
FOREIGN = {"--cpu-threads": "Marian"}


def flag_faults(pages: list[Path], benchmarks: Path = ROOT / "benchmarks") -> list[str]:
    commands = cli_commands()
    faults = []
    for where, words in shown_commands(pages):
        path: list[str] = []
        while words and " ".join([*path, words[0]]) in commands:
            path.append(words.pop(0))
        options = commands[" ".join(path)]
        for word in words:
            if not re.match(r"^--?[a-zA-Z]", word):
                continue
            for flag in word.split("=", 1)[0].split("/"):  # `--split/--no-split`: both
                if flag not in options:
                    faults.append(f"{where}: `mtkit {' '.join(path)}` has no option {flag}")
    every = set().union(*commands.values())
    scripts = "\n".join(
        p.read_text("utf-8")
        for p in benchmarks.rglob("*")
        if p.is_file() and p.suffix in (".py", ".sh")
    )
    for where, flag in bare_flags(pages):
        if (
            flag not in every
            and flag not in FOREIGN
            and f'"{flag}"' not in scripts
            and f"{flag} " not in scripts
        ):
            faults.append(f"{where}: {flag} is no option of mtkit or of a benchmark")
    return faults


def test_configuration_page_documents_every_config_key_and_only_those():
    assert config_faults((ROOT / "docs" / "configuration.md").read_text("utf-8")) == []


def test_dotted_config_keys_in_the_docs_are_config_keys():
    assert dotted_key_faults(doc_pages()) == []


def test_options_shown_for_mtkit_commands_are_their_options():
    assert len(shown_commands(doc_pages())) >= 100
    assert flag_faults(doc_pages()) == []


def test_the_checks_catch_a_renamed_key_or_option(tmp_path):
    """A copy of the docs with one key, one dotted key and one option renamed fails."""
    text = (ROOT / "docs" / "configuration.md").read_text("utf-8")
    renamed = text.replace("`, `keep_last` |", "`, `keep_latest` |", 1)
    renamed = renamed.replace("| `teacher` | none |", "| `teacher` | `best.pt` |", 1)
    assert renamed != text
    faults = config_faults(renamed)
    assert "train.keep_latest is documented but not a config key" in faults
    assert "train.keep_last is a config key the page does not document" in faults
    assert any(f.startswith("distill.teacher: documented default") for f in faults)
    assert config_faults(text.replace("`decode` and `distill`", "`decode`", 1)) != []

    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "translation.md"
    page.write_text(
        "Use `translate --split/--no-splits` or `train.learning_rate`.\n\n"
        "```bash\nmtkit translate -m best.pt --beams 5 | sort\nmtkit eval --hyp h --ref r\n```\n"
        "A bare `--no-such-flag`.\n",
        "utf-8",
    )
    (tmp_path / "README.md").write_text("`mtkit serve --prot 80`\n", "utf-8")
    pages = doc_pages(tmp_path)
    assert dotted_key_faults(pages) == [
        "docs/translation.md:1: `train.learning_rate` is not a config key"
    ]
    assert flag_faults(pages) == [
        "README.md:1: `mtkit serve` has no option --prot",
        "docs/translation.md:1: `mtkit translate` has no option --no-splits",
        "docs/translation.md:4: `mtkit translate` has no option --beams",
        "docs/translation.md:7: --no-such-flag is no option of mtkit or of a benchmark",
    ]
