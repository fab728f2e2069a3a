"""Run under torchrun by tests/e2e/test_ranks.py: several `mtkit` commands one after
another in each rank, as `python -m mtkit ARGS...` runs each (one launch's imports and
rendezvous for them all: the process group is started here, before the first, so each
command finds it and leaves it, and ended after the last); stops at the first that fails,
with its exit code. argv[1]: the commands, a JSON list of argument lists."""

import json
import sys

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
