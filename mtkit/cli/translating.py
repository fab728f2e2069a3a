"""The commands that translate: translate, eval, serve. The decoding options are
`mtkit.core.search_options.OPTIONS`' (their help, their checks), the same for all three."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from mtkit.cli.app import (
    Opt,
    app,
    check_device,
    dash,
    reported,
    tune_runtime,
)
from mtkit.core.errors import OptionError
from mtkit.core.search_options import OPTIONS
from mtkit.core.terms import (
    Glossary,
)
from mtkit.documents.formats import FORMATS, listed, output_format
from mtkit.engines.base import Engine

# The headings `--help` groups the options under (Typer's rich help panels).
MODEL = "Model"
IO = "Input and output"
SEARCH = "Search"
SAMPLING = "Sampling"
TERMINOLOGY = "Terminology"
LANGUAGES = "Languages"
SPEED = "Device and speed"
SERVER = "Server"
DOCUMENTS = "Documents (/v2/document, /translate_file)"


def _help(name: str, panel: str, *flags: str) -> typer.models.OptionInfo:
    """A decoding option's typer.Option, its help from `OPTIONS`, under `panel`."""
    return typer.Option(*flags, help=OPTIONS[name].help, rich_help_panel=panel)


ModelsOpt = Annotated[
    list[Path],
    typer.Option(
        "--model",
        "-m",
        help="Checkpoint file or exported folder; repeat for an ensemble.",
        rich_help_panel=MODEL,
    ),
]
BeamOpt = Annotated[Opt[int], _help("beam", SEARCH)]
LenpenOpt = Annotated[Opt[float], _help("lenpen", SEARCH)]
MaxLenAOpt = Annotated[Opt[float], _help("max_len_a", SEARCH)]
MaxLenBOpt = Annotated[Opt[int], _help("max_len_b", SEARCH)]
NbestOpt = Annotated[int, _help("nbest", SEARCH)]
NoRepeatOpt = Annotated[Opt[int], _help("no_repeat_ngram", SEARCH)]
SamplingOpt = Annotated[bool, _help("sampling", SAMPLING, "--sampling")]
TemperatureOpt = Annotated[Opt[float], _help("temperature", SAMPLING)]
TopkOpt = Annotated[Opt[int], _help("topk", SAMPLING)]
ToppOpt = Annotated[Opt[float], _help("topp", SAMPLING)]
SeedOpt = Annotated[Opt[int], _help("seed", SAMPLING)]
AlignmentsOpt = Annotated[bool, _help("alignments", IO, "--alignments")]
AlignLayerOpt = Annotated[Opt[int], _help("align_layer", IO)]
LangVocabOpt = Annotated[Opt[bool], _help("lang_vocab", LANGUAGES, "--lang-vocab/--no-lang-vocab")]
BatchTokensOpt = Annotated[Opt[int], _help("batch_tokens", SPEED)]
ShortlistOpt = Annotated[Opt[bool], _help("shortlist", SPEED, "--shortlist/--no-shortlist")]
TranslateDeviceOpt = Annotated[str, typer.Option(help="auto, cpu or cuda.", rich_help_panel=SPEED)]
PrecisionOpt = Annotated[
    Opt[str],
    typer.Option(
        help="auto, fp32, bf16 or int8 (default: the checkpoint's decode.precision; auto "
        "measures).",
        rich_help_panel=SPEED,
    ),
]
CudaGraphsOpt = Annotated[
    Opt[str],
    typer.Option(
        help="auto, on or off: decoder steps as CUDA graphs, on a GPU (default: the "
        "checkpoint's decode.cuda_graphs).",
        rich_help_panel=SPEED,
    ),
]
CompileOpt = Annotated[
    Opt[str],
    typer.Option(
        "--compile",
        help="auto, on or off: decoder steps compiled by Inductor on a CPU; auto measures "
        "once per machine (default: the checkpoint's decode.compile).",
        rich_help_panel=SPEED,
    ),
]
WorkersOpt = Annotated[
    Opt[int],
    typer.Option(
        help="Batches translated at once on a CPU, each on its share of the threads; 1: "
        "one at a time on all of them; 0: auto (default: the checkpoint's decode.workers).",
        rich_help_panel=SPEED,
    ),
]
InputOpt = Annotated[
    Opt[Path], typer.Option("--input", "-i", help="Default (or -): stdin.", rich_help_panel=IO)
]
OutputOpt = Annotated[
    Opt[Path],
    typer.Option(
        "--output",
        "-o",
        help="Default (or -): stdout; a file is replaced only when complete.",
        rich_help_panel=IO,
    ),
]
FormatOpt = Annotated[
    Opt[str],
    typer.Option(
        help=f"text or jsonl (a line in, a line out), or a document's: {listed([*FORMATS])} "
        "(default: -i's suffix says, else text).",
        rich_help_panel=IO,
    ),
]
ScoresOpt = Annotated[
    bool,
    typer.Option(
        help="Append a tab and the confidence: the mean log-probability per token.",
        rich_help_panel=IO,
    ),
]
SegmentsOpt = Annotated[
    bool,
    typer.Option(
        "--segments",
        help="With --format html or xml: each input line is one segment (a fragment: text "
        "and elements side by side), translated to one output line.",
        rich_help_panel=IO,
    ),
]
SplitOpt = Annotated[
    Opt[bool],
    typer.Option(
        "--split/--no-split",
        help="Translate a line of several sentences sentence by sentence, joined back on its "
        "line (default: the checkpoint's decode.split).",
        rich_help_panel=IO,
    ),
]
PrefixOpt = Annotated[
    Opt[Path],
    typer.Option(
        help="A target prefix for each input line: the output starts with it.",
        rich_help_panel=SEARCH,
    ),
]
ConstraintsOpt = Annotated[
    Opt[Path],
    typer.Option(
        "--constraints",
        help="Phrases each output must contain: tab-separated, a line per input line.",
        rich_help_panel=TERMINOLOGY,
    ),
]
TgtLangOpt = Annotated[
    Opt[str],
    typer.Option(
        help="The language a multilingual model translates into (its <2xx> tag).",
        rich_help_panel=LANGUAGES,
    ),
]
MARKUP = "Markup (html, xml)"


def _tags(help: str) -> typer.models.OptionInfo:
    """A tag list's typer.Option (DeepL's names, comma-separated), under MARKUP."""
    return typer.Option(
        help=f"{help}: tag names, comma-separated (as DeepL's).", rich_help_panel=MARKUP
    )


IgnoreTagsOpt = Annotated[Opt[str], _tags("Elements whose content is kept untranslated")]
NonSplittingTagsOpt = Annotated[Opt[str], _tags("Elements inside a sentence (inline)")]
SplittingTagsOpt = Annotated[Opt[str], _tags("Elements that end a sentence (blocks)")]
OutlineDetectionOpt = Annotated[
    Opt[bool],
    typer.Option(
        "--outline-detection/--no-outline-detection",
        help="With --no-outline-detection only --splitting-tags end a sentence: every other "
        "element is inline (DeepL's outline_detection=0).",
        rich_help_panel=MARKUP,
    ),
]
ItsRulesOpt = Annotated[
    Opt[Path],
    typer.Option(
        help="A W3C ITS 2.0 rules file (its:withinTextRule, its:translateRule) for xml: above "
        "the document's own rules.",
        rich_help_panel=MARKUP,
    ),
]
RetranslateOpt = Annotated[
    bool,
    typer.Option(
        "--retranslate",
        help="In an XLIFF file, translate the units whose target a translator filled too "
        "(by default they are kept as written).",
        rich_help_panel=IO,
    ),
]
GlossaryOpt = Annotated[
    Opt[Path],
    typer.Option(
        help="A 'source term<TAB>target term' TSV: a line with a source term must contain "
        "its target term.",
        rich_help_panel=TERMINOLOGY,
    ),
]


def _engine(
    model: list[Path],
    device: str,
    precision: str | None = None,
    cuda_graphs: str | None = None,
    workers: int | None = None,
    compile: str | None = None,
) -> Engine:
    """The engine `-m` names (`mtkit.engines.loader`)."""
    from mtkit.engines.loader import load_engine, wants_ctranslate2

    check_device(device)
    if not wants_ctranslate2(model):  # an exported folder runs without torch
        tune_runtime()
    return load_engine(model, device, "--device", precision, cuda_graphs, workers, compile)


@app.command()
def translate(
    model: ModelsOpt,
    input: InputOpt = None,
    output: OutputOpt = None,
    format: FormatOpt = None,
    segments: SegmentsOpt = False,
    scores: ScoresOpt = False,
    split: SplitOpt = None,
    alignments: AlignmentsOpt = False,
    align_layer: AlignLayerOpt = None,
    beam: BeamOpt = None,
    lenpen: LenpenOpt = None,
    nbest: NbestOpt = 1,
    max_len_a: MaxLenAOpt = None,
    max_len_b: MaxLenBOpt = None,
    no_repeat_ngram: NoRepeatOpt = None,
    prefix_file: PrefixOpt = None,
    sampling: SamplingOpt = False,
    temperature: TemperatureOpt = None,
    topk: TopkOpt = None,
    topp: ToppOpt = None,
    seed: SeedOpt = None,
    constraints_file: ConstraintsOpt = None,
    glossary: GlossaryOpt = None,
    tgt_lang: TgtLangOpt = None,
    lang_vocab: LangVocabOpt = None,
    shortlist: ShortlistOpt = None,
    device: TranslateDeviceOpt = "auto",
    precision: PrecisionOpt = None,
    cuda_graphs: CudaGraphsOpt = None,
    compile: CompileOpt = None,
    workers: WorkersOpt = None,
    batch_tokens: BatchTokensOpt = None,
    ignore_tags: IgnoreTagsOpt = None,
    non_splitting_tags: NonSplittingTagsOpt = None,
    splitting_tags: SplittingTagsOpt = None,
    outline_detection: OutlineDetectionOpt = None,
    its_rules: ItsRulesOpt = None,
    retranslate: RetranslateOpt = False,
) -> None:
    """Translate text from a file or stdin, one output line per input line, in order.

    With -o the output file is replaced only when every line is translated."""
    from mtkit.api import check_file_options, translate_file

    input, output = dash(input), dash(output)
    with reported():
        written = output_format(format or None, input, scores, segments)
        _refuse_overwriting_inputs(
            output,
            {
                "--input": input,
                "--prefix-file": prefix_file,
                "--constraints": constraints_file,
                "--glossary": glossary,
            },
            model,
        )
        check_file_options(
            written,
            {
                "--prefix-file": bool(prefix_file),
                "--constraints": bool(constraints_file),
                "--scores": scores,
                "--alignments": alignments,
            },
        )
        search = dict(
            beam=beam,
            lenpen=lenpen,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            nbest=nbest,
            no_repeat_ngram=no_repeat_ngram,
            sampling=sampling,
            temperature=temperature,
            topk=topk,
            topp=topp,
            seed=seed,
            alignments=alignments,
            align_layer=align_layer,
            lang_vocab=lang_vocab,
            shortlist=shortlist,
        )
        translate_file(
            _engine(model, device, precision, cuda_graphs, workers, compile),
            input,
            output,
            written,
            search,
            prefix_file=prefix_file,
            constraints_file=constraints_file,
            glossary_file=glossary,
            tgt_lang=tgt_lang,
            split=split,
            batch_tokens=batch_tokens,
            markup=dict(
                ignore_tags=ignore_tags,
                non_splitting_tags=non_splitting_tags,
                splitting_tags=splitting_tags,
                outline_detection=outline_detection,
                its_rules=its_rules,
            ),
            retranslate=retranslate,
        )


def _refuse_overwriting_inputs(
    output: Path | None, inputs: dict[str, Path | None], model: list[Path]
) -> None:
    from mtkit.core.atomic import refuse_same_file
    from mtkit.engines.loader import model_files

    if output:
        refuse_same_file(output, {**inputs, **model_files(model)})


@app.command(name="eval")
def eval_(
    model: Annotated[
        Opt[Path],
        typer.Option("--model", "-m", help="Translate --src first.", rich_help_panel=MODEL),
    ] = None,
    hyp: Annotated[
        Opt[Path], typer.Option(help="Hypotheses, one per line.", rich_help_panel=IO)
    ] = None,
    ref: Annotated[
        Opt[Path], typer.Option(help="References, one per line.", rich_help_panel=IO)
    ] = None,
    src: Annotated[
        Opt[Path],
        typer.Option(
            help="Source text: translated with -m; where --glossary looks for terms.",
            rich_help_panel=IO,
        ),
    ] = None,
    metrics: Annotated[
        str, typer.Option(help="Comma-separated: bleu,chrf,ter.", rich_help_panel=IO)
    ] = "bleu,chrf,ter",
    json_: Annotated[bool, typer.Option("--json", help="Print JSON.", rich_help_panel=IO)] = False,
    terms: Annotated[
        Opt[Path],
        typer.Option(
            help="Term accuracy: the phrases each line must contain (the --constraints format).",
            rich_help_panel=TERMINOLOGY,
        ),
    ] = None,
    glossary: Annotated[
        Opt[Path],
        typer.Option(
            help="Term accuracy: a 'source term<TAB>target term' TSV, looked up in --src.",
            rich_help_panel=TERMINOLOGY,
        ),
    ] = None,
    lang: Annotated[
        Opt[str],
        typer.Option(
            help="The language the translations should be in (py3langid's code): the "
            "off-target rate.",
            rich_help_panel=LANGUAGES,
        ),
    ] = None,
    among: Annotated[
        Opt[str],
        typer.Option(
            help="With --lang: the languages to tell apart, comma-separated.",
            rich_help_panel=LANGUAGES,
        ),
    ] = None,
    tgt_lang: Annotated[
        Opt[str],
        typer.Option(
            help="With -m: the language a multilingual model translates into (default: --lang).",
            rich_help_panel=LANGUAGES,
        ),
    ] = None,
    device: Annotated[
        str, typer.Option(help="auto, cpu or cuda (with -m).", rich_help_panel=SPEED)
    ] = "auto",
    split: SplitOpt = None,
) -> None:
    """Score translations with sacrebleu (BLEU, chrF, TER, with signatures), term
    accuracy with --terms or --glossary, and the off-target rate with --lang. With -m,
    also how well each translation's confidence ranks it by quality (Spearman's
    correlation with its sentence chrF)."""
    import json

    from mtkit.stages.evaluate import evaluate

    with reported():
        report = evaluate(
            ref,
            hyp=hyp,
            model=model,
            src=src,
            metrics=metrics,
            terms=terms,
            glossary=glossary,
            lang=lang,
            among=among,
            tgt_lang=tgt_lang,
            device=device,
            split=split,
        )
    if json_:
        typer.echo(json.dumps(report.json()))
    else:
        for line in report.lines():
            typer.echo(line)


@app.command()
def serve(
    model: ModelsOpt,
    host: Annotated[
        str,
        typer.Option(help="Address to listen on (loopback unless set).", rich_help_panel=SERVER),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="Port to listen on (1 to 65535).", rich_help_panel=SERVER)
    ] = 8080,
    api_key: Annotated[
        Opt[str],
        typer.Option(
            envvar="MTKIT_API_KEY",
            show_envvar=True,
            rich_help_panel=SERVER,
            help="Require 'Authorization: Bearer KEY' on /v1/* (but the probes /v1/health "
            "and /v1/ready).",
        ),
    ] = None,
    cors_origin: Annotated[
        Opt[list[str]],
        typer.Option(
            rich_help_panel=SERVER,
            help="Let scripts of web pages from this origin (such as https://example.org; "
            "'*': any, as LibreTranslate) call the API from a browser; repeat for several. "
            "Default: none but the page at /.",
        ),
    ] = None,
    max_lines: Annotated[
        int, typer.Option(help="Sentences per request.", rich_help_panel=SERVER)
    ] = 64,
    max_chars: Annotated[
        int, typer.Option(help="Characters per request.", rich_help_panel=SERVER)
    ] = 20_000,
    body_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a request's body may take to arrive, then 408 (above 0, at most "
            "3,600); at shutdown, 2 more at most, then 503.",
            rich_help_panel=SERVER,
        ),
    ] = 30.0,
    drain_delay: Annotated[
        float,
        typer.Option(
            help="Seconds to go on serving after SIGTERM with /v1/ready at 503, so that a load "
            "balancer stops sending requests before the port closes (0 to 600).",
            rich_help_panel=SERVER,
        ),
    ] = 0.0,
    document_max_bytes: Annotated[
        Opt[int],
        typer.Option(
            help="Bytes of an uploaded file, then 413 (1 to 1,073,741,824; default: 10 MiB).",
            rich_help_panel=DOCUMENTS,
        ),
    ] = None,
    document_max_chars: Annotated[
        Opt[int],
        typer.Option(
            help="Characters of one document's text; past them it ends in an error, 413 for "
            "its result (default: 1,000,000).",
            rich_help_panel=DOCUMENTS,
        ),
    ] = None,
    document_max_jobs: Annotated[
        Opt[int],
        typer.Option(
            help="Documents held at once: queued, translating or awaiting download; then 429 "
            "(default: 16).",
            rich_help_panel=DOCUMENTS,
        ),
    ] = None,
    document_workers: Annotated[
        Opt[int],
        typer.Option(
            help="Documents translated at once, their sentences batched with the text "
            "requests' (1 to 64; default: 2).",
            rich_help_panel=DOCUMENTS,
        ),
    ] = None,
    document_expiry: Annotated[
        Opt[float],
        typer.Option(
            help="Seconds a translated document (or its error) waits for its download, then "
            "is deleted (0 to 604,800, a week; default: 3,600).",
            rich_help_panel=DOCUMENTS,
        ),
    ] = None,
    beam: BeamOpt = None,
    lenpen: LenpenOpt = None,
    max_len_a: MaxLenAOpt = None,
    max_len_b: MaxLenBOpt = None,
    no_repeat_ngram: NoRepeatOpt = None,
    align_layer: Annotated[Opt[int], _help("align_layer", SEARCH)] = None,
    sampling: SamplingOpt = False,
    temperature: TemperatureOpt = None,
    topk: TopkOpt = None,
    topp: ToppOpt = None,
    seed: SeedOpt = None,
    glossary: GlossaryOpt = None,
    lang_vocab: LangVocabOpt = None,
    shortlist: ShortlistOpt = None,
    device: TranslateDeviceOpt = "auto",
    precision: PrecisionOpt = None,
    max_batch_tokens: Annotated[
        Opt[int],
        typer.Option(
            help="Source tokens one batch takes (default: the checkpoint's decode.batch_tokens; "
            "on CUDA, sized for the GPU).",
            rich_help_panel=SPEED,
        ),
    ] = None,
    max_wait_ms: Annotated[
        float,
        typer.Option(
            help="Longest wait of a sentence for others to batch with (0 to 60,000).",
            rich_help_panel=SPEED,
        ),
    ] = 5.0,
    continuous: Annotated[
        bool,
        typer.Option(
            "--continuous/--rounds",
            rich_help_panel=SPEED,
            help="Greedy requests join a running search between its steps (--rounds: batched "
            "in rounds).",
        ),
    ] = True,
) -> None:
    """Serve translations over HTTP: a JSON API, a page at /, docs at /docs.

    Concurrent requests are batched together. SIGTERM or Ctrl-C finishes the requests in
    flight and one last round of the waiting ones, answers the rest 503, then exits."""
    _need_serve_extra()
    from mtkit.engines.session import Session
    from mtkit.serving.app import (
        checked_document_limits,
        checked_drain_delay,
        checked_limits,
        checked_origins,
        run_service,
    )

    with reported():
        api_key = _api_key(api_key)
        documents = checked_document_limits(
            document_max_bytes,
            document_max_chars,
            document_max_jobs,
            document_workers,
            document_expiry,
        )
        limits = checked_limits(
            port, max_batch_tokens, max_wait_ms, max_lines, max_chars, body_timeout, documents
        )
        origins = checked_origins(cors_origin or ())
        drain_delay = checked_drain_delay(drain_delay)
        terms = _glossary(glossary)
        loading = time.perf_counter()
        # one batch at a time on all the threads: a server's batches are its requests',
        # each waited for (no helper processes beside a service's threads)
        engine = _engine(model, device, precision, workers=1)
        load_seconds = time.perf_counter() - loading
        defaults = Session.open(  # refused now, not in every request
            engine,
            dict(
                beam=beam,
                lenpen=lenpen,
                max_len_a=max_len_a,
                max_len_b=max_len_b,
                no_repeat_ngram=no_repeat_ngram,
                sampling=sampling,
                temperature=temperature,
                topk=topk,
                topp=topp,
                seed=seed,
                align_layer=align_layer,
                alignments=align_layer is not None,
                lang_vocab=lang_vocab,
                shortlist=shortlist,
            ),
            constrained_by=["--glossary"] if glossary else [],
            target=False,  # (each request names its own)
        ).opts
        stopped_by = run_service(
            engine,
            replace(defaults, alignments=False),
            limits,
            model,
            host,
            port,
            continuous,
            api_key,
            terms,
            origins,
            load_seconds,
            drain_delay,
        )
    if stopped_by == signal.SIGINT:  # Ctrl-C: "interrupted", as everywhere; SIGTERM: 0
        typer.echo("interrupted", err=True)
        raise typer.Exit(code=130)


def _need_serve_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        typer.echo(
            "error: mtkit serve needs FastAPI and uvicorn: pip install 'mtkit[serve]'", err=True
        )
        raise typer.Exit(code=2) from None


def _api_key(given: str | None) -> str | None:
    if given is None and os.environ.get("MTKIT_API_KEY") is not None:
        given = os.environ["MTKIT_API_KEY"]  # click takes an empty one for unset
    if given is not None and not given.strip():
        raise OptionError(
            "the API key is empty (--api-key or MTKIT_API_KEY): give a "
            "key, or neither to serve without one"
        )
    return given or None


def _glossary(path: Path | None):
    """The glossary at `path` (`mtkit.core.terms.Glossary`), or None."""

    return Glossary.read(path) if path else None
