"""Starting worker processes (`mtkit.core.signals.held_while_starting_workers`): a forked
worker never collects the garbage it inherited from the main process."""

from __future__ import annotations

import gc
import os

from torch.utils.data import DataLoader

from mtkit.core.signals import held_while_starting_workers, ignore_in_worker


class Noted:
    """Part of a garbage cycle; writes the pid of the process that collects it."""

    def __init__(self, path):
        self.path, self.me = path, self

    def __del__(self):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def collected(batch):
    gc.collect()  # in the worker: what it would collect on its own, at some allocation
    return batch


def test_a_forked_worker_never_collects_the_main_process_garbage(tmp_path):
    """Injected: a garbage cycle of the main process, and a DataLoader worker (forked)
    that collects garbage. Its destructor must run in the main process only: in the fork,
    a C++ object's destructor would join threads the fork does not have (an abort)."""
    notes = tmp_path / "collected"
    was_enabled = gc.isenabled()
    gc.disable()  # the cycle stays garbage until the worker has run
    try:
        Noted(notes)  # unreachable at once: a cycle only the collector frees
        loader = DataLoader(
            list(range(4)),
            batch_size=2,
            num_workers=1,
            collate_fn=collected,
            worker_init_fn=ignore_in_worker,
        )
        with held_while_starting_workers():
            batches = iter(loader)  # starts the worker
        assert [b for b in batches] == [[0, 1], [2, 3]]
        del batches
        assert not notes.exists()  # the worker did not collect it
        gc.collect()
        assert notes.read_text().split() == [str(os.getpid())]  # the main process did
    finally:
        if was_enabled:
            gc.enable()
