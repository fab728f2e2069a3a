"""How steady `precision: auto`'s choice is: N fresh processes each calibrate as a new
training run would (the model's own shapes), on an idle machine and then while another
process keeps every core busy with training-sized matrix products.

    python benchmarks/precision_choice.py [--config configs/multi30k.yaml] [--starts 20]
        [--load none,busy]

Prints one JSON line: for each load, the choices (how many starts chose bf16 and fp32),
the spread of the figures, the seconds one calibration took, and the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mtkit.core.device import cpu_description

ROOT = Path(__file__).resolve().parents[1]

# One start: calibrate exactly as `mtkit train` does and print the outcome.
_START = """
import json, sys, time
from mtkit.core.config import load_config
from mtkit.tuning.precision import calibrate_cpu, calibration_shape
cfg = load_config(sys.argv[1])
shape = calibration_shape(cfg.train.max_tokens, cfg.model.d_model, cfg.model.ffn_dim)
start = time.perf_counter()
c = calibrate_cpu(*shape)
print(json.dumps({**c.as_dict(), "bf16": c.bf16_faster, "s": time.perf_counter() - start}))
"""

# The load: matrix products on every core until killed (as another training would).
_LOAD = """
import torch
a, b = torch.randn(2048, 1024), torch.randn(1024, 1024)
while True:
    (a @ b).sum().item()
"""


def starts(config: str, n: int) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", _START, config],
                check=True,
                capture_output=True,
                text=True,
                env=env,
            ).stdout
        )
        for _ in range(n)
    ]


def summary(runs: list[dict]) -> dict:
    bf16 = sum(r["bf16"] for r in runs)
    ratios = sorted(r["bf16_ms"] / r["fp32_ms"] for r in runs)
    return {
        "chose_bf16": bf16,
        "chose_fp32": len(runs) - bf16,
        "ratio_min": round(ratios[0], 3),
        "ratio_max": round(ratios[-1], 3),
        "fp32_ms": [r["fp32_ms"] for r in runs],
        "bf16_ms": [r["bf16_ms"] for r in runs],
        "calibration_s_max": round(max(r["s"] for r in runs), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "multi30k.yaml"))
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--load", default="none,busy")
    args = parser.parse_args()
    result: dict = {"cpu": cpu_description(), "config": args.config}
    for load in args.load.split(","):
        loader = None
        if load == "busy":
            loader = subprocess.Popen([sys.executable, "-c", _LOAD])
            time.sleep(2)  # its threads are up and spinning
        try:
            result[load] = summary(starts(args.config, args.starts))
        finally:
            if loader is not None:
                loader.kill()
                loader.wait()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
