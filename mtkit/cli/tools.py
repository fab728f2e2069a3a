"""The commands that work on checkpoints: average, export."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mtkit.cli.app import app, reported
from mtkit.core.errors import OptionError, plural


@app.command()
def average(
    checkpoints: Annotated[
        list[Path], typer.Argument(help="Checkpoints to average, or one run's checkpoints folder.")
    ],
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="Averaged checkpoint (- for stdout, not a terminal)."),
    ],
    last: Annotated[int, typer.Option(help="With a folder: average its last N.")] = 5,
) -> None:
    """Average the weights of several checkpoints into one that translates."""
    from mtkit.core.atomic import refuse_same_file
    from mtkit.core.checkpoint import average_checkpoints, last_step_checkpoints, save_checkpoint

    with reported():
        if last < 1:
            raise OptionError(f"--last must be at least 1, got {last}")
        if str(output) == "-":  # written in place, as every descriptor is (mtkit.core.atomic)
            if sys.stdout.isatty():
                raise OptionError(
                    "-o - would write a binary checkpoint to the terminal; "
                    "redirect stdout to a file or a pipe"
                )
            sys.stdout.flush()
            output = Path("/dev/stdout")
        paths = list(checkpoints)
        if len(paths) == 1 and paths[0].is_dir():
            paths = last_step_checkpoints(paths[0], last)
        refuse_same_file(output, {f"checkpoint {i + 1}": p for i, p in enumerate(paths)})
        save_checkpoint(average_checkpoints(paths), output)
    typer.echo(f"averaged {plural(len(paths), 'checkpoint')} into {output}", err=True)


@app.command()
def export(
    model: Annotated[Path, typer.Option("--model", "-m", help="Checkpoint file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write.")],
    to: Annotated[
        str,
        typer.Option(
            help="Format: ctranslate2 (mtkit translate -m DIR runs it) or huggingface "
            "(transformers' MarianMTModel and MarianTokenizer load it)."
        ),
    ] = "ctranslate2",
    quantization: Annotated[
        str,
        typer.Option(
            help="float32, int8, int8_float32, int8_float16, int8_bfloat16, bfloat16 or "
            "float16 (what this machine can run; ctranslate2 only)."
        ),
    ] = "float32",
    force: Annotated[
        bool,
        typer.Option(
            help="Replace a previous mtkit export there (a folder its mtkit.json marks; "
            "nothing else)."
        ),
    ] = False,
) -> None:
    """Export a checkpoint to a self-contained CTranslate2 or Hugging Face folder.

    CTranslate2: the weights, the SentencePiece models and the decoding defaults;
    `mtkit translate -m DIR` runs it. Hugging Face: a Marian model in the Hugging Face
    layout (post-norm models with positions sinusoidal_split, as imported ones are)."""
    with reported():
        if to == "ctranslate2":
            from mtkit.interop.ct2_export import export_ctranslate2

            export_ctranslate2(model, output, quantization, force)
        elif to == "huggingface":
            from mtkit.interop.marian_export import export_huggingface

            if quantization != "float32":
                raise OptionError(
                    f"--quantization {quantization} is for --to ctranslate2; "
                    f"a Hugging Face export is float32"
                )
            export_huggingface(model, output, force)
        else:
            raise OptionError(f"--to must be ctranslate2 or huggingface, got {to!r}")
    typer.echo(
        f"exported {model} to {output} ({quantization if to == 'ctranslate2' else to})", err=True
    )


@app.command(name="import")
def import_(
    source: Annotated[
        str,
        typer.Argument(
            help="A Marian model folder in the Hugging Face layout, or a Hub name "
            "(Helsinki-NLP/opus-mt-en-de; fetched when online, else from the cache)."
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Checkpoint to write.")],
) -> None:
    """Import a Marian (OPUS-MT) model as a self-contained mtkit checkpoint.

    The weights are read without running code (safetensors, or torch.load with
    weights_only); everything is checked before anything is written: an architecture
    mtkit cannot represent exactly, a config at odds with the weights, or weights the
    config does not use are refused in one line."""
    from mtkit.core.atomic import refuse_same_file
    from mtkit.interop.marian_import import import_marian

    with reported():
        folder = Path(source)
        refuse_same_file(
            output, {str(source): sorted(folder.iterdir()) if folder.is_dir() else None}
        )
        import_marian(source, output)
    typer.echo(f"imported {source} into {output}", err=True)
