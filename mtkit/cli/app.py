"""The `mtkit` Typer app and what every command shares: one-line errors, exit codes,
signals, the config and the options that take files.

User errors (`mtkit.core.errors.UserError`: bad config, bad data, bad options, a run
directory in use; and `OSError`: a missing file, a full disk) print one line to stderr
and exit 2; Ctrl-C exits 130 (SIGTERM 143) after whatever the command was writing is
saved or discarded whole.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

try:  # recent Typer vendors click; older releases use the click package
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors

from mtkit.core.config import Config, load_config
from mtkit.core.errors import OptionError, UserError

log = logging.getLogger(__name__)

app = typer.Typer(
    name="mtkit",
    help="Train and run Transformer translation models: tokenizer -> preprocess -> train "
    "-> translate -> eval.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Experiment YAML file.")]
SetOpt = Annotated[
    Optional[list[str]],  # noqa: UP045 (typer needs Optional here on Python 3.10)
    typer.Option("--set", help="Override a config key: --set model.d_model=512 (repeatable)."),
]


def _message(e: OSError) -> str:
    """One line for an OSError: the file it names and the reason."""
    from mtkit.core.atomic import WriteError, reason

    if isinstance(e, WriteError) or e.errno is None:
        text = str(e).strip()
        return text.splitlines()[0] if text else type(e).__name__
    return f"{e.filename}: {reason(e)}" if e.filename else reason(e)


class Terminated(BaseException):
    """SIGTERM, raised where the program is, so that what it was writing is discarded
    whole (a temporary output file removed) before it exits 143. A BaseException, like
    KeyboardInterrupt: no `except Exception` on the way may take it for an error."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


@contextmanager
def reported() -> Iterator[None]:
    """Turn user errors (`UserError`, `OSError`) into one line on stderr and their exit
    code (2); Ctrl-C into "interrupted" and exit code 130."""
    try:
        yield
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(code=130) from None
    except Terminated:
        typer.echo("terminated", err=True)
        raise typer.Exit(code=128 + signal.SIGTERM) from None
    except BrokenPipeError:  # `mtkit translate | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(code=128 + signal.SIGPIPE) from None
    except UserError as e:  # every mtkit error the user can fix (`mtkit.core.errors`)
        typer.echo(e.label + e.line(), err=True)
        raise typer.Exit(code=e.exit_code) from None
    except OSError as e:  # a missing file, a full disk, a read-only folder
        typer.echo("error: " + _message(e), err=True)
        raise typer.Exit(code=2) from None


def main() -> None:
    """The `mtkit` console script: the Typer app, with click's usage errors (unknown or
    missing options, bad types) as one line and exit code 2 like every other error."""
    no_args = getattr(click_errors, "NoArgsIsHelpError", ())
    signal.signal(signal.SIGTERM, _raise_terminated)  # (train and serve set their own)
    try:
        code = app(prog_name="mtkit", standalone_mode=False)
    except no_args as e:  # `mtkit` or `mtkit explain` alone: the help, as before
        typer.echo(e.ctx.get_help() if e.ctx else str(e), err=True)
        code = 2
    except click_errors.UsageError as e:
        command = e.ctx.command_path if e.ctx else "mtkit"
        typer.echo(f"error: {e.format_message()} (see `{command} --help`)", err=True)
        code = 2
    except click_errors.ClickException as e:
        typer.echo(f"error: {e.format_message()}", err=True)
        code = e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("interrupted", err=True)
        code = 130
    except Terminated:
        typer.echo("terminated", err=True)
        code = 128 + signal.SIGTERM
    sys.exit(code if isinstance(code, int) else 0)


def tune_runtime() -> None:
    """The process-wide CPU settings of `mtkit.core.device`, for commands that run the model."""
    from mtkit.core.device import tune_cpu_runtime

    tune_cpu_runtime()


def load(path: Path, overrides: list[str] | None) -> Config:
    """The config at `path` with `--set` overrides (a bad one: one line, exit 2)."""
    with reported():
        return load_config(path, overrides or [])


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"mtkit {version('mtkit')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            typer.echo("mtkit (not installed)")
        raise typer.Exit()


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logs.")] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Only warnings and errors on stderr.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print mtkit's version."),
    ] = False,
) -> None:
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(
        stream=sys.stderr,
        level=level,
        format="%(asctime)s | %(name)s | %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    if not verbose:  # libraries' own warnings would come before (or twice beside) ours
        warnings.filterwarnings("ignore", module=r"(datasets|pyarrow|torch|huggingface_hub)\b")


Opt = Optional  # noqa: UP045 (typer reads Optional[...] on every Python it supports)
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu or cuda.")]


def check_device(device: str) -> None:
    if device not in ("auto", "cpu", "cuda"):
        raise OptionError(f"--device must be auto, cpu or cuda, got {device!r}")


def dash(path: Path | None) -> Path | None:
    """None (stdin or stdout) for `-`, as Unix tools read it; else `path`."""
    return None if path is not None and str(path) == "-" else path
