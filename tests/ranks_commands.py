"""`mtkit` commands under torchrun for the tests of `mtkit.engines.ranks`
(tests/e2e/test_ranks_cli.py, tests/faults/test_fault_ranks.py).

`launch(ranks, commands, env)` starts `python -m torch.distributed.run --standalone
--nproc_per_node=RANKS` on this file, which runs the commands one after another in each
rank, as `python -m mtkit ARGS...` runs each: one launch's imports and rendezvous for them
all (the process group is started before the first, so each command finds it and leaves
it, and ended after the last). It stops at the first command that fails, with its exit
code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch(
    ranks: int, commands: list[list[object]], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess:
    """The torchrun job's exit code and output (stdout and stderr together); one thread a
    rank, the measured choices kept where `env` says (MTKIT_CACHE_DIR)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ranks}",
            __file__,
            json.dumps([[str(a) for a in args] for args in commands]),
        ],
        env={**os.environ, **env, "OMP_NUM_THREADS": "1", "PYTHONPATH": _path(env)},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def _path(env: dict[str, str]) -> str:
    """PYTHONPATH: this checkout's mtkit first, then `env`'s (a fault module's folder)."""
    return os.pathsep.join([str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])


if __name__ == "__main__":
    import torch.distributed as dist

    from mtkit.cli import main
    from mtkit.core.device import join_ranks

    join_ranks("cpu")
    for args in json.loads(sys.argv[1]):
        sys.argv = ["mtkit", *args]
        try:
            main()
        except SystemExit as e:
            if e.code:
                raise
    dist.destroy_process_group()
