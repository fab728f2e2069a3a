"""`pretrained.py translate`: an imported model through mtkit and CTranslate2
(`translate_speed.py --compare ct2`, each engine in its own process) and through
`transformers`' `generate` on the Hugging Face folder it came from, on the same lines."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "data" / "multi30k" / "test2016.en.gz"


def translate_speed(folder: Path, args) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            str(HERE / "translate_speed.py"),
            "-m",
            str(folder / "imported.pt"),
            "--compare",
            "ct2",
            "--limit",
            str(args.limit),
            "--rounds",
            "1",
            "--src",
            str(SRC),
            "--ref",
            str(SRC.with_name("test2016.de.gz")),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    ours = json.loads(done.stdout.splitlines()[-1])
    out = {k: v for k, v in ours.items() if k.startswith(("greedy_", "beam5_", "peak_rss"))}
    out["native_auto_chose"] = ours.get("native_auto_chose")
    out |= hf_speed(folder / "marian", args)
    for mode in ("greedy", "beam5"):
        hf = out[f"{mode}_transformers"]["sentences_per_s"]
        for name in ("native", "native_auto", "ct2_float32", "ct2_int8"):
            if f"{mode}_{name}" in out:
                out[f"{mode}_{name}_vs_transformers"] = round(
                    out[f"{mode}_{name}"]["sentences_per_s"] / hf, 2
                )
    return out


def hf_speed(folder: Path, args) -> dict:
    """`generate` on length-sorted batches of 16 and 64 sentences (its best), greedy
    and beam 5 with the checkpoint's decoding: length penalty 0.6 (Hugging Face's own
    form), at most 1.2 x source + 10 tokens, in fp32 (its default)."""
    import gzip

    import transformers

    tok = transformers.MarianTokenizer.from_pretrained(folder)
    model = transformers.MarianMTModel.from_pretrained(folder).eval()
    with gzip.open(SRC, "rt", encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(args.limit)]
    ids = [tok(x)["input_ids"] for x in lines]
    order = sorted(range(len(lines)), key=lambda k: -len(ids[k]))
    out = {}
    for mode, beam in (("greedy", 1), ("beam5", 5)):
        best = None
        for size in (16, 64):
            start = time.perf_counter()
            for i in range(0, len(order), size):
                batch = [lines[k] for k in order[i : i + size]]
                enc = tok(batch, return_tensors="pt", padding=True)
                with torch.no_grad():
                    model.generate(
                        **enc,
                        num_beams=beam,
                        do_sample=False,
                        max_new_tokens=int(1.2 * enc["input_ids"].size(1)) + 10,
                        **({"length_penalty": 0.6} if beam > 1 else {}),
                    )
            elapsed = time.perf_counter() - start
            if best is None or elapsed < best[0]:
                best = (elapsed, size)
        out[f"{mode}_transformers"] = {
            "sentences_per_s": round(len(lines) / best[0], 1),
            "batch_sentences": best[1],
        }
    out["transformers_settings"] = "fp32 (its default), best of 16 and 64 sentences a batch"
    return out
