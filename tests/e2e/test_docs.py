"""The documentation shows only commands that work: README.md and every page under docs/.

Every `mtkit ...` command in a fenced code block (bash or console, also after a pipe, after
`&&`, or as `torchrun ... -m mtkit ...`) is parsed by the real command line, without being
run: the subcommand must exist, every option name must be one it takes, and every value
must convert (click's own parsing, `make_context(resilient_parsing=False)`). A command
that names a config under `configs/` must name a real one, and its `--set` overrides
must be keys of it (the config is loaded as the command would load it). A file the docs
name under `configs/`, `data/`, `benchmarks/` or `docs/` must exist, and a
`python benchmarks/X.py --option` command must name an option the script defines.

Commands written inline, in prose and in tables, are checked too: an `mtkit ...` mention
must name real commands and options (it may leave out required ones or use placeholders
such as DIR), and an inline `python benchmarks/X.py ...` is checked as in a block (the
performance page's reproduction commands live in its tables).

A YAML block that shows a config, or a data split's corpora, must load as a config.

A `console` block (`$ mtkit ...` followed by its output) is run for real, and each line of
the output it shows must appear in what the command prints; so are the documented
`mtkit explain shapes|params` commands on preset configs, and every documented command
that uses a model or files (`translate`, `eval`, `average`, `export`, `explain
attention`), in a folder holding a tiny trained run under the names the docs use.
`docs/plot_curve.py` is run on the metrics it documents. The stage commands on preset
configs (`tokenizer`, `distill`, `preprocess`, `train`, `run`) run for minutes to hours: their
configs and overrides are loaded here, and the chain itself runs on tiny configs in the
other tests in tests/e2e/; `serve` and `import` from the hub run in their own tests.

README.md stays a front door: at most 300 lines, no commit hashes, and every relative
link in it resolves (a page, a file, a heading's anchor). The site itself is checked by
`mkdocs build --strict` (in CI; here too where MkDocs is installed).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer

import mtkit.cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
SEPARATORS = {"|", "||", "&&", ";", "&"}
REDIRECTIONS = {"<", ">", ">>", "2>", "2>>", "&>"}
REPO_PREFIXES = ("configs/", "data/", "benchmarks/", "docs/")
HEX_WORD = re.compile(r"(?<![\w-])[0-9a-f]{7,40}(?![\w-])")


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, counted from 1
    language: str
    text: str


@dataclass
class Command:
    where: str  # file:line, for messages
    argv: list[str]  # after `mtkit`
    expected: list[str] = field(default_factory=list)  # a console block's shown output


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("**/*.md"))]


def fenced_blocks(path: Path) -> list[Block]:
    blocks, lines = [], path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, language = opening.groups()
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        blocks.append(Block(path, i + 1, language.lower(), "\n".join(body)))
        i = j + 1
    return blocks


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(offset, line) of each command line, continuation lines (`\\`) joined."""
    out, pending, start = [], "", 0
    for k, line in enumerate(text.splitlines()):
        if not pending:
            start = k
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def tokens(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def segments(words: list[str]) -> list[list[str]]:
    """A shell line's simple commands: split at pipes and lists, redirections dropped."""
    out, current, skip = [], [], False
    for word in words:
        if skip:
            skip = False
        elif word in SEPARATORS:
            out.append(current)
            current = []
        elif word in REDIRECTIONS or word.endswith(("<", ">")) and set(word) <= set("0123&<>"):
            skip = True
        else:
            current.append(word)
    out.append(current)
    return [s for s in out if s]


def mtkit_argv(segment: list[str]) -> list[str] | None:
    """The arguments after `mtkit` when the segment runs mtkit, else None."""
    words = list(segment)
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):  # VAR=value prefixes
        words.pop(0)
    if not words:
        return None
    if words[0] == "mtkit":
        return words[1:]
    if words[0] in ("python", "python3", "torchrun"):
        for k in range(1, len(words) - 1):
            if words[k] == "-m":
                return words[k + 2 :] if words[k + 1] == "mtkit" else None
    return None


def script_argv(segment: list[str]) -> list[str] | None:
    """`python benchmarks/X.py ...` or `bash benchmarks/X.sh`: the script and its args."""
    words = [w for w in segment if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
    if (
        len(words) >= 2
        and words[0] in ("python", "python3", "bash")
        and words[1].startswith(REPO_PREFIXES)
    ):
        return words[1:]
    return None


def collect() -> tuple[list[Command], list[tuple[str, list[str]]], list[tuple[str, str]]]:
    """Every mtkit command, every repository script command, every repository path named
    in a command, from README.md and docs/."""
    commands, scripts, paths = [], [], []
    for path in doc_files():
        for block in fenced_blocks(path):
            if block.language not in SHELL_LANGUAGES:
                continue
            rel = path.relative_to(ROOT)
            if block.language == "console":
                lines = block.text.splitlines()
                for k, line in enumerate(lines):
                    if not line.startswith("$ "):
                        continue
                    shown = []
                    for after in lines[k + 1 :]:
                        if after.startswith("$ "):
                            break
                        shown.append(after)
                    for segment in segments(tokens(line[2:])):
                        argv = mtkit_argv(segment)
                        if argv is not None:
                            commands.append(Command(f"{rel}:{block.line + 1 + k}", argv, shown))
                continue
            for offset, line in shell_lines(block.text):
                where = f"{rel}:{block.line + 1 + offset}"
                for segment in segments(tokens(line)):
                    argv = mtkit_argv(segment)
                    if argv is not None:
                        commands.append(Command(where, argv))
                    script = script_argv(segment)
                    if script is not None:
                        scripts.append((where, script))
                    for word in segment:
                        value = word.partition("=")[2] if word.startswith("--") else word
                        if value.startswith(REPO_PREFIXES):
                            paths.append((where, value))
    return commands, scripts, paths


def prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of a page outside its fenced blocks."""
    out, fence = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if fence is None and re.match(r"^(`{3,}|~{3,})", stripped):
            fence = stripped[:3]
        elif fence is not None and stripped.startswith(fence):
            fence = None
        elif fence is None:
            out.append((number, line))
    return out


def collect_inline() -> tuple[list[Command], list[tuple[str, list[str]]], list[tuple[str, str]]]:
    """Commands written inline, in prose and tables (`mtkit run --config ...`,
    `python benchmarks/X.py ...`): mtkit ones are often a command's name and some of its
    options rather than a whole command line, so they are checked by name (below)."""
    commands, scripts, paths = [], [], []
    for path in doc_files():
        rel = path.relative_to(ROOT)
        lines = prose(path)
        text = "\n".join(line for _, line in lines)
        for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
            number = lines[text.count("\n", 0, match.start())][0]
            where = f"{rel}:{number}"
            try:
                words = tokens(" ".join(match.group(1).split()))
            except ValueError:
                continue
            for segment in segments(words):
                argv = mtkit_argv(segment)
                if argv is not None:
                    commands.append(Command(where, argv))
                script = script_argv(segment)
                if script is not None:
                    scripts.append((where, script))
                if argv is not None or script is not None:
                    for word in segment:
                        value = word.partition("=")[2] if word.startswith("--") else word
                        if value.startswith(REPO_PREFIXES):
                            paths.append((where, value))
    return commands, scripts, paths


COMMANDS, SCRIPTS, PATHS = collect()
INLINE, INLINE_SCRIPTS, INLINE_PATHS = collect_inline()
SCRIPTS += INLINE_SCRIPTS
PATHS += INLINE_PATHS


def root_command():
    """The CLI's click command (Typer's own click: `typer._click` in recent Typer)."""
    return typer.main.get_command(mtkit.cli.app)


class DocCommandError(Exception):
    pass


def pending_args(ctx) -> list[str]:
    """What a group's context left for its subcommand (click 8.1 and 8.2+ alike)."""
    protected = ctx.__dict__.get("_protected_args")
    if protected is None:
        protected = ctx.__dict__.get("protected_args", [])
    return [*protected, *ctx.args]


def parse(argv: list[str]) -> tuple[list[str], dict]:
    """Parse `mtkit ARGV` as the CLI would, down to the leaf command, without running it:
    the command's path and its parameters. Raises DocCommandError with click's message
    for an unknown command or option, a missing value, or a value that does not convert."""
    command, ctx, names = root_command(), None, []
    try:
        ctx = command.make_context("mtkit", list(argv), resilient_parsing=False)
        while hasattr(command, "resolve_command"):  # a group: go down to its subcommand
            rest = pending_args(ctx)
            if not rest:
                raise DocCommandError(f"`{' '.join(['mtkit', *names])}` needs a subcommand")
            name, command, rest = command.resolve_command(ctx, rest)
            names.append(name)
            ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=False)
    except DocCommandError:
        raise
    except Exception as e:  # click's UsageError, NoSuchOption, BadParameter, ...
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        raise DocCommandError(message) from None
    if ctx.args:
        raise DocCommandError(f"unexpected extra arguments {ctx.args}")
    return names, dict(ctx.params)


def option_value(argv: list[str], *names: str) -> list[str]:
    values = []
    for k, word in enumerate(argv):
        for name in names:
            if word == name and k + 1 < len(argv):
                values.append(argv[k + 1])
            elif name.startswith("--") and word.startswith(name + "="):
                values.append(word.split("=", 1)[1])
    return values


def config_loader():
    for module in ("mtkit.core.config", "mtkit.core.config"):
        try:
            return importlib.import_module(module).load_config
        except (ImportError, AttributeError):
            continue
    pytest.fail("no load_config in mtkit.core.config or mtkit.core.config")


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 60, f"only {len(COMMANDS)} mtkit commands found in the docs"
    shown = {parse(c.argv)[0][0] for c in COMMANDS if not shows_an_error(c)}
    every = set(root_command().commands)
    assert every - shown == set(), f"commands the docs never show: {sorted(every - shown)}"


def test_every_code_block_says_its_language():
    """So that no command hides from these checks in an unlabelled block."""
    unlabelled = [
        f"{b.path.relative_to(ROOT)}:{b.line}"
        for p in doc_files()
        for b in fenced_blocks(p)
        if not b.language
    ]
    assert unlabelled == [], "label each fence: ```bash, ```console, ```yaml, ```text, ..."


def test_readme_has_the_set_up_commands_first():
    text = README.read_text(encoding="utf-8")
    first = fenced_blocks(README)[0].text.splitlines()
    assert first == [
        "pip install torch==2.13.0 -e . && mtkit run --config configs/multi30k.yaml",
        "pip install -e '.[dev]' && python -m pytest",
    ]
    assert text.index("pip install torch==2.13.0") < text.index("\n## ")


def shows_an_error(command: Command) -> bool:
    """A console block that shows the command failing, on purpose (run for real below)."""
    return any(line.startswith(("error:", "config error:")) for line in command.expected)


@pytest.mark.parametrize(
    "command",
    [c for c in COMMANDS if not shows_an_error(c)],
    ids=lambda c: f"{c.where} {' '.join(c.argv[:2])}",
)
def test_each_command_parses(command: Command):
    try:
        parse(command.argv)
    except DocCommandError as e:
        pytest.fail(f"{command.where}: `mtkit {shlex.join(command.argv)}`: {e}")


def placeholder(word: str) -> bool:
    return word == "..." or bool(re.fullmatch(r"[A-Z][A-Z0-9_]*", word))


def check_names(argv: list[str]) -> None:
    """The subcommands and option names of an inline mention exist (values, required
    options and placeholders such as DIR or ... are not checked)."""
    command, words, names = root_command(), [w for w in argv if w != "..."], ["mtkit"]

    def options(cmd) -> set[str]:
        return {"--help"} | {
            o for p in cmd.params for o in [*p.opts, *p.secondary_opts] if o.startswith("-")
        }

    def check_option(cmd, word: str) -> None:
        for part in word.split("/"):  # `--terms/--glossary`: both
            name = part.split("=", 1)[0]
            if name and name not in options(cmd):
                raise DocCommandError(f"`{' '.join(names)}` has no option {name}")

    while hasattr(command, "commands"):
        while words and words[0].startswith("-"):
            check_option(command, words.pop(0))
        if not words or placeholder(words[0]):
            return
        name = words.pop(0)
        if name not in command.commands:
            raise DocCommandError(f"`{' '.join(names)}` has no command {name}")
        command = command.commands[name]
        names.append(name)
    for word in words:
        if word.startswith("-") and not re.fullmatch(r"-?\d[\d.e+-]*", word):
            check_option(command, word)


@pytest.mark.parametrize("command", INLINE, ids=lambda c: f"{c.where} {' '.join(c.argv[:2])}")
def test_each_inline_mention_names_real_commands_and_options(command: Command):
    try:
        check_names(command.argv)
    except DocCommandError as e:
        pytest.fail(f"{command.where}: `mtkit {' '.join(command.argv)}`: {e}")


def test_configs_named_by_commands_are_real_and_their_overrides_are_keys():
    load_config = config_loader()
    checked = 0
    for command in COMMANDS + INLINE:
        configs = option_value(command.argv, "-c", "--config")
        overrides = option_value(command.argv, "--set")
        for config in configs:
            if not config.startswith("configs/"):
                continue  # a placeholder such as my-finetune.yaml, shown beside its YAML
            assert (ROOT / config).is_file(), f"{command.where}: no {config}"
            if shows_an_error(command):
                continue  # a console block that shows this very error
            try:
                load_config(ROOT / config, overrides)
            except Exception as e:  # a ConfigError: one line, as the CLI prints it
                pytest.fail(f"{command.where}: {config} with {overrides}: {e}")
            checked += 1
    assert checked >= 20


SECTIONS = {"run_dir", "data", "tokenizer", "model", "train", "decode"}


def yaml_configs() -> list[tuple[str, dict]]:
    """The YAML blocks that show a config or a part of one: each whole block whose keys are
    config sections, and each top-level entry of a block of data splits (`train: ...`,
    shown as alternatives), as the `data:` section it belongs in."""
    import yaml

    out = []
    for path in doc_files():
        for block in fenced_blocks(path):
            if block.language != "yaml":
                continue
            where = f"{path.relative_to(ROOT)}:{block.line}"
            data = yaml.safe_load(block.text)
            if isinstance(data, dict) and set(data) <= {"train", "valid", "test"}:
                chunks = re.split(r"\n(?=\S)", block.text.strip())
                out.extend((where, {"data": yaml.safe_load(chunk)}) for chunk in chunks)
            elif isinstance(data, dict) and set(data) <= SECTIONS:
                out.append((where, data))
    return out


def test_yaml_shown_is_a_valid_config(tmp_path):
    import yaml

    load_config = config_loader()
    shown = yaml_configs()
    assert len(shown) >= 5
    for k, (where, data) in enumerate(shown):
        path = tmp_path / f"shown{k}.yaml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        try:
            load_config(path)
        except Exception as e:  # a ConfigError: one line
            pytest.fail(f"{where}: the config shown does not load: {e}")


def test_repository_paths_named_in_commands_exist():
    missing = [
        f"{where}: {path}" for where, path in PATHS if not (ROOT / path.rstrip("/")).exists()
    ]
    assert missing == []


def test_benchmark_commands_name_real_scripts_and_options():
    assert SCRIPTS, "no benchmark commands found"
    for where, (script, *args) in SCRIPTS:
        path = ROOT / script
        assert path.is_file(), f"{where}: no {script}"
        source = path.read_text(encoding="utf-8")
        for word in args:
            if word.startswith("-") and not re.fullmatch(r"-?\d[\d.e+-]*", word):
                option = word.split("=", 1)[0]
                assert f'"{option}"' in source, f"{where}: {script} defines no {option}"


def run_mtkit(argv: list[str], capsys) -> tuple[int, str]:
    """`mtkit ARGV` through the console script's own entry point (`mtkit.cli.main`: its
    one-line errors and exit codes), in this process; its exit code and what it printed.
    The process-wide things main() sets (the SIGTERM handler, logging) are put back."""
    import logging
    import signal

    saved_argv, saved_term = sys.argv, signal.getsignal(signal.SIGTERM)
    root = logging.getLogger()
    saved_logging = (root.handlers[:], root.level)
    capsys.readouterr()
    sys.argv = ["mtkit", *argv]
    try:
        with pytest.raises(SystemExit) as exit_info:
            mtkit.cli.main()
    finally:
        sys.argv = saved_argv
        signal.signal(signal.SIGTERM, saved_term)
        root.handlers[:], _ = saved_logging
        root.setLevel(saved_logging[1])
    out, err = capsys.readouterr()
    code = exit_info.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out + err


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.expected], ids=lambda c: c.where)
def test_console_blocks_print_what_they_show(command: Command, capsys):
    code, output = run_mtkit(command.argv, capsys)
    printed = [" ".join(line.split()) for line in output.splitlines()]
    for line in command.expected:
        line = " ".join(line.split())
        if line.endswith("..."):  # shown shortened: what it starts with
            line = line[:-3].rstrip()
        if line:
            assert any(line in out for out in printed), (
                f"{command.where}: `mtkit {shlex.join(command.argv)}` did not print {line!r}; "
                f"it printed:\n{output}"
            )
    assert code == (2 if shows_an_error(command) else 0), output


CHEAP = [
    c
    for c in COMMANDS
    if c.argv[:1] == ["explain"]
    and c.argv[1:2] != ["attention"]
    and not c.expected
    and all(v.startswith("configs/") for v in option_value(c.argv, "-c", "--config") or ["-"])
]


@pytest.mark.parametrize("command", CHEAP, ids=lambda c: f"{c.where} {' '.join(c.argv[:2])}")
def test_documented_explain_commands_run(command: Command, capsys):
    """`explain shapes` and `explain params` on a preset config need no trained model:
    they are run for real (a fresh model, seconds)."""
    code, output = run_mtkit(command.argv, capsys)
    assert code == 0, f"{command.where}: `mtkit {shlex.join(command.argv)}`:\n{output}"


def test_the_training_curve_script_draws_the_documented_metrics(tmp_path):
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("plot_curve", DOCS / "plot_curve.py")
    plot_curve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_curve)
    train, valid = plot_curve.read_metrics(DOCS / "assets" / "copy_metrics.jsonl")
    assert len(train) >= 50 and valid and valid[-1][2] == 100.0
    out = tmp_path / "curve.png"
    plot_curve.plot(DOCS / "assets" / "copy_metrics.jsonl", out, "copy")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines (at most 300)"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_commit_hashes_in_user_documentation(path: Path):
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for word in HEX_WORD.findall(line):
            if re.search(r"\d", word) and re.search(r"[a-f]", word):
                found.append(f"{path.relative_to(ROOT)}:{number}: {word}")
    assert found == [], "commit hashes belong in git, not in the documentation"


def heading_anchors(path: Path) -> set[str]:
    """The anchors MkDocs (and GitHub, for these headings) gives a page's headings."""
    anchors, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            text = re.sub(r"[`*_]", "", m.group(1)).lower()
            text = re.sub(r"[^\w\s-]", "", text)
            anchors.add(re.sub(r"[\s-]+", "-", text).strip("-"))
    return anchors


def test_readme_links_resolve():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text)
    assert len(links) >= 15
    for link in links:
        if re.match(r"^[a-z]+:", link):
            continue  # an outside address
        target, _, anchor = link.partition("#")
        path = (README.parent / target) if target else README
        assert path.exists(), f"README.md links to {link}: no such file"
        if anchor:
            assert anchor in heading_anchors(path), f"README.md links to {link}: no such heading"


def test_every_page_is_in_the_site_navigation():
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in pages(item)]
        if isinstance(node, dict):
            return [p for value in node.values() for p in pages(value)]
        return []

    listed = set(pages(config["nav"]))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.glob("**/*.md")}
    assert listed == on_disk
    assert config.get("strict") is True


def test_the_site_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("MkDocs and mkdocs-material are not installed (pip install -e '.[docs]')")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, run.stdout + run.stderr


# Commands that use a model or files, run for real in a folder that holds what they name:
# `best.pt` and `runs/.../checkpoints/` are the tiny trained run's (tests/conftest.py),
# `deploy/` its CTranslate2 export, `in.en`/`test.en` a few test2016 sentences, and so on.
# Where a command reads stdin, it gets one sentence (a jsonl line for `--format jsonl`).
RUNS_FOR_REAL = {"translate", "eval", "average", "export", "explain"}
# What runs elsewhere, and why not here (each by the first argument after `mtkit`):
ELSEWHERE = {
    "serve": "a server that runs until stopped: tests/e2e/test_serve.py starts one",
    "import": "names a Hugging Face hub model (no network here): tests/e2e/test_import_cli.py",
}
MULTILINGUAL = "a multilingual model: tests/e2e/test_multilingual.py trains and translates one"


def argv_names(argv: list[str], folder: str) -> bool:
    return any(a.rstrip("/") == folder for a in argv)


def model_commands() -> list[Command]:
    return [
        c
        for c in COMMANDS
        if c.argv[:1] and c.argv[0] in RUNS_FOR_REAL and not c.expected and c not in CHEAP
    ]


@pytest.fixture(scope="module")
def doc_folder(trained, tmp_path_factory) -> Path:
    """What the documented commands name, built once (tests copy it)."""
    import shutil

    from conftest import read_lines, write_lines

    root = tmp_path_factory.mktemp("docs-folder")
    checkpoints = trained / "run" / "checkpoints"
    best = checkpoints / "best.pt"
    for run in ("multi30k", "my-finetune"):
        shutil.copytree(checkpoints, root / "runs" / run / "checkpoints")
    for name in ("best.pt", "a/best.pt", "b/best.pt", "a.pt", "b.pt", "c.pt"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(best, root / name)
    # a distilled student's checkpoint: the tiny model with a lexical shortlist
    import numpy as np

    from mtkit.core.checkpoint import load_checkpoint, save_checkpoint
    from mtkit.search.shortlist import build_shortlist

    payload = load_checkpoint(best)
    size = payload["model"]["tgt_embed.tokens.weight"].size(0)
    ids = [np.arange(4, size)]
    payload["shortlist"] = build_shortlist(ids, ids, size, size).as_entry()
    student = root / "runs" / "multi30k-student" / "checkpoints" / "average.pt"
    student.parent.mkdir(parents=True)
    save_checkpoint(payload, student)
    # opus-en-de.pt: a tiny random OPUS-MT model in the Hugging Face layout, imported
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("safetensors"):
        from hfmarian import marian_folder

        from conftest import cli

        imported = cli("import", marian_folder(root / "opus-mt"), "-o", root / "opus-en-de.pt")
        assert imported.exit_code == 0, imported.output
    english, german = read_lines("test2016.en.gz", 4), read_lines("test2016.de.gz", 4)
    for name, lines in (
        ("in.en", english),
        ("test.en", english),
        ("ref.de", german),
        ("test.de", german),
        ("out.de", german[::-1]),
        ("ref.fr", read_lines("test2016.fr.gz", 4)),
        ("out.fr", read_lines("test2016.fr.gz", 4)[::-1]),
        ("prefixes.de", ["Ein", "", "Zwei", ""]),
        ("terms.tsv", ["Hund", "", "Mann\tFrau", ""]),
    ):
        write_lines(root / name, lines)
    write_lines(root / "glossary.tsv", ["dog\tHund", "man\tMann"])
    # documents (docs/documents.md)
    (root / "page.html").write_text("<p>A man is <b>riding</b> a bike. Two dogs play.</p>\n")
    (root / "doc.xml").write_text("<doc><para>A <term>dog</term> runs.</para></doc>\n")
    (root / "segments.txt").write_text(
        "Select <parmname>Multiple Languages</parmname> and add them.\nTap <ph>OK</ph>.\n"
    )
    (root / "subs.srt").write_text("1\n00:00:01,000 --> 00:00:02,000\nA man runs.\n")
    (root / "messages.po").write_text('msgid "A dog and %s."\nmsgstr ""\n')
    (root / "strings.xlf").write_text(
        '<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2"><file '
        'original="a" source-language="en" datatype="plaintext"><body><trans-unit id="1">'
        '<source>A <g id="1">dog</g> runs.</source></trans-unit></body></file></xliff>\n'
    )
    if importlib.util.find_spec("docx"):  # (python-docx: the dev extra)
        from officefiles import make_docx

        (root / "report.docx").write_bytes(make_docx())
    return root


@pytest.mark.parametrize(
    "command", model_commands(), ids=lambda c: f"{c.where} {' '.join(c.argv[:1])}"
)
def test_documented_model_commands_run(
    command: Command, doc_folder, request, tmp_path, monkeypatch, capsys
):
    import io
    import shutil

    if "--tgt-lang" in command.argv:
        pytest.skip(MULTILINGUAL)
    if "opus-en-de.pt" in command.argv and not (doc_folder / "opus-en-de.pt").exists():
        pytest.skip("an imported model: needs the hf extra (transformers, safetensors)")
    if "--among" in command.argv:
        pytest.importorskip("py3langid", reason="`eval --lang` needs the langid extra")
    folder = tmp_path / "folder"
    shutil.copytree(doc_folder, folder)
    exporting = command.argv[0] == "export"
    if argv_names(command.argv, "deploy") and not exporting:  # a CTranslate2 export
        shutil.copytree(request.getfixturevalue("exported"), folder / "deploy")
    monkeypatch.chdir(folder)
    jsonl = "jsonl" in (option_value(command.argv, "--format") or [])
    line = '{"src": "A dog runs.", "constraints": ["Hund"]}' if jsonl else "A dog runs."
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{line}\n".encode())))
    argv = command.argv
    if exporting and "ctranslate2" in argv:
        pytest.importorskip("ctranslate2", reason="CTranslate2 export needs the ct2 extra")
    code, output = run_mtkit(argv, capsys)
    assert code == 0, (
        f"{command.where}: `mtkit {shlex.join(command.argv)}` exited {code}:\n{output}"
    )
    for out in option_value(argv, "-o", "--output") or []:
        assert (folder / out).exists(), f"{command.where}: no {out} written"


def test_every_documented_command_is_run_somewhere():
    """Each documented command is run here or by a named test elsewhere; none is only parsed
    unless it trains (the stage commands on preset configs: tests/e2e/test_cli.py and
    test_copy_task.py run the chain on tiny configs, and their configs and overrides are
    loaded above)."""
    stages = {"tokenizer", "distill", "preprocess", "train", "run"}
    for c in COMMANDS:
        assert c.argv[0] in RUNS_FOR_REAL | set(ELSEWHERE) | stages or c.expected, c.where


PYTHON_PAGES = ("python.md", "clients.md")  # pages whose Python examples run here


def python_blocks() -> list[Block]:
    return [
        b for name in PYTHON_PAGES for b in fenced_blocks(DOCS / name) if b.language == "python"
    ]


def test_the_python_pages_show_examples():
    assert len(python_blocks()) >= 4


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: f"{b.path.name}:{b.line}")
def test_python_examples_run(block: Block, doc_folder, tmp_path, monkeypatch, capsys):
    """Each Python example of the API and clients pages runs as shown, in a folder with
    the tiny trained run under the names it uses; an example that talks to
    `http://127.0.0.1:8080` gets a running `mtkit serve` (with the key the page shows)
    on a free port instead."""
    import shutil

    folder = tmp_path / "folder"
    shutil.copytree(doc_folder, folder)
    monkeypatch.chdir(folder)
    code = block.text
    server = None
    if "127.0.0.1:8080" in code:
        pytest.importorskip("fastapi")
        for client in ("libretranslatepy", "deepl"):
            if client in code:
                pytest.importorskip(client)
        from serverkit import LocalServer

        server = LocalServer(folder / "runs/multi30k/checkpoints/best.pt", "--api-key", "sesame")
        code = code.replace("127.0.0.1:8080", f"127.0.0.1:{server.port}")
    try:
        exec(compile(code, f"{block.path.name}:{block.line}", "exec"), {"__name__": "__main__"})
    finally:
        if server is not None:
            server.stop()
    assert capsys.readouterr().out.strip(), "an example prints what it shows"
