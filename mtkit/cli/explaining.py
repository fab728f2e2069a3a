"""`mtkit explain`: see inside the Transformer (shapes, parameters, attention)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mtkit.cli.app import Opt, SetOpt, app, reported
from mtkit.core.config import ConfigError, load_config
from mtkit.core.errors import OptionError, plural

explain_app = typer.Typer(
    help="See inside the Transformer: shapes, parameters, attention.", no_args_is_help=True
)
app.add_typer(explain_app, name="explain")
CkptOpt = Annotated[Opt[Path], typer.Option("--model", "-m", help="Checkpoint (or --config).")]
MaybeConfig = Annotated[Opt[Path], typer.Option("--config", "-c", help="Experiment YAML.")]


def _explain_checkpoint(model: Path):
    """(model, src vocab, tgt vocab, config) of the checkpoint `model`; an exported
    folder is refused in one line (explain reads PyTorch weights, which CTranslate2's
    model.bin does not hold)."""
    if model.is_dir():
        from mtkit.engines.ct2 import looks_exported

        what = "an exported CTranslate2 folder" if looks_exported(model) else "a folder"
        raise OptionError(f"explain needs a checkpoint (-m FILE.pt): {model} is {what}")
    from mtkit.engines.pytorch_loading import load_model

    net, src_vocab, tgt_vocab, cfg, *_ = load_model(model)
    return net.eval(), src_vocab, tgt_vocab, cfg


def _explain_model(config: Path | None, model: Path | None, overrides: list[str] | None):
    """(model, src vocab or None, tgt vocab or None, config) from a checkpoint, or from a
    config: random weights, the run's tokenizer if trained, else hashed word ids."""
    from mtkit.core.vocab import load_vocabs
    from mtkit.model.transformer import build_model

    if (config is None) == (model is None):
        raise ConfigError("give --config C or -m CKPT")
    if model is not None:
        return _explain_checkpoint(model)
    cfg = load_config(config, overrides or [])
    try:
        src_vocab, tgt_vocab = load_vocabs(cfg.run_path, cfg.tokenizer.joint)
        sizes = (len(src_vocab), len(tgt_vocab))
    except FileNotFoundError:
        src_vocab = tgt_vocab = None
        sizes = (cfg.tokenizer.vocab_size, cfg.tokenizer.vocab_size)
    return build_model(cfg.model, *sizes), src_vocab, tgt_vocab, cfg


@explain_app.command("shapes")
def explain_shapes(
    config: MaybeConfig = None,
    model: CkptOpt = None,
    set_: SetOpt = None,
    src: Annotated[Opt[list[str]], typer.Option(help="Source sentence (repeatable).")] = None,
    tgt: Annotated[Opt[list[str]], typer.Option(help="Target sentence (repeatable).")] = None,
    values: Annotated[bool, typer.Option(help="Also print the (rounded) numbers.")] = False,
) -> None:
    """Trace one small batch through the model: every stage's shape, axes named."""
    from mtkit.stages.explain import DEFAULT_PAIRS, format_trace, make_batch, trace_shapes

    with reported():
        net, src_vocab, tgt_vocab, cfg = _explain_model(config, model, set_)
        pairs = DEFAULT_PAIRS
        if src or tgt:
            if not src or not tgt or len(src) != len(tgt):
                raise ConfigError("give as many --tgt as --src sentences")
            pairs = list(zip(src, tgt, strict=True))
        vocab_size = net.tgt_embed.tokens.num_embeddings
        batch = make_batch(pairs, src_vocab, tgt_vocab, vocab_size)
        stages = trace_shapes(net, batch, cfg.train.label_smoothing, values=values)
    if src_vocab is None:
        typer.echo("(no tokenizer trained for this run: words are mapped to hashed ids)", err=True)
    typer.echo(format_trace(stages, net.cfg, vocab_size, values=values))


@explain_app.command("params")
def explain_params(config: MaybeConfig = None, model: CkptOpt = None, set_: SetOpt = None) -> None:
    """Parameters per component with the closed-form count beside each."""
    from mtkit.stages.explain import format_parameter_table

    with reported():
        net, _, _, _ = _explain_model(config, model, set_)
    typer.echo(format_parameter_table(net))


@explain_app.command("attention")
def explain_attention(
    model: Annotated[Path, typer.Option("--model", "-m", help="Checkpoint file.")],
    src: Annotated[str, typer.Option(help="The sentence to translate.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the PNGs.")] = Path(
        "attention"
    ),
) -> None:
    """Translate a sentence and draw every layer's and head's attention as PNG heatmaps."""
    from mtkit.stages.explain import attention_maps, plot_attention

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        typer.echo("error: drawing needs matplotlib: pip install 'mtkit[viz]'", err=True)
        raise typer.Exit(code=2) from None
    with reported():
        if not src.strip():
            raise OptionError("--src is empty: give a sentence to translate")
        net, src_vocab, tgt_vocab, cfg = _explain_checkpoint(model)
        maps = attention_maps(
            net, src_vocab, tgt_vocab, src, cfg.decode.max_len_a, cfg.decode.max_len_b
        )
        paths = plot_attention(maps, out)
    typer.echo(maps.translation)
    typer.echo(
        f"wrote {plural(len(paths), 'image')} to {out}/ (alignment.png: the mean cross-attention)",
        err=True,
    )
