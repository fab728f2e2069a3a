"""The stage commands: tokenizer, distill, preprocess, train, and run (all of them)."""

from __future__ import annotations

import signal
from typing import Annotated

import typer

from mtkit.cli.app import ConfigOpt, SetOpt, app, load, reported, tune_runtime
from mtkit.core.errors import plural


@app.command()
def tokenizer(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Train SentencePiece on the training text (RUN/spm.model)."""
    from mtkit.stages.tokenizer import build_tokenizer

    cfg = load(config, set_)
    with reported():
        paths = build_tokenizer(cfg)
    typer.echo(f"wrote {', '.join(str(p) for p in paths)}", err=True)


@app.command()
def distill(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Translate the training source with a teacher (distill.teacher): the student's corpus."""
    from mtkit.stages.distill import distill as run_distill

    cfg = load(config, set_)
    tune_runtime()
    with reported():
        manifest = run_distill(cfg)
    pairs = manifest["pairs"]
    typer.echo(
        f"distilled {plural(pairs['kept'], 'pair')} of {pairs['translated']} translated "
        f"(dropped {pairs['dropped']}) into {cfg.run_path / 'distill'}",
        err=True,
    )


@app.command()
def preprocess(
    config: ConfigOpt,
    set_: SetOpt = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Only check the existing shards' sizes, offsets and "
            "checksums against their manifests; write nothing.",
        ),
    ] = False,
) -> None:
    """Clean, encode and binarize train/valid/test into RUN/data/."""
    from mtkit.stages.preprocess import preprocess as run_preprocess
    from mtkit.stages.preprocess import verify_shards

    cfg = load(config, set_)
    with reported():
        manifests = verify_shards(cfg) if verify else run_preprocess(cfg)
    if verify:
        typer.echo(
            f"verified {', '.join(manifests)}: sizes, offsets, checksums and "
            f"tokenizer match their manifests",
            err=True,
        )
        return
    for split, m in manifests.items():
        typer.echo(
            f"{split}: {plural(m['pairs'], 'pair')}, {m['src_tokens']} + "
            f"{plural(m['tgt_tokens'], 'token')}, dropped {m['dropped']}",
            err=True,
        )


@app.command()
def train(
    config: ConfigOpt,
    set_: SetOpt = None,
    resume: Annotated[bool, typer.Option(help="Continue from RUN/checkpoints.")] = True,
) -> None:
    """Train the Transformer (RUN/checkpoints/); resumes from RUN/checkpoints/last.pt."""
    from mtkit.training.loop import train as run_training

    cfg = load(config, set_)
    tune_runtime()
    with reported():
        result = run_training(cfg, resume=resume)
    typer.echo(f"{result.summary()}; checkpoints in {result.run_dir / 'checkpoints'}", err=True)
    if result.interrupted_by:  # the shell's convention: 128 + the signal's number
        raise typer.Exit(code=128 + signal.Signals[result.interrupted_by].value)


@app.command()
def run(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Run every stage (tokenizer, distill, preprocess, train, test), skipping finished ones."""
    from mtkit.core.languages import directions, name
    from mtkit.stages.pipeline import direction_table, run_all

    cfg = load(config, set_)
    tune_runtime()
    with reported():
        result = run_all(cfg)
    bleu = next(s for s in result.scores if s.metric == "bleu")
    if result.by_direction:
        typer.echo(direction_table(result.by_direction, [name(d) for d in directions(cfg.data)]))
        typer.echo(
            f"test BLEU per direction above ({bleu.signature}); translations in "
            f"{result.hypotheses}, checkpoint {result.checkpoint}"
        )
    else:
        typer.echo(
            f"test BLEU {bleu.score:.2f} ({bleu.signature}); translations in "
            f"{result.hypotheses}, checkpoint {result.checkpoint}"
        )
    typer.echo(
        f"trained to step {result.training.step} ({result.training.stopped_because}) "
        f"in {result.training.precision}",
        err=True,
    )
