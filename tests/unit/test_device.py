"""The CPU runtime settings and autocast (`mtkit.core.device`)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from mtkit.core.device import ONEDNN_CACHE_ENTRIES, autocast


def test_the_runtime_settings_cap_onednns_kernel_caches_unless_the_user_set_them():
    """Both caches read their size at first use, so the setting must be in the
    environment before the first bf16 matrix product (benchmarks/memory.py shows the
    effect: bf16 training at the memory of fp32)."""
    probe = (
        "import os; from mtkit.core.device import tune_cpu_runtime; tune_cpu_runtime(); "
        "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], "
        "os.environ['LRU_CACHE_CAPACITY'])"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
    }
    ours = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert ours == [str(ONEDNN_CACHE_ENTRIES)] * 2
    theirs = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**env, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "500"},
        check=True,
    ).stdout.split()
    assert theirs == ["500", str(ONEDNN_CACHE_ENTRIES)]


def test_autocast_runs_in_bf16_when_chosen_and_plain_fp32_for_none():
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with autocast(torch.device("cpu"), torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
    with autocast("cpu", None):
        assert layer(x).dtype == torch.float32
        assert not torch.is_autocast_enabled("cpu")
