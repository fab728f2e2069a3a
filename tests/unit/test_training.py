from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from mtkit.core.checkpoint import load_checkpoint
from mtkit.core.config import config_from_dict
from mtkit.core.device import DeviceError, cpu_description, resolve_device
from mtkit.data.batching import TokenBatchSampler
from mtkit.data.shards import ShardDataset
from mtkit.training.loop import Progress, TrainError, batches_left, stop_reason, train
from mtkit.tuning.precision import Calibration, resolve_precision

from conftest import tiny_config_dict

ROOT = Path(__file__).resolve().parents[2]


def fresh(prepared: Path, tmp_path: Path, corpus, **train) -> tuple:
    run = tmp_path / "run"
    shutil.copytree(prepared, run)
    data = tiny_config_dict(corpus, run, train=train, model={"dropout": 0.1})
    return config_from_dict(data), data


def weights(run: Path) -> dict:
    return load_checkpoint(run / "checkpoints" / "last.pt")["model"]


def test_cuda_request_without_cuda_is_a_one_line_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(DeviceError, match=r"train.device=cuda, but no CUDA device"):
        resolve_device("cuda")
    assert resolve_device("auto").type == "cpu"
    assert resolve_precision("bf16", torch.device("cpu")) == (torch.bfloat16, None)
    assert resolve_precision("fp32", torch.device("cuda")) == (None, None)


def test_training_lowers_the_loss_and_logs_every_event(prepared, tmp_path, corpus):
    cfg, _ = fresh(prepared, tmp_path, corpus, max_steps=30, valid_every=15, log_every=5)
    result = train(cfg)
    assert result.step == 30 and result.stopped_because == "max_steps"
    events = [json.loads(line) for line in (cfg.run_path / "metrics.jsonl").open()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("valid") == 2
    losses = [e["loss"] for e in events if e["event"] == "train"]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.3
    valid = [e for e in events if e["event"] == "valid"]
    assert {"valid_loss", "valid_ppl", "valid_bleu"} <= set(valid[0])
    names = sorted(p.name for p in (cfg.run_path / "checkpoints").iterdir())
    assert names == ["best.pt", "last.pt", "step_15.pt", "step_30.pt"]
    assert load_checkpoint(cfg.run_path / "checkpoints" / "last.pt")["vocab"]["src"]


def test_the_linear_schedule_reaches_the_optimizer_and_ends_near_zero(prepared, tmp_path, corpus):
    cfg, _ = fresh(
        prepared,
        tmp_path,
        corpus,
        max_steps=20,
        valid_every=100,
        log_every=5,
        lr_schedule="linear",
        warmup_steps=5,
        lr=1e-3,
    )
    train(cfg)
    events = [json.loads(line) for line in (cfg.run_path / "metrics.jsonl").open()]
    rates = [(e["step"], e["lr"]) for e in events if e["event"] == "train"]
    assert [s for s, _ in rates] == [5, 10, 15, 20]
    assert [r for _, r in rates] == pytest.approx([1e-3 * (1 - (s - 1) / 20) for s, _ in rates])


def with_max_steps(cfg, steps: int):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=steps))


def straight_and_resumed(prepared, tmp_path, corpus, total: int, first: int, **train_cfg):
    """Train `total` steps in one go, and `first` steps then a resume to `total`.
    Returns both final weights and the results of the two resumed sessions."""
    straight, _ = fresh(prepared, tmp_path / "a", corpus, max_steps=total, **train_cfg)
    train(straight)
    halves, _ = fresh(prepared, tmp_path / "b", corpus, max_steps=first, **train_cfg)
    first_result = train(halves)
    second_result = train(with_max_steps(halves, total))
    return (weights(straight.run_path), weights(halves.run_path), first_result, second_result)


def test_resume_gives_bit_identical_weights(prepared, tmp_path, corpus):
    a, b, first, second = straight_and_resumed(
        prepared, tmp_path, corpus, 24, 11, valid_every=7, update_freq=2
    )
    assert first.step == 11
    assert second.step == 24
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_across_an_epoch_boundary_is_exact(prepared, tmp_path, corpus):
    # ~2,000 pairs at 1,024 tokens make about 60 batches an epoch.
    a, b, _, result = straight_and_resumed(
        prepared, tmp_path, corpus, 75, 50, valid_every=1000, max_tokens=1024
    )
    assert result.epoch == 2
    assert all(torch.equal(a[k], b[k]) for k in a)


def _train_process(config: Path) -> list[str]:
    return [sys.executable, "-m", "mtkit", "train", "-c", str(config)]


@pytest.mark.parametrize("precision", ["fp32", "auto"])
def test_sigkill_mid_run_then_resume_reaches_the_same_weights(
    prepared, tmp_path, corpus, precision
):
    """Bit-identity is promised here: a resumed run is the run that never stopped. Under
    `precision: auto` the resumed start reuses the first start's choice (stored in the
    checkpoint) instead of measuring again; the straight run trains in that precision."""
    killed, data = fresh(
        prepared,
        tmp_path / "b",
        corpus,
        max_steps=60,
        valid_every=10,
        precision=precision,
        batch_shapes="auto" if precision == "auto" else "exact",
    )
    config = tmp_path / "b.yaml"
    config.write_text(yaml.safe_dump(data))
    proc = subprocess.Popen(_train_process(config), stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.time() + 120
    while not (killed.run_path / "checkpoints" / "step_20.pt").exists():
        assert proc.poll() is None and time.time() < deadline, "training ended too early"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpts = {p.name for p in (killed.run_path / "checkpoints").glob("step_*.pt")}
    assert "step_60.pt" not in ckpts
    chosen = load_checkpoint(killed.run_path / "checkpoints" / "step_20.pt")["train"]["precision"]
    assert chosen["asked"] == precision and chosen["precision"] in ("fp32", "bf16")
    assert ("calibration" in chosen) == (precision == "auto")
    done = subprocess.run(_train_process(config), capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "resuming from" in done.stderr
    starts = [json.loads(x) for x in (killed.run_path / "metrics.jsonl").open() if '"start"' in x]
    assert [s["resumed"] for s in starts] == [False, True]
    assert starts[1]["precision"] == chosen["precision"]
    assert starts[1].get("calibration") == starts[0].get("calibration")  # not measured again
    _, straight_data = fresh(
        prepared,
        tmp_path / "a",
        corpus,
        max_steps=60,
        valid_every=10,
        precision=chosen["precision"],
        batch_shapes=chosen["batches"]["shapes"],
    )
    straight_config = tmp_path / "a.yaml"
    straight_config.write_text(yaml.safe_dump(straight_data))
    straight = subprocess.run(
        _train_process(straight_config), capture_output=True, text=True, cwd=ROOT
    )
    assert straight.returncode == 0, straight.stderr
    a, b = weights(tmp_path / "a" / "run"), weights(killed.run_path)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resumed_run_keeps_its_first_precision_and_refuses_another(
    prepared, tmp_path, corpus, monkeypatch
):
    import mtkit.tuning.precision as timing

    monkeypatch.setattr(
        timing, "calibrate_cpu", lambda *shape, **kw: Calibration(fp32_s=0.002, bf16_s=0.001)
    )
    cfg, _ = fresh(prepared, tmp_path, corpus, max_steps=4, valid_every=4, precision="auto")
    assert train(cfg).precision == "bf16"

    def measured_again(*shape, **kw):
        raise AssertionError("a resumed run measured its precision again")

    monkeypatch.setattr(timing, "calibrate_cpu", measured_again)
    result = train(with_max_steps(cfg, 6))
    assert (result.step, result.precision) == (6, "bf16")
    stored = load_checkpoint(cfg.run_path / "checkpoints" / "last.pt")["train"]["precision"]
    assert stored == {
        "precision": "bf16",
        "asked": "auto",
        "cpu": cpu_description(),
        "calibration": {"fp32_ms": 2.0, "bf16_ms": 1.0},
        "attention": {"kernel": "sdpa", "asked": "sdpa"},
        "batches": {"shapes": "exact", "asked": "exact"},
        "graphs": {"graphs": "off", "asked": "off"},
    }
    fp32 = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, precision="fp32", max_steps=8)
    )
    with pytest.raises(
        TrainError,
        match=r"last.pt was trained in bf16, the config says "
        r"train.precision=fp32; resume with "
        r"train.precision=bf16 \(or auto\), or start over "
        r"with --no-resume",
    ):
        train(fp32)
    assert train(fp32, resume=False).precision == "fp32"  # starting over may choose anew


def test_truncated_last_checkpoint_falls_back_on_resume(prepared, tmp_path, corpus):
    cfg, _ = fresh(prepared, tmp_path, corpus, max_steps=20, valid_every=10)
    train(cfg)
    last = cfg.run_path / "checkpoints" / "last.pt"
    data = last.read_bytes()
    last.unlink()
    (cfg.run_path / "checkpoints" / "step_20.pt").write_bytes(data[: len(data) // 3])
    last.write_bytes(data[: len(data) // 3])
    result = train(with_max_steps(cfg, 30))
    assert result.step == 30
    starts = [json.loads(x) for x in (cfg.run_path / "metrics.jsonl").open()]
    assert [e["step"] for e in starts if e["event"] == "start"] == [0, 10]


def test_changed_model_config_refuses_to_resume(prepared, tmp_path, corpus):
    cfg, _ = fresh(prepared, tmp_path, corpus, max_steps=10, valid_every=10)
    train(cfg)
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, ffn_dim=64))
    with pytest.raises(TrainError, match=r"trained with model.ffn_dim=32, the config says 64"):
        train(other)


def test_an_incomplete_checkpoint_refuses_to_resume_in_one_line(prepared, tmp_path, corpus):
    """A checkpoint without a part resuming reads (one of another mtkit version) is one
    error naming the file and the part, not a KeyError."""
    from mtkit.core.checkpoint import save_checkpoint

    cfg, _ = fresh(prepared, tmp_path, corpus, max_steps=10, valid_every=10)
    train(cfg)
    last = cfg.run_path / "checkpoints" / "last.pt"
    whole = load_checkpoint(last)
    for keys in [("train", "precision", "graphs"), ("config", "model", "lang_tag")]:
        payload = load_checkpoint(last)
        part = payload
        for key in keys[:-1]:
            part = part[key]
        del part[keys[-1]]
        save_checkpoint(payload, last)
        with pytest.raises(TrainError) as refused:
            train(with_max_steps(cfg, 20))
        assert str(refused.value) == (
            f"{last}: checkpoint is incomplete (no {'.'.join(keys)}); start over with "
            f"--no-resume, or use another run_dir"
        )
        save_checkpoint(whole, last)


def _poison_losses(monkeypatch, which) -> None:
    """Make the loss of the `which(n)`-th micro-batch (from 1) NaN, so its update's
    gradients are."""
    import mtkit.training.loop as train_module

    real, calls = train_module.output_and_loss, iter(range(1, 10**6))

    def poisoned(projection, target, eps):
        out = real(projection, target, eps)
        return dataclasses.replace(out, loss=out.loss * float("nan")) if which(next(calls)) else out

    monkeypatch.setattr(train_module, "output_and_loss", poisoned)


def test_an_update_with_a_non_finite_gradient_is_skipped_on_the_device_and_counted(
    prepared, tmp_path, corpus, monkeypatch
):
    _poison_losses(monkeypatch, lambda n: n == 3)
    cfg, _ = fresh(prepared, tmp_path, corpus, max_steps=8, valid_every=8, log_every=4)
    assert train(cfg).step == 8
    events = [json.loads(x) for x in (cfg.run_path / "metrics.jsonl").open()]
    skips = [e for e in events if e["event"] == "nonfinite_skip"]
    assert [(e["step"], e["updates"]) for e in skips] == [(4, 1)]
    losses = [e["loss"] for e in events if e["event"] == "train"]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    saved = load_checkpoint(cfg.run_path / "checkpoints" / "last.pt")
    assert all(torch.isfinite(w).all() for w in saved["model"].values())
    # AdamW took 7 steps: the skipped update left its step count (and moments) alone.
    assert {float(s["step"]) for s in saved["train"]["optimizer"]["state"].values()} == {7.0}


def test_non_finite_updates_in_a_row_stop_training_when_the_host_reads_them(
    prepared, tmp_path, corpus, monkeypatch
):
    _poison_losses(monkeypatch, lambda n: True)
    cfg, _ = fresh(prepared, tmp_path, corpus, max_steps=20, valid_every=10, log_every=5)
    with pytest.raises(
        TrainError, match=r"^5 updates in a row had a non-finite loss or gradient \(up to step 5\)"
    ):
        train(cfg)
    events = [json.loads(x) for x in (cfg.run_path / "metrics.jsonl").open()]
    assert [(e["step"], e["updates"]) for e in events if e["event"] == "nonfinite_skip"] == [(5, 5)]


def test_two_process_ddp_ranks_end_with_equal_weights(prepared, tmp_path, corpus):
    cfg, data = fresh(prepared, tmp_path, corpus, max_steps=8, valid_every=4)
    data["data"]["loader_workers"] = 0
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(data))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(ROOT / "tests" / "ddp_worker.py"),
        str(config),
        str(tmp_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    events = [json.loads(x) for x in (cfg.run_path / "metrics.jsonl").open()]
    assert events[0]["world_size"] == 2 and events[-1]["step"] == 8


def test_max_epochs_and_patience_stop_training(prepared, tmp_path, corpus):
    cfg, _ = fresh(
        prepared,
        tmp_path / "a",
        corpus,
        max_steps=0,
        max_epochs=1,
        max_tokens=4096,
        valid_every=1000,
    )
    result = train(cfg)
    per_epoch = 2000 * 20 // 4096  # roughly: 2,000 pairs of ~20 tokens
    assert result.stopped_because == "max_epochs" and result.epoch == 1
    assert per_epoch // 3 < result.step < per_epoch * 3
    # Patience 1: the second validation without a better BLEU stops training. A zero
    # learning rate after warm-up keeps the BLEU from improving.
    cfg, _ = fresh(
        prepared, tmp_path / "b", corpus, max_steps=100, valid_every=2, patience=1, lr=1e-9
    )
    result = train(cfg)
    assert result.stopped_because == "patience" and result.step == 4
    again = train(cfg)  # resuming an early-stopped run changes nothing
    assert again.step == 4 and again.stopped_because == "patience"


def test_max_epochs_mid_accumulation_still_applies_the_epochs_last_batches(
    prepared, tmp_path, corpus
):
    # An epoch with an odd number of batches and update_freq 2: the last update of the
    # last epoch has one batch. It must be applied, not dropped after its position moved.
    data = ShardDataset(prepared / "data" / "train")
    for max_tokens in range(1000, 1400, 8):
        sampler = TokenBatchSampler(data.src_lengths, data.tgt_lengths, max_tokens, seed=1)
        sampler.set_epoch(1)
        if len(sampler) % 2:
            break
    n = len(sampler)
    cfg, _ = fresh(
        prepared,
        tmp_path,
        corpus,
        max_steps=0,
        max_epochs=1,
        update_freq=2,
        max_tokens=max_tokens,
        valid_every=1000,
    )
    result = train(cfg)
    assert result.stopped_because == "max_epochs"
    assert result.step == (n + 1) // 2
    progress = load_checkpoint(cfg.run_path / "checkpoints" / "last.pt")["train"]["progress"]
    assert (progress["epoch"], progress["batch"], progress["step"]) == (1, n, (n + 1) // 2)


def test_a_run_without_validation_says_so_and_never_runs_out_of_patience(
    prepared, tmp_path, corpus
):
    cfg, data = fresh(prepared, tmp_path, corpus, max_steps=6, valid_every=2, patience=1)
    del data["data"]["valid"]
    shutil.rmtree(cfg.run_path / "data" / "valid")
    result = train(config_from_dict(data))
    assert (result.step, result.stopped_because, result.best_bleu) == (6, "max_steps", None)
    assert (
        result.summary() == "stopped at step 6 (max_steps); no validation (data.valid is not set)"
    )
    events = [json.loads(x) for x in (cfg.run_path / "metrics.jsonl").open()]
    assert not [e for e in events if e["event"] == "valid"]
    assert events[-1]["best_bleu"] is None
    assert sorted(p.name for p in (cfg.run_path / "checkpoints").glob("step_*")) == [
        "step_2.pt",
        "step_4.pt",
        "step_6.pt",
    ]


def test_stop_reason_is_a_function_of_progress_and_config():
    tc = config_from_dict({"train": {"max_steps": 10, "max_time": 60, "max_epochs": 2}}).train
    assert stop_reason(Progress(step=3, elapsed=5.0), tc, 7, None) == ""
    assert stop_reason(Progress(step=10), tc, 7, None) == "max_steps"
    assert stop_reason(Progress(step=3, elapsed=61.0), tc, 7, None) == "max_time"
    assert stop_reason(Progress(step=3, epoch=2, batch=7), tc, 7, None) == "max_epochs"
    assert stop_reason(Progress(step=3, epoch=2, batch=6), tc, 7, None) == ""
    assert stop_reason(Progress(step=3), tc, 7, "SIGINT") == "signal SIGINT"
    assert stop_reason(Progress(step=10, early_stopped=True), tc, 7, None) == "patience"
    sizes = {1: 7, 2: 3}.get  # temperature sampling: each epoch its own batch count
    assert stop_reason(Progress(step=3, epoch=2, batch=3), tc, sizes, None) == "max_epochs"
    assert stop_reason(Progress(step=3, epoch=2, batch=2), tc, sizes, None) == ""
    assert stop_reason(Progress(step=3, epoch=3, batch=1), tc, sizes, None) == "max_epochs"
    assert batches_left(Progress(epoch=1, batch=6), tc, sizes) == 4  # 1 of epoch 1, 3 of 2


def test_precision_auto_on_a_cpu_is_measured_and_recorded(prepared, tmp_path, corpus):
    assert Calibration(fp32_s=1.0, bf16_s=0.85).bf16_faster
    assert not Calibration(fp32_s=1.0, bf16_s=0.95).bf16_faster
    dtype, calibration = resolve_precision("auto", torch.device("cpu"), (256, 64, 128))
    assert calibration.fp32_s > 0 and calibration.bf16_s > 0
    assert dtype is (torch.bfloat16 if calibration.bf16_faster else None)
    cfg, _ = fresh(prepared, tmp_path, corpus, max_steps=2, precision="auto")
    result = train(cfg)
    start = json.loads((cfg.run_path / "metrics.jsonl").open().readline())
    assert set(start["calibration"]) == {"fp32_ms", "bf16_ms"}
    assert (start["precision"], start["asked"]) == (result.precision, "auto")
    assert result.precision == (
        "bf16"
        if start["calibration"]["bf16_ms"] <= 0.9 * start["calibration"]["fp32_ms"]
        else "fp32"
    )


def test_tensorboard_gets_the_same_scalars_as_metrics_jsonl(prepared, tmp_path, corpus):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg, _ = fresh(
        prepared, tmp_path, corpus, max_steps=10, valid_every=5, log_every=5, tensorboard=True
    )
    train(cfg)
    board = EventAccumulator(str(cfg.run_path / "tensorboard"))
    board.Reload()
    events = [json.loads(line) for line in (cfg.run_path / "metrics.jsonl").open()]
    for kind, names in (
        ("train", ("loss", "lr", "tokens_per_s", "grad_norm", "ppl")),
        ("valid", ("loss", "ppl", "bleu")),
    ):
        records = [e for e in events if e["event"] == kind]
        for name in names:
            scalars = board.Scalars(f"{kind}/{name}")
            key = name if kind == "train" else f"valid_{name}"
            assert [s.step for s in scalars] == [r["step"] for r in records] == [5, 10]
            assert [s.value for s in scalars] == pytest.approx([r[key] for r in records])


def test_tensorboard_without_the_extra_is_one_line(prepared, tmp_path, corpus, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    cfg, _ = fresh(prepared, tmp_path, corpus, max_steps=2, tensorboard=True)
    with pytest.raises(
        TrainError,
        match=r"^train.tensorboard needs TensorBoard: pip install "
        r"'mtkit\[tensorboard\]'$",
    ):
        train(cfg)
    assert not (cfg.run_path / "checkpoints").exists()


def test_a_run_stores_its_attention_kernel_and_a_resume_keeps_it(
    prepared, tmp_path, corpus, monkeypatch
):
    """`train.attention: auto` measures once (faked: matmul twice as fast) and stores the
    kernel with the precision; a resume reuses it and refuses another."""
    import mtkit.tuning.attention as kernels

    monkeypatch.setattr(
        kernels, "attention_timer", lambda shape, dtype: lambda k: 0.002 if k == "sdpa" else 0.001
    )
    cfg, _ = fresh(prepared, tmp_path, corpus, max_steps=4, valid_every=4, attention="auto")
    train(cfg)
    last = cfg.run_path / "checkpoints" / "last.pt"
    assert load_checkpoint(last)["train"]["precision"]["attention"] == {
        "kernel": "matmul",
        "asked": "auto",
        "sdpa_ms": 2.0,
        "matmul_ms": 1.0,
    }

    def measured_again(shape, dtype):
        raise AssertionError("a resumed run measured its attention again")

    monkeypatch.setattr(kernels, "attention_timer", measured_again)
    assert train(with_max_steps(cfg, 6)).step == 6
    sdpa = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, attention="sdpa", max_steps=8)
    )
    with pytest.raises(
        TrainError,
        match=r"last.pt was trained with train.attention=matmul, "
        r"the config says sdpa",
    ):
        train(sdpa)


def test_batches_of_few_shapes_train_resume_exactly_and_are_kept(
    prepared, tmp_path, corpus, monkeypatch
):
    """`train.batch_shapes: classes` is stored with the precision; a run that stops and
    resumes across an epoch boundary ends with the weights of one that never stopped;
    a resume under auto keeps the stored shapes without deciding again, and one asking
    for the other kind is refused."""
    import mtkit.tuning.run as tuning_run

    a, b, _, result = straight_and_resumed(
        prepared,
        tmp_path,
        corpus,
        85,
        50,
        valid_every=1000,
        max_tokens=1024,
        batch_shapes="classes",
    )
    assert result.epoch == 2
    assert all(torch.equal(a[k], b[k]) for k in a)
    run = tmp_path / "b" / "run"
    stored = load_checkpoint(run / "checkpoints" / "last.pt")["train"]["precision"]["batches"]
    assert stored == {"shapes": "classes", "asked": "classes", "multiple": 4, "group": 8}
    cfg = config_from_dict(yaml.safe_load((run / "config.yaml").read_text()))

    def decided_again(*args, **kwargs):
        raise AssertionError("a resumed run decided its batch shapes again")

    monkeypatch.setattr(tuning_run, "choose_batch_shapes", decided_again)
    auto = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, batch_shapes="auto", max_steps=87)
    )
    assert train(auto).step == 87
    assert (
        load_checkpoint(run / "checkpoints" / "last.pt")["train"]["precision"]["batches"]["shapes"]
        == "classes"
    )
    exact = dataclasses.replace(
        auto, train=dataclasses.replace(auto.train, batch_shapes="exact", max_steps=89)
    )
    with pytest.raises(
        TrainError,
        match=r"last.pt was trained with train.batch_shapes="
        r"classes, the config says exact",
    ):
        train(exact)
