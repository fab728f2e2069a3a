"""The `mtkit` command line: parse options, load the config, call one library function.

User errors (bad config, bad data, bad options, missing files, a full disk, a run
directory in use) print one line to stderr and exit 2; Ctrl-C exits 130 (SIGTERM 143)
after whatever the command was writing is saved or discarded whole.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Optional

import typer

try:  # recent Typer vendors click; older releases use the click package
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors

from mtkit.config import Config, ConfigError, load_config
from mtkit.errors import OptionError, UserError, plural

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
    from mtkit.atomic import WriteError, reason

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
def _reported() -> Iterator[None]:
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
    except UserError as e:  # every mtkit error the user can fix (`mtkit.errors`)
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


def _tune_runtime() -> None:
    """The process-wide CPU settings of `mtkit.device`, for commands that run the model."""
    from mtkit.device import tune_cpu_runtime

    tune_cpu_runtime()


def _config(path: Path, overrides: list[str] | None) -> Config:
    with _reported():
        return load_config(path, overrides or [])


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logs.")] = False,
          quiet: Annotated[bool, typer.Option(
              "--quiet", "-q", help="Only warnings and errors on stderr.")] = False) -> None:
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(stream=sys.stderr, level=level,
                        format="%(asctime)s | %(name)s | %(message)s", datefmt="%H:%M:%S",
                        force=True)
    if not verbose:  # libraries' own warnings would come before (or twice beside) ours
        warnings.filterwarnings("ignore", module=r"(datasets|pyarrow|torch|huggingface_hub)\b")


@app.command()
def tokenizer(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Train SentencePiece on the training text (RUN/spm.model)."""
    from mtkit.tokenizer import build_tokenizer

    cfg = _config(config, set_)
    with _reported():
        paths = build_tokenizer(cfg)
    typer.echo(f"wrote {', '.join(str(p) for p in paths)}", err=True)


@app.command()
def preprocess(config: ConfigOpt, set_: SetOpt = None,
               verify: Annotated[bool, typer.Option(
                   "--verify", help="Only check the existing shards' sizes, offsets and "
                   "checksums against their manifests; write nothing.")] = False) -> None:
    """Clean, encode and binarize train/valid/test into RUN/data/."""
    from mtkit.preprocess import preprocess as run_preprocess
    from mtkit.preprocess import verify_shards

    cfg = _config(config, set_)
    with _reported():
        manifests = verify_shards(cfg) if verify else run_preprocess(cfg)
    if verify:
        typer.echo(f"verified {', '.join(manifests)}: sizes, offsets, checksums and "
                   f"tokenizer match their manifests", err=True)
        return
    for split, m in manifests.items():
        typer.echo(f"{split}: {plural(m['pairs'], 'pair')}, {m['src_tokens']} + "
                   f"{plural(m['tgt_tokens'], 'token')}, dropped {m['dropped']}", err=True)


@app.command()
def train(config: ConfigOpt, set_: SetOpt = None,
          resume: Annotated[bool, typer.Option(help="Continue from RUN/checkpoints.")] = True
          ) -> None:
    """Train the Transformer (RUN/checkpoints/); resumes from RUN/checkpoints/last.pt."""
    from mtkit.train import train as run_training

    cfg = _config(config, set_)
    _tune_runtime()
    with _reported():
        result = run_training(cfg, resume=resume)
    typer.echo(f"{result.summary()}; checkpoints in {result.run_dir / 'checkpoints'}", err=True)
    if result.interrupted_by:  # the shell's convention: 128 + the signal's number
        raise typer.Exit(code=128 + signal.Signals[result.interrupted_by].value)


Opt = Optional  # noqa: UP045 (typer reads Optional[...] on every Python it supports)


# Decoding options, shared by `translate` and `serve` (one definition each).
ModelsOpt = Annotated[list[Path], typer.Option(
    "--model", "-m", help="Checkpoint file; repeat for an ensemble.")]
BeamOpt = Annotated[Opt[int], typer.Option(help="Beam size (default: the checkpoint's).")]
LenpenOpt = Annotated[Opt[float], typer.Option(help="GNMT length penalty alpha.")]
MaxLenAOpt = Annotated[Opt[float], typer.Option(
    help="Output limit a*src_len+b: a (the limit never exceeds the model's positions).")]
MaxLenBOpt = Annotated[Opt[int], typer.Option(
    help="Output limit a*src_len+b: b (the limit never exceeds the model's positions).")]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu or cuda.")]
NoRepeatOpt = Annotated[Opt[int], typer.Option(
    help="Forbid any n-gram of this size from appearing twice in an output.")]
SamplingOpt = Annotated[bool, typer.Option(
    "--sampling", help="Sample instead of searching: --beam N draws N per line.")]
TemperatureOpt = Annotated[Opt[float], typer.Option(help="Sampling temperature.")]
TopkOpt = Annotated[Opt[int], typer.Option(help="Sample from the k likeliest tokens.")]
ToppOpt = Annotated[Opt[float], typer.Option(
    help="Sample from the likeliest tokens whose probability reaches p.")]
SeedOpt = Annotated[Opt[int], typer.Option(help="Sampling seed (per input line).")]
AlignLayerOpt = Annotated[Opt[int], typer.Option(
    help="Decoder layer whose cross-attention gives the alignments (default: the "
         "second-to-last).")]


def _check_device(device: str) -> None:
    if device not in ("auto", "cpu", "cuda"):
        raise OptionError(f"--device must be auto, cpu or cuda, got {device!r}")


@app.command()
def translate(
    model: ModelsOpt,
    input: Annotated[Opt[Path], typer.Option(
        "--input", "-i", help="Default (or -): stdin.")] = None,
    output: Annotated[Opt[Path], typer.Option(
        "--output", "-o", help="Default (or -): stdout. A device or FIFO is written in "
        "place.")] = None,
    beam: BeamOpt = None,
    lenpen: LenpenOpt = None,
    nbest: Annotated[int, typer.Option(help="Hypotheses per line: 'i ||| text ||| score'.")] = 1,
    scores: Annotated[bool, typer.Option(help="Append a tab and the score.")] = False,
    max_len_a: MaxLenAOpt = None,
    max_len_b: MaxLenBOpt = None,
    batch_tokens: Annotated[Opt[int], typer.Option(
        help="Source tokens per batch, times the beam (the rows the search carries).")] = None,
    device: DeviceOpt = "auto",
    format: Annotated[str, typer.Option(help="text or jsonl.")] = "text",
    no_repeat_ngram: NoRepeatOpt = None,
    sampling: SamplingOpt = False,
    temperature: TemperatureOpt = None,
    topk: TopkOpt = None,
    topp: ToppOpt = None,
    seed: SeedOpt = None,
    prefix_file: Annotated[Opt[Path], typer.Option(
        help="A target prefix for each input line: the output starts with it.")] = None,
    alignments: Annotated[bool, typer.Option(
        "--alignments", help="Add word alignments (Pharaoh 'src-tgt' pairs) after a tab.")
        ] = False,
    align_layer: AlignLayerOpt = None,
) -> None:
    """Translate text from a file or stdin, one output line per input line, in order.

    With -o the output file is replaced only when every line is translated."""
    from mtkit.atomic import atomic_text, refuse_same_file
    from mtkit.translate import (
        DecodeOptions,
        load_translator,
        names_export,
        progress_bar,
        read_all_lines,
        read_files,
        translate_stream,
    )

    input, output = _dash(input), _dash(output)
    with _reported():
        if format not in ("text", "jsonl"):
            raise OptionError(f"--format must be text or jsonl, got {format!r}")
        _check_device(device)
        if output:
            refuse_same_file(output, {"--input": input, "--prefix-file": prefix_file,
                                      **read_files(model)})
        if prefix_file and format == "jsonl":
            raise OptionError('--prefix-file is for text input; in jsonl give each line a '
                              '"prefix"')
        prefixes = _read_lines(prefix_file) if prefix_file else None
        if not names_export(model):  # an exported folder runs without torch
            _tune_runtime()
        translator = load_translator(model, device, "--device")
        opts = DecodeOptions.from_config(
            translator.config.decode, beam=beam, lenpen=lenpen, max_len_a=max_len_a,
            max_len_b=max_len_b, batch_tokens=batch_tokens, nbest=nbest, scores=scores,
            format=format, no_repeat_ngram=no_repeat_ngram, sampling=sampling,
            temperature=temperature, topk=topk, topp=topp, seed=seed,
            alignments=alignments, align_layer=align_layer)
        with (open(input, "rb") if input else nullcontext(sys.stdin.buffer)) as source, \
                (atomic_text(output) if output else nullcontext(sys.stdout)) as sink, \
                progress_bar(input) as done:
            if prefixes is not None:  # counts must agree before anything is written
                source = read_all_lines(source, len(prefixes), f"--prefix-file {prefix_file}")
            translate_stream(translator, source, sink, opts, done, prefixes)


def _dash(path: Path | None) -> Path | None:
    """None (stdin or stdout) for `-`, as Unix tools read it; else `path`."""
    return None if path is not None and str(path) == "-" else path


def _read_lines(path: Path) -> list[str]:
    """A text file's lines (invalid UTF-8 replaced, a byte-order mark dropped); a last
    line without newline counts. Read once, so a pipe works too (`--ref <(...)`)."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a text file")
    text = path.read_bytes().decode("utf-8", errors="replace").removeprefix("\ufeff")
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


@app.command(name="eval")
def eval_(
    hyp: Annotated[Opt[Path], typer.Option(help="Hypotheses, one per line.")] = None,
    ref: Annotated[Opt[Path], typer.Option(help="References, one per line.")] = None,
    model: Annotated[Opt[Path], typer.Option("--model", "-m", help="Translate first.")] = None,
    src: Annotated[Opt[Path], typer.Option(help="Source text to translate (with -m).")] = None,
    metrics: Annotated[str, typer.Option(help="Comma-separated: bleu,chrf,ter.")] = "bleu,chrf,ter",
    json_: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda (with -m).")] = "auto",
) -> None:
    """Score translations with sacrebleu (BLEU, chrF, TER, with signatures)."""
    import json

    from mtkit.evaluate import EvalError, parse_metrics, score
    from mtkit.translate import DecodeOptions, load_translator, translate_texts

    with _reported():
        names = parse_metrics(metrics)
        if ref is None or (hyp is None) == (model is None) or (model is None) != (src is None):
            raise ConfigError("give --hyp H --ref R, or -m CKPT --src S --ref R")
        references = _read_lines(ref)
        if not references:
            raise EvalError(f"nothing to score: {ref} is empty")
        if model is not None:
            sources = _read_lines(src)
            if len(sources) != len(references):
                raise EvalError(f"line counts differ: {src} has "
                                f"{plural(len(sources), 'line')}, "
                                  f"{ref} has {len(references)}")
            translator = load_translator(model, device, "--device")
            hypotheses = translate_texts(translator, sources,
                                         DecodeOptions.from_config(translator.config.decode))
        else:
            hypotheses = _read_lines(hyp)
            if len(hypotheses) != len(references):
                raise EvalError(f"line counts differ: {hyp} has "
                                f"{plural(len(hypotheses), 'line')}, "
                                  f"{ref} has {len(references)}")
        results = score(hypotheses, references, names)
    if json_:
        typer.echo(json.dumps({r.metric: {"score": round(r.score, 2), "signature": r.signature,
                                          "text": r.text} for r in results}))
    else:
        for r in results:
            typer.echo(f"{r.text}\t{r.signature}")


@app.command()
def average(
    checkpoints: Annotated[list[Path], typer.Argument(
        help="Checkpoints to average, or one run's checkpoints folder.")],
    output: Annotated[Path, typer.Option(
        "--output", "-o", help="Averaged checkpoint (- for stdout, not a terminal).")],
    last: Annotated[int, typer.Option(help="With a folder: average its last N.")] = 5,
) -> None:
    """Average the weights of several checkpoints into one that translates."""
    from mtkit.atomic import refuse_same_file
    from mtkit.checkpoint import average_checkpoints, last_step_checkpoints, save_checkpoint

    with _reported():
        if last < 1:
            raise OptionError(f"--last must be at least 1, got {last}")
        if str(output) == "-":  # written in place, as every descriptor is (mtkit.atomic)
            if sys.stdout.isatty():
                raise OptionError("-o - would write a binary checkpoint to the terminal; "
                                  "redirect stdout to a file or a pipe")
            sys.stdout.flush()
            output = Path("/dev/stdout")
        paths = list(checkpoints)
        if len(paths) == 1 and paths[0].is_dir():
            paths = last_step_checkpoints(paths[0], last)
        refuse_same_file(output, {f"checkpoint {i + 1}": p for i, p in enumerate(paths)})
        save_checkpoint(average_checkpoints(paths), output)
    typer.echo(f"averaged {plural(len(paths), 'checkpoint')} into {output}", err=True)


@app.command()
def run(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Run every stage (tokenizer, preprocess, train, translate, eval), skipping finished ones."""
    from mtkit.pipeline import run_all

    cfg = _config(config, set_)
    _tune_runtime()
    with _reported():
        result = run_all(cfg)
    bleu = next(s for s in result.scores if s.metric == "bleu")
    typer.echo(f"test BLEU {bleu.score:.2f} ({bleu.signature}); translations in "
               f"{result.hypotheses}, checkpoint {result.checkpoint}")
    typer.echo(f"trained to step {result.training.step} ({result.training.stopped_because}) "
               f"in {result.training.precision}", err=True)


@app.command()
def export(
    model: Annotated[Path, typer.Option("--model", "-m", help="Checkpoint file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write.")],
    to: Annotated[str, typer.Option(help="Format: ctranslate2.")] = "ctranslate2",
    quantization: Annotated[str, typer.Option(
        help="float32, int8, int8_float32, int8_float16, int8_bfloat16, bfloat16 or "
             "float16 (what this machine can run).")] = "float32",
    force: Annotated[bool, typer.Option(help="Replace a non-empty output folder.")] = False,
) -> None:
    """Export a checkpoint to a self-contained CTranslate2 folder for deployment.

    The folder holds the weights, the SentencePiece models and the decoding defaults;
    `mtkit translate -m DIR` runs it."""
    from mtkit.ct2 import export_ctranslate2

    with _reported():
        if to != "ctranslate2":
            raise OptionError(f"--to must be ctranslate2, got {to!r}")
        export_ctranslate2(model, output, quantization, force)
    typer.echo(f"exported {model} to {output} ({quantization})", err=True)


MAX_WAIT_MS = 60_000  # serve --max-wait-ms: a minute is already far past any batching gain


@app.command()
def serve(
    model: ModelsOpt,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback unless set).")
                    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (1 to 65535).")] = 8080,
    beam: BeamOpt = None,
    lenpen: LenpenOpt = None,
    max_len_a: MaxLenAOpt = None,
    max_len_b: MaxLenBOpt = None,
    no_repeat_ngram: NoRepeatOpt = None,
    sampling: SamplingOpt = False,
    temperature: TemperatureOpt = None,
    topk: TopkOpt = None,
    topp: ToppOpt = None,
    seed: SeedOpt = None,
    align_layer: AlignLayerOpt = None,
    device: DeviceOpt = "auto",
    max_batch_tokens: Annotated[Opt[int], typer.Option(
        help="Source tokens the model worker takes into one batch (default: the "
             "checkpoint's decode.batch_tokens).")] = None,
    max_wait_ms: Annotated[float, typer.Option(
        help="Longest wait of a sentence for others to batch with (0 to 60,000).")] = 5.0,
    continuous: Annotated[bool, typer.Option(
        "--continuous/--rounds",
        help="Greedy requests join one running search between its steps and leave it "
             "as each sentence ends (continuous batching); --rounds batches them as "
             "other requests are: in rounds, each answered when its round ends.")] = True,
    max_lines: Annotated[int, typer.Option(help="Sentences per request.")] = 64,
    max_chars: Annotated[int, typer.Option(help="Characters per request.")] = 20_000,
    api_key: Annotated[Opt[str], typer.Option(
        envvar="MTKIT_API_KEY", show_envvar=True,
        help="Require 'Authorization: Bearer KEY' on /v1/* (but /v1/health).")] = None,
) -> None:
    """Serve translations over HTTP: a JSON API, a page at /, docs at /docs.

    Concurrent requests are batched together. SIGTERM or Ctrl-C finishes the requests in
    flight and one last round of the waiting ones, answers the rest 503, then exits."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        typer.echo("error: mtkit serve needs FastAPI and uvicorn: pip install 'mtkit[serve]'",
                   err=True)
        raise typer.Exit(code=2) from None
    from mtkit.serve import Batcher, Limits, create_app, serve_forever
    from mtkit.translate import DecodeOptions, load_translator, names_export

    with _reported():
        _check_device(device)
        if api_key is None and os.environ.get("MTKIT_API_KEY") is not None:
            api_key = os.environ["MTKIT_API_KEY"]  # click takes an empty one for unset
        if api_key is not None and not api_key.strip():
            raise OptionError("the API key is empty (--api-key or MTKIT_API_KEY): give a "
                              "key, or neither to serve without one")
        limits = Limits(1 if max_batch_tokens is None else max_batch_tokens, max_wait_ms,
                        max_lines, max_chars)
        if not 1 <= port <= 65535:
            raise OptionError(f"--port must be from 1 to 65535, got {port}")
        for name, value in asdict(limits).items():
            if name == "max_wait_ms" and not 0 <= value <= MAX_WAIT_MS:  # nan fails too
                raise OptionError(f"--max-wait-ms must be from 0 to {MAX_WAIT_MS:,}, got "
                                  f"{value}")
            if name != "max_wait_ms" and value <= 0:
                raise OptionError(f"--{name.replace('_', '-')} must be above 0, got {value}")
        if not names_export(model):
            _tune_runtime()
        translator = load_translator(model, device, "--device")
        if max_batch_tokens is None:
            limits = replace(limits, max_batch_tokens=translator.config.decode.batch_tokens)
        defaults = DecodeOptions.from_config(
            translator.config.decode, beam=beam, lenpen=lenpen, max_len_a=max_len_a,
            max_len_b=max_len_b, no_repeat_ngram=no_repeat_ngram, sampling=sampling,
            temperature=temperature, topk=topk, topp=topp, seed=seed,
            align_layer=align_layer, alignments=align_layer is not None)
        from mtkit.ct2 import CT2Translator, refuse_unsupported

        if isinstance(translator, CT2Translator):  # refused now, not in every request
            if align_layer is not None:
                raise OptionError("--align-layer needs a checkpoint (-m FILE.pt), not an "
                                  "exported CTranslate2 folder")
            refuse_unsupported(defaults)
        elif align_layer is not None:
            from mtkit.align import check_layer

            check_layer(align_layer, translator.models)
        name = " + ".join(m.name for m in model)
        batcher = Batcher(translator, limits, continuous)
        app_ = create_app(translator, replace(defaults, alignments=False), limits, name,
                          translator.steps[0], api_key or None, batcher)
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        ready = (f"serving {name} on {url} (page at /, API docs at /docs)"
                 + ("; API key required" if api_key else ""))
        stopped_by = serve_forever(app_, batcher, host, port, ready)
    if stopped_by == signal.SIGINT:  # Ctrl-C: "interrupted", as everywhere; SIGTERM: 0
        typer.echo("interrupted", err=True)
        raise typer.Exit(code=130)


explain_app = typer.Typer(help="See inside the Transformer: shapes, parameters, attention.",
                          no_args_is_help=True)
app.add_typer(explain_app, name="explain")
CkptOpt = Annotated[Opt[Path], typer.Option("--model", "-m", help="Checkpoint (or --config).")]
MaybeConfig = Annotated[Opt[Path], typer.Option("--config", "-c", help="Experiment YAML.")]


def _explain_checkpoint(model: Path):
    """The translator of the checkpoint `model`; an exported folder is refused in one
    line (explain reads PyTorch weights, which CTranslate2's model.bin does not hold)."""
    from mtkit.translate import load_translator

    if model.is_dir():
        from mtkit.ct2 import is_export

        what = "an exported CTranslate2 folder" if is_export(model) else "a folder"
        raise OptionError(f"explain needs a checkpoint (-m FILE.pt): {model} is {what}")
    return load_translator(model, "cpu")


def _explain_model(config: Path | None, model: Path | None, overrides: list[str] | None):
    """(model, src vocab or None, tgt vocab or None, config) from a checkpoint, or from a
    config: random weights, the run's tokenizer if trained, else hashed word ids."""
    from mtkit.model import build_model
    from mtkit.vocab import load_vocabs

    if (config is None) == (model is None):
        raise ConfigError("give --config C or -m CKPT")
    if model is not None:
        t = _explain_checkpoint(model)
        return t.model, t.src_vocab, t.tgt_vocab, t.config
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
    config: MaybeConfig = None, model: CkptOpt = None, set_: SetOpt = None,
    src: Annotated[Opt[list[str]], typer.Option(help="Source sentence (repeatable).")] = None,
    tgt: Annotated[Opt[list[str]], typer.Option(help="Target sentence (repeatable).")] = None,
    values: Annotated[bool, typer.Option(help="Also print the (rounded) numbers.")] = False,
) -> None:
    """Trace one small batch through the model: every stage's shape, axes named."""
    from mtkit.explain import DEFAULT_PAIRS, format_trace, make_batch, trace_shapes

    with _reported():
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
        typer.echo("(no tokenizer trained for this run: words are mapped to hashed ids)",
                   err=True)
    typer.echo(format_trace(stages, net.cfg, vocab_size, values=values))


@explain_app.command("params")
def explain_params(config: MaybeConfig = None, model: CkptOpt = None,
                   set_: SetOpt = None) -> None:
    """Parameters per component with the closed-form count beside each."""
    from mtkit.explain import format_parameter_table

    with _reported():
        net, _, _, _ = _explain_model(config, model, set_)
    typer.echo(format_parameter_table(net))


@explain_app.command("attention")
def explain_attention(
    model: Annotated[Path, typer.Option("--model", "-m", help="Checkpoint file.")],
    src: Annotated[str, typer.Option(help="The sentence to translate.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the PNGs.")] = Path(
        "attention"),
) -> None:
    """Translate a sentence and draw every layer's and head's attention as PNG heatmaps."""
    from mtkit.explain import attention_maps, plot_attention

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        typer.echo("error: drawing needs matplotlib: pip install 'mtkit[viz]'", err=True)
        raise typer.Exit(code=2) from None
    with _reported():
        if not src.strip():
            raise OptionError("--src is empty: give a sentence to translate")
        t = _explain_checkpoint(model)
        maps = attention_maps(t.model, t.src_vocab, t.tgt_vocab, src,
                              t.config.decode.max_len_a, t.config.decode.max_len_b)
        paths = plot_attention(maps, out)
    typer.echo(maps.translation)
    typer.echo(f"wrote {plural(len(paths), 'image')} to {out}/ (alignment.png: the mean "
               f"cross-attention)", err=True)


if __name__ == "__main__":  # pragma: no cover
    main()
