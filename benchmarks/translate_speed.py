"""Translation speed: sentences/s, target tokens/s and peak memory, greedy and beam 5.

    python benchmarks/translate_speed.py -m runs/multi30k/checkpoints/best.pt \\
        [--src data/multi30k/test2016.en.gz] [--limit 1000] [--compare hf] [--device auto]
    python benchmarks/translate_speed.py -m CKPT --options [--ensemble CKPT2] [--rounds 3]
    python benchmarks/translate_speed.py -m CKPT --compare ct2 [--ref data/multi30k/test2016.de.gz]
        [--compiled]
    python benchmarks/translate_speed.py -m CKPT --constraints --limit 500 (terminology.py)

Translates the source file (Multi30k test2016 by default) with mtkit's batched search,
greedy and beam 5, on the current device and prints one JSON line. With `--compare hf`
it copies the checkpoint's weights into a Hugging Face `transformers` MarianMTModel of
the same dimensions (nothing downloaded; `pip install mtkit[bench]`), runs
`generate(num_beams=5)` on length-sorted batches of 16, 64 and 256 sentences and of
mtkit's token batches, with its `sdpa` and its `eager` attention, times mtkit at 2000 and
its default batch tokens, and prints the
speed ratio of each side at its best batch size, and the share of sentences whose
outputs are identical. For a like-for-like search both
rank by plain log-probability (length penalty 0; Hugging Face's penalty is not GNMT's),
stop a sentence once it has 5 finished hypotheses (`early_stopping=True`), forbid pad and
bos, and allow up to `--max-len` tokens.

With `--options` it times the decoding options against plain beam 5 instead, in
interleaved rounds (medians): 1 sample per line (as for back-translation), 5 samples per
line, no-repeat 3-grams, word alignments,
and a two-model ensemble (the checkpoint with `--ensemble CKPT2`, by default with a
second copy of itself), and prints each one's cost as a ratio to beam 5.

With `--compare ct2` it exports the checkpoint to a temporary folder (float32 and int8,
`pip install mtkit[ct2]`) and times native mtkit (fp32, what `auto` chose, and int8) and
CTranslate2 on the same lines, greedy
and beam 5 with the checkpoint's length penalty, `--rounds` rounds (medians, load time
excluded), each engine in a process of its own (in one process, one engine's OpenMP
threads slow the other). Each engine first gets its best batch size of --batch-sweep
source tokens. The engines take turns, one timed run each per round, so that a slow
spell of a shared machine falls on all of them, not on one. It reports sentences/s,
BLEU against `--ref`, the share of outputs identical to native mtkit fp32, each engine's
start (loading and its first 100 lines: with `--compiled`, each native engine is timed
again with compiled decoder steps, `--compile on`, and its start holds the compiling,
from Inductor's disk cache where an earlier run left it), and the peak
RSS of one `mtkit translate` process per engine (beam 5), also above what a process
holds once it has imported the engine's runtime (torch or CTranslate2) and the CLI.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from train_throughput import PeakMemory, process_peak_rss_mb, sync  # noqa: I001 (a sibling script)

from mtkit.core.device import cpu_description, tune_cpu_runtime
from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import BOS, EOS, PAD
from mtkit.engines.loader import load_engine
from mtkit.engines.pytorch import TorchEngine, length_batches
from mtkit.model.int8 import int8_supported
from mtkit.model.transformer import Transformer, sinusoidal_positions
from mtkit.search.beam import padded


def read_source(path: str, limit: int) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:limit]


def time_mtkit(translator: TorchEngine, lines: list[str], opts: SearchOptions, batch_tokens: int):
    device = torch.device(str(translator.device))  # CT2Engine's is a string
    sync(device)
    with PeakMemory(device) as memory:
        start = time.perf_counter()
        hyps = translator.translate(lines, opts, batch_tokens=batch_tokens)
        sync(device)
        elapsed = time.perf_counter() - start
    outputs = [h[0].tokens for h in hyps]
    return outputs, elapsed, memory.peak


def marian_copy(model: Transformer, attention: str = "sdpa"):
    """A MarianMTModel with the mtkit model's dimensions and weights, and the attention
    implementation `attention` (eager or sdpa)."""
    from transformers import MarianConfig, MarianMTModel

    cfg = model.cfg
    if cfg.norm != "post" or cfg.positions != "sinusoidal" or not cfg.share_embeddings:
        raise SystemExit(
            "--compare hf needs a post-norm model with sinusoidal positions "
            "and shared embeddings (Marian's layout)"
        )
    vocab = model.tgt_embed.tokens.num_embeddings
    hf = MarianMTModel(
        MarianConfig(
            vocab_size=vocab,
            d_model=cfg.d_model,
            encoder_layers=cfg.encoder_layers,
            decoder_layers=cfg.decoder_layers,
            encoder_attention_heads=cfg.heads,
            decoder_attention_heads=cfg.heads,
            encoder_ffn_dim=cfg.ffn_dim,
            decoder_ffn_dim=cfg.ffn_dim,
            activation_function=cfg.activation,
            max_position_embeddings=cfg.max_positions,
            scale_embedding=True,
            pad_token_id=PAD,
            eos_token_id=EOS,
            bos_token_id=BOS,
            decoder_start_token_id=BOS,
            forced_eos_token_id=None,
            share_encoder_decoder_embeddings=True,
            attn_implementation=attention,
        )
    )
    ours = model.state_dict()
    theirs = {"model.shared.weight": ours["tgt_embed.tokens.weight"]}
    table = sinusoidal_positions(cfg.max_positions, cfg.d_model)
    for side in ("encoder", "decoder"):
        theirs[f"model.{side}.embed_tokens.weight"] = ours["tgt_embed.tokens.weight"]
        theirs[f"model.{side}.embed_positions.weight"] = table
    names = {"self_attn": "self_attn", "cross_attn": "encoder_attn"}
    for prefix, stack in (("encoder", "encoder_layers"), ("decoder", "decoder_layers")):
        for i in range(getattr(cfg, stack)):
            src, dst = f"{stack}.{i}.", f"model.{prefix}.layers.{i}."
            attns = ["self_attn"] + (["cross_attn"] if prefix == "decoder" else [])
            for attn in attns:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    for p in ("weight", "bias"):
                        theirs[f"{dst}{names[attn]}.{proj}.{p}"] = ours[f"{src}{attn}.{proj}.{p}"]
            norms = (
                {"attn_block": "self_attn_layer_norm", "ffn_block": "final_layer_norm"}
                if prefix == "encoder"
                else {
                    "self_block": "self_attn_layer_norm",
                    "cross_block": "encoder_attn_layer_norm",
                    "ffn_block": "final_layer_norm",
                }
            )
            for block, norm in norms.items():
                for p in ("weight", "bias"):
                    theirs[f"{dst}{norm}.{p}"] = ours[f"{src}{block}.norm.{p}"]
            for mine, hf_name in (("inner", "fc1"), ("outer", "fc2")):
                for p in ("weight", "bias"):
                    theirs[f"{dst}{hf_name}.{p}"] = ours[f"{src}ffn.{mine}.{p}"]
    missing, unexpected = hf.load_state_dict(theirs, strict=False)
    left = [k for k in missing if not k.endswith(("final_logits_bias", "lm_head.weight"))]
    if left or unexpected:
        raise SystemExit(f"weight copy incomplete: missing {left[:3]}, unexpected {unexpected[:3]}")
    return hf.eval()


def time_hf(
    hf,
    translator: TorchEngine,
    lines: list[str],
    opts: SearchOptions,
    max_len: int,
    batch_tokens: int,
    sentences: int | None = None,
):
    """Hugging Face generate() on length-sorted batches: of `sentences` sentences each,
    or (None) the token batches mtkit forms."""
    ids = translator.encode(lines)
    order = sorted(range(len(ids)), key=lambda k: -len(ids[k]))
    outputs: list[list[int]] = [[] for _ in lines]
    device = translator.device
    batches = (
        list(length_batches(order, ids, batch_tokens))
        if sentences is None
        else [order[i : i + sentences] for i in range(0, len(order), sentences)]
    )
    with PeakMemory(device) as memory:
        start = time.perf_counter()
        for batch in batches:
            src = padded([ids[k] + [EOS] for k in batch]).to(device)
            with torch.no_grad():
                out = hf.generate(
                    input_ids=src,
                    attention_mask=src != PAD,
                    num_beams=opts.beam,
                    do_sample=False,
                    length_penalty=0.0,
                    early_stopping=True,
                    max_new_tokens=max_len + 1,
                    min_new_tokens=1,
                    suppress_tokens=[PAD, BOS],
                    num_return_sequences=1,
                )
            for k, row in zip(batch, out.tolist()):
                row = row[1:]  # decoder start token
                outputs[k] = row[: row.index(EOS)] if EOS in row else [t for t in row if t != PAD]
        sync(device)
        elapsed = time.perf_counter() - start
    return outputs, elapsed, memory.peak


def time_options(
    translator: TorchEngine, path: str, lines: list[str], second: str, rounds: int
) -> dict:
    """Seconds per run (median of `rounds`, interleaved) of beam 5 and of each decoding
    option, and each option's cost relative to beam 5."""
    pair = load_engine([path, second], str(translator.device))
    base, tokens = SearchOptions(), translator.config.decode.batch_tokens
    runs = {
        "beam5": (translator, base),
        "sampling1": (translator, replace(base, sampling=True, beam=1)),
        "sampling5": (translator, replace(base, sampling=True)),
        "no_repeat_ngram3": (translator, replace(base, no_repeat_ngram=3)),
        "alignments": (translator, replace(base, alignments=True)),
        "ensemble2": (pair, base),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (t, opts) in runs.items():
            times[name].append(time_mtkit(t, lines, opts, tokens)[1])
    median = {name: statistics.median(ts) for name, ts in times.items()}
    return {
        **{f"{name}_sentences_per_s": round(len(lines) / m, 1) for name, m in median.items()},
        **{
            f"{name}_cost_vs_beam5": round(m / median["beam5"], 2)
            for name, m in median.items()
            if name != "beam5"
        },
    }


def compare_ct2(translator: TorchEngine, args, lines: list[str]) -> dict:
    """Native mtkit against its CTranslate2 exports (float32, int8); see the docstring.
    Each engine is timed in a process of its own (`engine_worker`): in one process, the
    second engine's OpenMP threads slow the first (native beam 5 in bf16 fell from
    ~250 to ~190 sentences/s here once CTranslate2 had run beside it)."""
    import os
    import subprocess
    import sys
    import tempfile

    import sacrebleu

    from mtkit.interop.ct2_export import export_ctranslate2

    refs = read_source(args.ref, args.limit)
    out: dict = {"cpu": cpu_description(), "native_auto_chose": translator.precision}
    with tempfile.TemporaryDirectory() as tmp:
        engines = {"native": [args.model, "fp32", "off"]}  # the reference of "identical"
        if translator.precision["precision"] != "fp32":  # what --precision auto chose
            engines["native_auto"] = [args.model, "auto", "off"]
        if int8_supported():  # dynamic int8 products (`mtkit.model.int8`), asked for
            engines["native_int8"] = [args.model, "int8", "off"]
        if args.compiled:  # each of them again with compiled decoder steps (`--compile on`)
            engines.update({f"{n}_compiled": [m, p, "on"] for n, (m, p, _) in engines.items()})
        for q in ("float32", "int8"):
            export_ctranslate2(args.model, f"{tmp}/{q}", q)
            engines[f"ct2_{q}"] = [f"{tmp}/{q}", "auto", "off"]
        runs: dict[str, dict] = {}
        # Round by round, each engine in a fresh process of its own for one timed run (the
        # first round also finds its best batch sizes): timings on a shared machine drift
        # by tens of percent within minutes, and taking turns spreads a slow spell over
        # every engine instead of one.
        for _ in range(args.rounds):
            for name, (model, precision, compiled) in engines.items():
                batches = (
                    {mode: r["batch_tokens"] for mode, r in runs[name].items()}
                    if name in runs
                    else None
                )
                done = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "-m",
                        model,
                        "--engine-worker",
                        precision,
                        "--engine-compile",
                        compiled,
                        "--src",
                        args.src,
                        "--limit",
                        str(args.limit),
                        "--rounds",
                        "1",
                        "--batch-sweep",
                        args.batch_sweep,
                        "--device",
                        args.device,
                        *(["--engine-batches", json.dumps(batches)] if batches else []),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                result = json.loads(done.stdout.splitlines()[-1])
                out.setdefault("start_s", {}).setdefault(name, result.pop("start_s"))
                for mode, r in result.items():
                    if name in runs:
                        r["times"] = runs[name][mode]["times"] + r["times"]
                runs[name] = result
        for mode in ("greedy", "beam5"):
            speed = {n: len(lines) / statistics.median(r[mode]["times"]) for n, r in runs.items()}
            for name, r in runs.items():
                out[f"{mode}_{name}"] = {
                    "sentences_per_s": round(speed[name], 1),
                    "batch_tokens": r[mode]["batch_tokens"],
                    "bleu": round(sacrebleu.corpus_bleu(r[mode]["texts"], [refs]).score, 2),
                    "identical_to_native": round(
                        sum(a == b for a, b in zip(r[mode]["texts"], runs["native"][mode]["texts"]))
                        / len(lines),
                        3,
                    ),
                }
            for q in ("float32", "int8"):
                for name in (n for n in runs if n.startswith("native")):
                    out[f"{mode}_{name}_vs_ct2_{q}"] = round(speed[name] / speed[f"ct2_{q}"], 2)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.writelines(x + "\n" for x in lines)
        for name, model, extra in (
            ("native_fp32", args.model, ["--precision", "fp32"]),
            ("native_auto", args.model, ["--precision", "auto"]),
            *([("native_int8", args.model, ["--precision", "int8"])] if int8_supported() else []),
            ("ct2_float32", f"{tmp}/float32", []),
            ("ct2_int8", f"{tmp}/int8", []),
        ):
            out[f"peak_rss_mb_{name}"] = round(
                process_peak_rss_mb(
                    [
                        "translate",
                        "-m",
                        model,
                        "-i",
                        f.name,
                        "--beam",
                        "5",
                        "--device",
                        "cpu",
                        *extra,
                    ]
                )
            )
        os.unlink(f.name)
    # What each engine's process holds before its model: the CLI and the runtime it
    # imports (torch for native mtkit, CTranslate2 for its exports, no torch there); the
    # peak above it is what the model and the search take
    for runtime, names in (
        ("torch", ("native_fp32", "native_auto", "native_int8")),
        ("ctranslate2", ("ct2_float32", "ct2_int8")),
    ):
        base = import_rss_mb(["mtkit.cli", runtime])
        out[f"import_rss_mb_{runtime}"] = round(base)
        for name in (n for n in names if f"peak_rss_mb_{n}" in out):
            out[f"rss_above_import_mb_{name}"] = round(out[f"peak_rss_mb_{name}"] - base)
    return out


def import_rss_mb(modules: list[str]) -> float:
    """RSS in MB of a fresh Python process once it has imported `modules`."""
    import subprocess
    import sys

    probe = (
        "import importlib, re, sys\n"
        "for m in sys.argv[1:]: importlib.import_module(m)\n"
        "print(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *modules], capture_output=True, text=True, check=True
    )
    return int(done.stdout.split()[-1]) / 1024


def engine_worker(args, lines: list[str]) -> dict:
    """In a process of its own: one engine's best batch size of --batch-sweep (or the
    --engine-batches given), then --rounds timed runs, greedy and beam 5 with the
    checkpoint's length penalty (load and warm-up excluded); its outputs."""
    start = time.perf_counter()
    engine = load_engine(
        args.model, args.device, precision=args.engine_worker, compile=args.engine_compile
    )
    base = SearchOptions.from_config(engine.config.decode)
    engine.translate(lines[:100], base)  # warm-up (and, with --compile on, compiling)
    started = time.perf_counter() - start
    given = json.loads(args.engine_batches) if args.engine_batches else {}
    result = {}
    for mode, beam in (("greedy", 1), ("beam5", 5)):
        opts = replace(base, beam=beam)
        if mode in given:
            best = int(given[mode])
        else:
            sweep = {
                int(b): time_mtkit(engine, lines, opts, int(b))[1]
                for b in args.batch_sweep.split(",")
            }
            best = min(sweep, key=sweep.get)
        times, texts = [], []
        for _ in range(args.rounds):
            outputs, elapsed, _ = time_mtkit(engine, lines, opts, best)
            times.append(elapsed)
            texts = [engine.tgt_vocab.decode(o) for o in outputs]
        result[mode] = {"batch_tokens": best, "times": times, "texts": texts}
    result["start_s"] = round(started, 1)  # loading, and the first 100 lines (compiling)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--src", default="data/multi30k/test2016.en.gz")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-len", type=int, default=60)
    parser.add_argument("--compare", choices=["hf", "ct2"], default=None)
    parser.add_argument("--ref", default="data/multi30k/test2016.de.gz")
    parser.add_argument("--batch-sweep", default="2000,8000")
    parser.add_argument(
        "--options", action="store_true", help="time the decoding options against beam 5"
    )
    parser.add_argument("--ensemble", default=None, help="second model of the ensemble")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--constraints",
        action="store_true",
        help="time terminology constraints (benchmarks/terminology.py)",
    )
    parser.add_argument("--constraint-beams", default="5,10")
    parser.add_argument("--per-line", type=int, default=2, help="constraints per line")
    parser.add_argument("--engine-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--engine-batches", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--engine-compile", default="off", help=argparse.SUPPRESS)
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="with --compare ct2: each native engine also with compiled steps (--compile on)",
    )
    args = parser.parse_args()

    lines = read_source(args.src, args.limit)
    if args.engine_worker:  # one engine, timed in this process (`compare_ct2`)
        if not Path(args.model).is_dir():  # as `mtkit translate` does for a checkpoint
            tune_cpu_runtime()
        print(json.dumps(engine_worker(args, lines)))
        return
    translator = load_engine(args.model, args.device)
    result = {"model": args.model, "device": str(translator.device), "sentences": len(lines)}
    if args.compare == "ct2":
        result |= compare_ct2(translator, args, lines)
        print(json.dumps(result))
        return
    if args.constraints:
        from terminology import compare_constraints  # a sibling script

        result |= {"cpu": cpu_description(), "precision": translator.precision["precision"]}
        sources = read_source(args.src, 10**9)  # all of them: --limit is the lines kept
        result |= compare_constraints(translator, args, sources, read_source(args.ref, 10**9))
        print(json.dumps(result))
        return
    if args.options:
        result |= time_options(
            translator, args.model, lines, args.ensemble or args.model, args.rounds
        )
        print(json.dumps(result))
        return
    runs = {"greedy": 1, "beam5": 5}
    outputs = {}
    translator.translate(lines[:100], SearchOptions(beam=5))  # warm-up (on a GPU: kernels)
    for name, beam in runs.items():
        # Plain log-probability ranking and a fixed output limit, as the comparison needs.
        opts = SearchOptions(beam=beam, lenpen=0.0, max_len_a=0.0, max_len_b=args.max_len)
        out, elapsed, peak = time_mtkit(
            translator, lines, opts, translator.config.decode.batch_tokens
        )
        tokens = sum(len(o) + 1 for o in out)
        result[f"{name}_sentences_per_s"] = round(len(lines) / elapsed, 1)
        result[f"{name}_tokens_per_s"] = round(tokens / elapsed)
        result[f"{name}_peak_memory_mb"] = round(peak / 2**20)
        outputs[name] = out
    if args.compare == "hf":
        # Each side at its best batch size: Hugging Face's generate() keeps finished
        # sentences in the batch, so it prefers small batches; mtkit is swept too.
        # Its attention implementations are swept too (eager was faster on CPUs in training).
        tokens = translator.config.decode.batch_tokens
        opts = SearchOptions(beam=5, lenpen=0.0, max_len_a=0.0, max_len_b=args.max_len)
        sweep = {}
        for attention in ("sdpa", "eager"):
            hf = marian_copy(translator.model, attention).to(translator.device)
            for size in (16, 64, 256, None):  # None: mtkit's token batches
                out, elapsed, peak = time_hf(
                    hf, translator, lines, opts, args.max_len, tokens, size
                )
                batch = f"{size} sentences" if size else f"{tokens} tokens"
                sweep[f"{attention}, {batch}"] = (elapsed, out, peak)
        ours = {f"{b} tokens": time_mtkit(translator, lines, opts, b)[1] for b in (2000, tokens)}
        hf_best = min(sweep, key=lambda k: sweep[k][0])
        mt_best = min(ours, key=ours.get)
        result["hf_beam5_sentences_per_s_by_batch"] = {
            k: round(len(lines) / v[0], 1) for k, v in sweep.items()
        }
        result["mtkit_beam5_sentences_per_s_by_batch"] = {
            k: round(len(lines) / v, 1) for k, v in ours.items()
        }
        result["hf_best_batch"], result["mtkit_best_batch"] = hf_best, mt_best
        result["hf_beam5_peak_memory_mb"] = round(sweep[hf_best][2] / 2**20)
        result["speedup_beam5_vs_hf_best"] = round(sweep[hf_best][0] / ours[mt_best], 2)
        same = sum(a == b for a, b in zip(outputs["beam5"], sweep[hf_best][1]))
        result["identical_outputs_share"] = round(same / len(lines), 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
