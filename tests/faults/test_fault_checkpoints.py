"""Checkpoint integrity: flipped bytes, junk, fuzzed files and NaN weights are one line;
training falls back to the newest good checkpoint and clears what killed writes left."""

from __future__ import annotations

import io
import random
import subprocess
import sys
import zipfile

import pytest
import torch

from mtkit.core.checkpoint import CheckpointError, find_resumable, load_checkpoint, save_checkpoint
from mtkit.engines.loader import load_engine

from faultkit import ROOT, assert_one_line, cli, snapshot


def flip_inside_a_tensor(path) -> None:
    """Flip one bit in the middle of the largest tensor's bytes, leaving the zip valid."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        header = 30 + len(info.filename.encode()) + len(info.extra)
    data = bytearray(path.read_bytes())
    data[info.header_offset + header + info.file_size // 2] ^= 0x04
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_weight_is_one_line_and_training_falls_back(work):
    ckpts = work / "run" / "checkpoints"
    for name in ("last.pt", "step_20.pt"):
        flip_inside_a_tensor(ckpts / name)
    before = snapshot(work)
    assert_one_line(
        cli("translate", "-m", ckpts / "last.pt", input="A dog.\n"),
        says="last.pt: corrupt checkpoint (its content does not match the digest",
    )
    assert snapshot(work) == before
    path, payload = find_resumable(ckpts)
    assert path.name == "step_10.pt" and payload["train"]["progress"]["step"] == 10
    result = cli("train", "-c", work / "exp.yaml", "--set", "train.max_steps=22")
    assert result.exit_code == 0, result.output
    assert "resuming from" in result.stderr and "step_10.pt at step 10" in result.stderr


def test_nan_weights_are_one_line(work, tmp_path):
    payload = load_checkpoint(work / "run" / "checkpoints" / "best.pt")
    name = next(iter(payload["model"]))
    payload["model"][name][0] = float("nan")
    save_checkpoint(payload, tmp_path / "nan.pt")
    assert_one_line(
        cli("translate", "-m", tmp_path / "nan.pt", input="A dog.\n"),
        says=f"the weights hold NaN or infinite values ({name})",
    )


def mutations(good: bytes, seed: int = 0):
    """Junk and damaged checkpoints: text, random bytes, truncations, flipped bytes
    anywhere (zip headers, pickle, tensors), zips of garbage."""
    rng = random.Random(seed)
    yield b""
    yield b"hello, I am a text file\n"
    yield b"PK\x03\x04" + bytes(rng.randrange(256) for _ in range(200))
    for _ in range(20):
        yield bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4096)))
    for _ in range(60):
        yield good[: rng.randrange(len(good))]
    for _ in range(260):
        data = bytearray(good)
        for _ in range(rng.choice((1, 1, 2, 8))):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        yield bytes(data)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("archive/data.pkl", bytes(rng.randrange(256) for _ in range(300)))
        z.writestr("archive/version", "3\n")
    yield buffer.getvalue()


def test_fuzzed_checkpoints_only_ever_give_a_checkpoint_error(work, tmp_path):
    payload = load_checkpoint(work / "run" / "checkpoints" / "best.pt")
    del payload["train"]  # an inference checkpoint: mostly weights, quick to load
    original = tmp_path / "original.pt"
    save_checkpoint(payload, original)
    good, weights = original.read_bytes(), payload["model"]
    path = tmp_path / "fuzzed.pt"
    outcomes = {"rejected": 0, "loaded": 0}
    for data in mutations(good):
        path.write_bytes(data)
        try:
            model = load_engine(path, "cpu").model
        except CheckpointError as e:
            assert "\n" not in str(e)
            outcomes["rejected"] += 1
            continue
        # a flip in bytes that nothing reads (zip padding, unused header fields) is
        # harmless: what loads must be exactly the original weights
        assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
        outcomes["loaded"] += 1
    assert sum(outcomes.values()) == 344 and outcomes["rejected"] >= 300, outcomes


@pytest.mark.parametrize(
    "junk", [b"just some text\n", bytes(range(256)) * 8, b"PK\x03\x04" + bytes(range(256)) * 8]
)
def test_junk_given_as_a_checkpoint_is_one_line_everywhere(tmp_path, junk):
    path = tmp_path / "junk.pt"
    path.write_bytes(junk)
    src = tmp_path / "src.txt"
    src.write_text("a\n")
    for args in (
        ("translate", "-m", path),
        ("average", path, path, "-o", tmp_path / "o.pt"),
        ("eval", "-m", path, "--src", src, "--ref", src),
        ("explain", "params", "-m", path),
    ):
        assert_one_line(cli(*args, input="A dog.\n"), says="junk.pt: not a readable checkpoint")
    assert not (tmp_path / "o.pt").exists()


def test_a_checkpoint_of_pickled_objects_is_refused_without_library_warnings(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "mtkit-checkpoint-1", "x": zipfile.ZipInfo("x")}, path)
    plain = tmp_path / "plain.pt"  # protocol 4: torch warns about it before refusing
    torch.save(
        {"format": "mtkit-checkpoint-1", "x": zipfile.ZipInfo("x")}, plain, pickle_protocol=4
    )
    for p in (path, plain):
        assert_one_line(
            cli("translate", "-m", p, input="A dog.\n"), says="safe loading refuses to build"
        )
    # a real process, where nothing captures Python's warnings but mtkit's own filter
    done = subprocess.run(
        [sys.executable, "-m", "mtkit", "translate", "-m", str(plain)],
        input="A dog.\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_temporaries_of_killed_checkpoint_writes_are_removed_by_the_next_train(work):
    ckpts = work / "run" / "checkpoints"
    leftovers = [
        ckpts / ".step_30.pt.x1y2z3.tmp",
        ckpts / ".last.pt.a1b2c3.tmp",
        ckpts / ".best.pt.link",
        work / "run" / ".config.yaml.q1w2e3.tmp",
    ]
    for p in leftovers:
        p.write_bytes(b"\0" * 1000)
    result = cli("train", "-c", work / "exp.yaml", "--set", "train.max_steps=21")
    assert result.exit_code == 0, result.output
    assert not any(p.exists() for p in leftovers)
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".")]
