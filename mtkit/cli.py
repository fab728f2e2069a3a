"""The `mtkit` command line: parse options, load the config, call one library function.

User errors (bad config, bad data, missing files) print one line to stderr and exit 2.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from mtkit.config import Config, ConfigError, load_config

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


def _user_errors() -> tuple[type[BaseException], ...]:
    from mtkit.checkpoint import CheckpointError
    from mtkit.data.sources import DataError
    from mtkit.tokenizer import TokenizerError
    from mtkit.train import TrainError

    return (ConfigError, DataError, TokenizerError, CheckpointError, TrainError,
            FileNotFoundError)


@contextmanager
def _reported() -> Iterator[None]:
    """Turn known user errors into one line on stderr and exit code 2."""
    try:
        yield
    except _user_errors() as e:
        prefix = "config error: " if isinstance(e, ConfigError) else "error: "
        typer.echo(prefix + str(e).splitlines()[0] if str(e) else prefix + type(e).__name__,
                   err=True)
        raise typer.Exit(code=2) from None


def _config(path: Path, overrides: list[str] | None) -> Config:
    with _reported():
        return load_config(path, overrides or [])


def _not_built(what: str, issue: int) -> None:
    typer.echo(f"error: `mtkit {what}` is not built yet (issue #{issue})", err=True)
    raise typer.Exit(code=2)


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logs.")] = False
          ) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s | %(name)s | %(message)s", datefmt="%H:%M:%S",
                        force=True)
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


@app.command()
def tokenizer(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Train SentencePiece on the training text (RUN/spm.model)."""
    from mtkit.tokenizer import build_tokenizer

    cfg = _config(config, set_)
    with _reported():
        paths = build_tokenizer(cfg)
    typer.echo(f"wrote {', '.join(str(p) for p in paths)}", err=True)


@app.command()
def preprocess(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Clean, encode and binarize train/valid/test into RUN/data/."""
    from mtkit.data.shards import preprocess as run_preprocess

    cfg = _config(config, set_)
    with _reported():
        manifests = run_preprocess(cfg)
    for split, m in manifests.items():
        typer.echo(f"{split}: {m['pairs']} pairs, {m['src_tokens']} + {m['tgt_tokens']} tokens, "
                   f"dropped {m['dropped']}", err=True)


@app.command()
def train(config: ConfigOpt, set_: SetOpt = None,
          resume: Annotated[bool, typer.Option(help="Continue from RUN/checkpoints.")] = True
          ) -> None:
    """Train the Transformer (RUN/checkpoints/); resumes from RUN/checkpoints/last.pt."""
    from mtkit.train import train as run_training

    cfg = _config(config, set_)
    with _reported():
        result = run_training(cfg, resume=resume)
    typer.echo(f"stopped at step {result.step} ({result.stopped_because}); best valid BLEU "
               f"{result.best_bleu:.2f}; checkpoints in {result.run_dir / 'checkpoints'}",
               err=True)


@app.command()
def translate(
    model: Annotated[Path, typer.Option("--model", "-m", help="Checkpoint file.")],
    input: Annotated[Optional[Path], typer.Option("--input", "-i")] = None,  # noqa: UP045
    output: Annotated[Optional[Path], typer.Option("--output", "-o")] = None,  # noqa: UP045
    beam: Annotated[int, typer.Option(help="Beam size.")] = 5,
    lenpen: Annotated[float, typer.Option(help="GNMT length penalty alpha.")] = 0.6,
    nbest: Annotated[int, typer.Option(help="Hypotheses per input line.")] = 1,
    max_len_a: Annotated[float, typer.Option()] = 1.2,
    max_len_b: Annotated[int, typer.Option()] = 10,
    batch_tokens: Annotated[int, typer.Option()] = 8000,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
) -> None:
    """Translate text from a file or stdin, one output line per input line."""
    _not_built("translate", 4)


@app.command(name="eval")
def eval_(
    hyp: Annotated[Optional[Path], typer.Option(help="Hypotheses, one per line.")] = None,  # noqa: UP045
    ref: Annotated[Optional[Path], typer.Option(help="References, one per line.")] = None,  # noqa: UP045
    model: Annotated[Optional[Path], typer.Option("--model", "-m")] = None,  # noqa: UP045
    src: Annotated[Optional[Path], typer.Option(help="Source text to translate.")] = None,  # noqa: UP045
    metrics: Annotated[str, typer.Option(help="Comma-separated: bleu,chrf,ter.")] = "bleu,chrf,ter",
    json_: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Score translations with sacrebleu (BLEU, chrF, TER with signatures)."""
    _not_built("eval", 4)


@app.command()
def average(
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoints to average.")],
    output: Annotated[Path, typer.Option("--output", "-o")],
) -> None:
    """Average the weights of several checkpoints into one."""
    _not_built("average", 4)


@app.command()
def run(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Run every stage (tokenizer, preprocess, train, translate, eval), skipping finished ones."""
    _config(config, set_)
    _not_built("run", 4)


if __name__ == "__main__":  # pragma: no cover
    app()
