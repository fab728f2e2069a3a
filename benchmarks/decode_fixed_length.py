"""Decoding speed at a known amount of work: a model of random weights whose every output
is forced to one length, mtkit's search beside Hugging Face's `generate`.

    python benchmarks/decode_fixed_length.py [--config configs/wmt14-en-de-base.yaml]
        [--vocab-size 32000] [--sentences 1024] [--src-len 24] [--length 24]
        [--device cuda] [--precision bf16] [--beams 1,4] [--batches 256,1024]
        [--hf-batches 32,128,512] [--no-hf]

The model is the config's (default: the WMT14 base Transformer) with random weights, so
its outputs mean nothing, and every source is `--src-len` random pieces. A search may
not end before `--length` tokens and must end there (mtkit: `min_len` and a length limit
of `--length`; Hugging Face: `min_new_tokens` = `max_new_tokens` = `--length` + 1): each
side decodes every sentence for exactly as many steps, so sentences/s and target
tokens/s compare like for like. For each beam size (greedy is 1) it times mtkit's
`beam_search` / greedy search as the PyTorch engine runs them (inference mode, bf16
autocast on CUDA), eager and, on CUDA, in fixed shapes with captured steps
(`mtkit.search.captured`), at each of `--batches` sentences per batch: a cold pass (the
first at that batch size: captures, kernel choices) and a warm one. On CUDA it profiles
one warm pass of the fastest mtkit setting for its GPU-busy share (kernel time / wall
time) and reports each setting's peak GPU memory. Then Hugging Face's MarianMTModel with
the same weights (`translate_speed.marian_copy`), `generate` with its `sdpa` and `eager`
attention at each of `--hf-batches`, at the same precision (bf16 autocast on CUDA); the
ratio is mtkit's best warm setting over Hugging Face's best. One JSON line per beam
size.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from profile_decode import gpu_times  # noqa: I001 (sibling scripts)
from train_throughput import sync
from translate_speed import marian_copy

from mtkit.core.config import load_config
from mtkit.core.device import autocast, cpu_description, tune_cpu_runtime
from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import BOS, EOS, PAD
from mtkit.model.attention import keep_stacked_weights
from mtkit.model.transformer import build_model
from mtkit.search.beam import beam_search, greedy_hypotheses
from mtkit.search.captured import CapturedDecoder


def mtkit_pass(model, src: torch.Tensor, beam: int, length: int, batch: int):
    """Every sentence of src (N, S) decoded to exactly `length` tokens, `batch` at a
    time; returns the outputs' lengths (a check that the work was what was asked)."""
    opts = SearchOptions(beam=max(beam, 1), lenpen=0.0, max_len_a=0.0, max_len_b=length)
    lengths = []
    for start in range(0, src.size(0), batch):
        part = src[start : start + batch]
        if beam == 1:
            hyps = greedy_hypotheses(model, part, opts, min_len=length)
        else:
            hyps = beam_search(model, part, opts, min_len=length)
        lengths += [len(h[0].tokens) for h in hyps]
    return lengths


def hf_pass(hf, src: torch.Tensor, beam: int, length: int, batch: int) -> list[int]:
    lengths = []
    for start in range(0, src.size(0), batch):
        part = src[start : start + batch]
        out = hf.generate(
            input_ids=part,
            attention_mask=part != PAD,
            num_beams=beam,
            do_sample=False,
            length_penalty=0.0,
            early_stopping=True,
            min_new_tokens=length + 1,
            max_new_tokens=length + 1,
            suppress_tokens=[PAD, BOS],
            num_return_sequences=1,
        )
        lengths += [row.size(0) - 2 for row in out]  # less the start token and the last
    return lengths


def timed(run, device: torch.device) -> tuple[float, float, list[int]]:
    """(seconds, peak GPU GB (0 on a CPU), what `run` returned)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    start = time.perf_counter()
    out = run()
    sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    return seconds, peak, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/wmt14-en-de-base.yaml")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--sentences", type=int, default=1024)
    parser.add_argument("--src-len", type=int, default=24)
    parser.add_argument("--length", type=int, default=24)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--batches", default="256,1024")
    parser.add_argument("--hf-batches", default="32,128,512")
    parser.add_argument("--no-hf", action="store_true")
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cpu":
        tune_cpu_runtime()
    torch.manual_seed(0)
    cfg = load_config(args.config).model
    model = build_model(cfg, args.vocab_size, args.vocab_size).to(device).eval()
    hf_models = (
        {} if args.no_hf else {a: marian_copy(model, a).to(device) for a in ("sdpa", "eager")}
    )
    dtype = torch.bfloat16 if args.precision == "bf16" else None
    if device.type == "cpu" and dtype is not None:  # a CPU's bf16 is its weights' (as the
        model = model.to(dtype)  # engine's `bf16_weights`), Hugging Face's too
        hf_models = {a: hf.to(dtype) for a, hf in hf_models.items()}
    keep_stacked_weights(model)  # as the engine's: its weights are final
    src = torch.randint(4, args.vocab_size, (args.sentences, args.src_len + 1), device=device)
    src[:, -1] = EOS

    def context():  # the engine's precision: bf16 autocast on CUDA
        return autocast(device, dtype if device.type == "cuda" else None)

    settings = [("eager", model)]
    if device.type == "cuda":
        settings.append(("captured", CapturedDecoder(model)))  # in fixed shapes
    batches = [int(b) for b in args.batches.split(",")]
    tokens = args.sentences * (args.length + 1)  # target tokens a pass outputs, eos too
    for beam in (int(b) for b in args.beams.split(",")):
        result = {
            "benchmark": "decode_fixed_length",
            "config": args.config,
            "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "cpu": cpu_description(),
            "precision": args.precision,
            "beam": beam,
            "sentences": args.sentences,
            "src_len": args.src_len,
            "length": args.length,
            "mtkit": {},
        }
        best = None
        with context(), torch.inference_mode():
            for name, stepper in settings:
                for batch in batches:

                    def run(stepper=stepper, batch=batch, beam=beam):
                        return mtkit_pass(stepper, src, beam, args.length, batch)

                    cold, _, lengths = timed(run, device)
                    warm, peak, lengths = timed(run, device)
                    assert set(lengths) == {args.length}, sorted(set(lengths))[:5]
                    key = f"{name}, {batch} sentences"
                    result["mtkit"][key] = {
                        "cold_sentences_per_s": round(args.sentences / cold, 1),
                        "warm_sentences_per_s": round(args.sentences / warm, 1),
                        "warm_target_tokens_per_s": round(tokens / warm),
                        "peak_gpu_gb": round(peak, 2),
                    }
                    if isinstance(stepper, CapturedDecoder):
                        result["mtkit"][key]["decoder_steps"] = stepper.record()
                    if best is None or warm < best[0]:
                        best = (warm, key, run)
            if device.type == "cuda":
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    best[2]()
                    sync(device)
                kernels, _ = gpu_times(prof.key_averages())
                result["gpu_busy_share_of_best"] = round(kernels / best[0], 3)
        result["mtkit_best"] = best[1]
        if hf_models:
            hf_times = {}
            for attention, hf in hf_models.items():
                for batch in (int(b) for b in args.hf_batches.split(",")):
                    with context(), torch.no_grad():
                        seconds, peak, lengths = timed(
                            lambda hf=hf, b=batch, n=beam: hf_pass(hf, src, n, args.length, b),
                            device,
                        )
                    assert set(lengths) == {args.length}, sorted(set(lengths))[:5]
                    hf_times[f"{attention}, {batch} sentences"] = (seconds, peak)
            hf_best = min(hf_times, key=lambda k: hf_times[k][0])
            result["hf_sentences_per_s"] = {
                k: round(args.sentences / v[0], 1) for k, v in hf_times.items()
            }
            result["hf_best"] = hf_best
            result["hf_best_peak_gpu_gb"] = round(hf_times[hf_best][1], 2)
            result["speedup_vs_hf_best"] = round(hf_times[hf_best][0] / best[0], 2)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
