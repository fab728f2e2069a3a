"""A rank of a torchrun translation or distillation killed half-way through its share
(`rank_faults`): the command run again keeps the other ranks' finished parts, translates
that share only, and writes the bytes one process writes (`mtkit.engines.ranks`).

The ranks and the one process they are compared with keep their measured choices in one
folder (MTKIT_CACHE_DIR, `mtkit.tuning.measured`): a rerun's ranks, and that process,
translate as the first run's ranks did."""

from __future__ import annotations

import json

import pytest
import yaml

from mtkit.core.config import config_from_dict
from mtkit.core.device import torch_threads
from mtkit.stages.distill import distill
from mtkit.stages.tokenizer import build_tokenizer

from conftest import cli, read_lines, tiny_config_dict, write_lines
from rank_faults import asked
from ranks_commands import launch


@pytest.fixture
def cache(tmp_path, monkeypatch) -> dict[str, str]:
    """One folder of measured choices for this process and the ranks it launches."""
    folder = tmp_path / "measured"
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(folder))
    return {"MTKIT_CACHE_DIR": str(folder)}


def test_a_killed_ranks_share_is_translated_again_and_the_others_kept(work, tmp_path, cache):
    """The first run's ranks measure their choices at once (an empty cache): what they
    keep is what rank 0 translated with, which its part's record holds."""
    model = work / "run" / "checkpoints" / "best.pt"
    source = write_lines(tmp_path / "in.en", read_lines("test2016.en.gz", 90))
    env = cache
    out = tmp_path / "out" / "in.de"
    command = ["translate", "-m", model, "-i", source, "-o", out, "--batch-tokens", "100"]
    killed = launch(3, [command], asked("kill@1", env))
    assert killed.returncode != 0, killed.stdout[-3000:]
    assert not out.exists()
    records = {r: out.with_name(f"in.de.rank-{r}-of-3.json") for r in range(3)}
    assert records[0].exists() and records[2].exists() and not records[1].exists()
    assert not out.with_name("in.de.rank-1-of-3").exists()  # (its temporary only)
    first, last = (json.loads(records[r].read_text())["lines"] for r in (0, 2))
    assert first[0] == 0 and last[1] == 90 and first[1] < last[0]  # rank 1's between

    again = launch(3, [command], asked("refuse@0,2", env))  # 0 and 2 translate nothing
    assert again.returncode == 0, again.stdout[-3000:]
    for rank, (start, end) in ((0, first), (2, last)):
        assert f"rank {rank}: lines {start + 1} to {end} of in.de already translated (kept)" in (
            again.stdout
        )
    assert sorted(p.name for p in out.parent.iterdir()) == ["in.de"]  # parts, temporaries gone
    with torch_threads(1):
        alone = cli("-q", "translate", "-m", model, "-i", source, "--batch-tokens", "100")
    assert alone.exit_code == 0, alone.output
    assert out.read_bytes() == alone.stdout.encode()


def _student(folder, trained, corpus):
    """A student of the trained run, its tokenizer made: 200 pairs, 2 chunks of 100."""
    small = {
        side: write_lines(folder / f"train.{side}", read_lines(f"train.{side}.gz", 200))
        for side in ("en", "de")
    }
    data = tiny_config_dict(
        corpus,
        folder / "student",
        tokenizer={"from": str(trained / "run")},
        distill={"teacher": [str(trained / "run")], "chunk_lines": 100, "precision": "fp32"},
    )
    data["data"]["train"] = {"src": str(small["en"]), "tgt": str(small["de"])}
    path = folder / "student.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = config_from_dict(data)
    build_tokenizer(cfg)
    return path, cfg


def test_a_distillation_goes_on_from_the_killed_ranks_share(trained, corpus, tmp_path, cache):
    """Rank 1 killed in the first chunk once rank 0's part of it is done: the rerun keeps
    that part (rank 0 translates none of the first chunk again); the corpus is one
    process's, and so are the chunks' records (their costs to their rounding)."""
    env = cache
    (tmp_path / "alone").mkdir()
    _, alone = _student(tmp_path / "alone", trained, corpus)
    with torch_threads(1):
        distill(alone)
    (tmp_path / "ranks").mkdir()
    config, cfg = _student(tmp_path / "ranks", trained, corpus)
    command = ["distill", "-c", config]
    assert launch(2, [command], asked("kill@1", env)).returncode != 0
    chunks = cfg.run_path / "distill" / "chunks"
    assert sorted(p.name for p in chunks.iterdir() if not p.name.startswith(".")) == [
        "000000.jsonl.rank-0-of-2",  # (rank 1's: a temporary, its writer gone)
        "000000.jsonl.rank-0-of-2.json",
    ]
    again = launch(2, [command], asked("refuse@0:000000.jsonl", env))
    assert again.returncode == 0, again.stdout[-3000:]
    assert "rank 0: lines 1 to " in again.stdout and "of 000000.jsonl already translated" in (
        again.stdout
    )
    for name in ("train.en", "train.de"):
        mine = (cfg.run_path / "distill" / name).read_bytes()
        assert mine == (alone.run_path / "distill" / name).read_bytes(), name
    for name in ("000000.jsonl", "000001.jsonl"):  # the costs: to their rounding
        mine, theirs = (
            [json.loads(x) for x in (run / "distill" / "chunks" / name).read_text().splitlines()]
            for run in (cfg.run_path, alone.run_path)
        )
        assert [{**r, "cost": 0} for r in mine] == [{**r, "cost": 0} for r in theirs]
        assert all(abs(a["cost"] - b["cost"]) <= 2e-4 for a, b in zip(mine, theirs, strict=True))
    assert sorted(p.name for p in chunks.iterdir()) == ["000000.jsonl", "000001.jsonl"]
