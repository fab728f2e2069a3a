"""Training across two nodes under torchrun, simulated on one machine: two torchrun
agents (`--nnodes 2 --node_rank 0|1`, one process each) meet at a local rendezvous and
train over Gloo on the CPU, each running `mtkit train` as a user would."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from mtkit.core.checkpoint import load_checkpoint
from mtkit.core.config import config_from_dict
from mtkit.training.loop import train

from conftest import tiny_config_dict

ROOT = Path(__file__).resolve().parents[2]
TRAIN = {"max_steps": 8, "valid_every": 8, "save_every": 2, "log_every": 2}


def _config(folder: Path, prepared: Path, corpus, dropout: float, **train) -> Path:
    """folder/exp.yaml for a copy of the prepared run in folder/run."""
    shutil.copytree(prepared, folder / "run")
    data = tiny_config_dict(
        corpus,
        folder / "run",
        train={**TRAIN, **train},
        model={"dropout": dropout},
        data={"loader_workers": 0},
    )
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Node 1's process, sent a signal when it starts update `at`: SIGKILL to its torchrun
# agent and to itself at once, as a machine that goes down; or SIGTERM to itself alone
# ("process"), or to its node's process group ("group": the agent, which passes it on to
# its worker, in a session of its own), as a signal that reaches one node only.
_SIGNALLED = """
import os, runpy, signal, sys
import mtkit.training.loop as loop
sig, at, real, calls = getattr(signal, sys.argv[1]), int(sys.argv[2]), loop.apply_update, 0
def apply_update(state, update):
    global calls
    calls += 1
    if calls == at and sig == signal.SIGKILL:
        os.kill(os.getppid(), signal.SIGKILL)
    if calls == at and sys.argv[3] == "group":  # the node's whole process group, as
        os.killpg(os.getpgid(os.getppid()), sig)  # a scheduler sends it: the agent's
    elif calls == at:
        os.kill(os.getpid(), sig)
    return real(state, update)
loop.apply_update = apply_update
sys.argv = ["mtkit", *sys.argv[4:]]
runpy.run_module("mtkit", run_name="__main__", alter_sys=True)
"""


def _nodes(
    configs: tuple[Path, Path], port: int, node1_signalled: tuple[str, int, str] | None = None
) -> list[subprocess.Popen]:
    """Node 0 and node 1, each a torchrun agent with one process running `mtkit train`
    with its config; each in its own process group, as on its own machine. With
    `node1_signalled` (signal, update, "process" | "group"), node 1's process sends that
    signal at the start of that update (`_SIGNALLED`)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    program = [["-m", "mtkit"], ["-m", "mtkit"]]
    if node1_signalled is not None:
        driver = configs[1].parent / "signalled.py"
        driver.write_text(_SIGNALLED)
        program[1] = [str(driver), *map(str, node1_signalled)]
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node_rank",
                str(rank),
                "--nproc_per_node",
                "1",
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                *program[rank],
                "-q",
                "train",
                "-c",
                str(config),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        for rank, config in enumerate(configs)
    ]


def _finish(nodes: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str]]:
    """Each node's exit code and output; on a timeout (a test that fails by hanging),
    the agents and their workers (torchrun starts those in sessions of their own) die."""
    out = []
    try:
        for node in nodes:
            text, _ = node.communicate(timeout=timeout)
            out.append((node.returncode, text))
    except subprocess.TimeoutExpired:
        for node in nodes:
            _kill_workers(node.args[-1])
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
        texts = [node.communicate()[0][-2000:] for node in nodes]
        raise AssertionError(f"a node did not finish in {timeout} s: {texts}") from None
    return out


def _kill_workers(config: str) -> None:
    """Kill every process whose command line names `config` (a node's workers)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and config in (proc / "cmdline").read_text():
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            pass


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
    }


def _valid_loss(run: Path) -> float:
    events = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    return [e["valid_loss"] for e in events if e["event"] == "valid"][-1]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints" / "last.pt")["model"]


def test_two_nodes_train_as_one_process_with_the_same_total_batch_and_only_rank_0_writes(
    prepared, tmp_path, corpus
):
    # Node 1 sees its own copy of the run directory: after training it must be untouched.
    configs = (
        _config(tmp_path / "node0", prepared, corpus, dropout=0.0),
        _config(tmp_path / "node1", prepared, corpus, dropout=0.0),
    )
    before = _files(tmp_path / "node1" / "run")
    for code, text in _finish(_nodes(configs, _free_port())):
        assert code == 0, text[-3000:]
    assert _files(tmp_path / "node1" / "run") == before
    two_nodes = _weights(tmp_path / "node0" / "run")

    # One process taking both ranks' batches in each update (every world_size-th batch
    # is a rank's): the same updates, up to the order of float sums.
    alone = config_from_dict(
        yaml.safe_load(
            _config(tmp_path / "alone", prepared, corpus, 0.0, update_freq=2).read_text()
        )
    )
    assert train(alone).step == TRAIN["max_steps"]
    one = _weights(alone.run_path)
    assert two_nodes.keys() == one.keys()
    # Within 1e-6, but for the key projections' biases: attention's softmax cancels them,
    # so their gradient is 0 up to rounding, which differs with the order of the sums, and
    # Adam scales it up to a full step. They change no output: the validation loss agrees.
    for name in one:
        if not name.endswith("k_proj.bias"):
            torch.testing.assert_close(two_nodes[name], one[name], rtol=0, atol=1e-6, msg=name)
    valid = [_valid_loss(tmp_path / side / "run") for side in ("node0", "alone")]
    assert valid[0] == pytest.approx(valid[1], rel=1e-5)


@pytest.fixture(scope="module")
def uninterrupted(prepared, corpus, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The weights of a two-node run of 12 updates, with dropout, that never stopped."""
    config = _config(tmp_path_factory.mktemp("whole"), prepared, corpus, 0.1, max_steps=12)
    for code, text in _finish(_nodes((config, config), _free_port())):
        assert code == 0, text[-3000:]
    return _weights(config.parent / "run")


def _resume_to_the_end(config: Path, uninterrupted: dict[str, torch.Tensor]) -> None:
    """Both nodes started again: they end with the uninterrupted run's weights, to the
    bit (each rank's dropout RNG is in the checkpoint)."""
    for code, text in _finish(_nodes((config, config), _free_port())):
        assert code == 0, text[-3000:]
    resumed = _weights(config.parent / "run")
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)
    events = [json.loads(line) for line in (config.parent / "run" / "metrics.jsonl").open()]
    starts = [e for e in events if e["event"] == "start"]
    assert [e["world_size"] for e in starts] == [2, 2] and starts[1]["resumed"]


def test_a_node_that_goes_down_stops_the_other_and_both_resume_exactly(
    prepared, tmp_path, corpus, uninterrupted
):
    config = _config(tmp_path, prepared, corpus, dropout=0.1, max_steps=12)
    (code0, text0), (code1, _) = _finish(
        _nodes((config, config), _free_port(), ("SIGKILL", 6, "process"))
    )
    assert code0 != 0 and code1 != 0, text0[-3000:]  # node 0 cannot go on without node 1
    assert "error: rank 0 lost contact with another rank (" in text0, text0[-3000:]
    assert "[rank0]: Traceback" not in text0
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*.pt"))
    assert saved == ["step_2.pt", "step_4.pt"]
    _resume_to_the_end(config, uninterrupted)


@pytest.mark.parametrize("reaches", ["process", "group"])
def test_a_signal_that_reaches_one_node_stops_both_after_the_same_update(
    prepared, tmp_path, corpus, uninterrupted, reaches
):
    config = _config(tmp_path, prepared, corpus, dropout=0.1, max_steps=12)
    nodes = _finish(_nodes((config, config), _free_port(), ("SIGTERM", 5, reaches)))
    assert [code for code, _ in nodes] != [0, 0], nodes[0][1][-3000:]
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    # Rank 1 saw SIGTERM during update 5 (its own), or a little later (passed on by its
    # agent), and posted it; both stopped after the same update, which rank 0 saved
    # (gathering rank 1's RNG streams: an exact resume).
    end = events[-1]
    assert end == {**end, "event": "end", "reason": "signal SIGTERM"}, end
    assert end["step"] == 5 if reaches == "process" else 5 <= end["step"] < 12
    assert (tmp_path / "run" / "checkpoints" / f"step_{end['step']}.pt").exists()
    _resume_to_the_end(config, uninterrupted)
