"""A rank of a torchrun translation killed half-way through its share (`rank_faults`):
the command run again keeps the other ranks' finished parts, translates that share only,
and writes the bytes one process writes (`mtkit.engines.ranks`)."""

from __future__ import annotations

import json

from mtkit.core.device import torch_threads

from conftest import cli, read_lines, write_lines
from rank_faults import asked
from ranks_commands import launch


def test_a_killed_ranks_share_is_translated_again_and_the_others_kept(work, tmp_path):
    model = work / "run" / "checkpoints" / "best.pt"
    source = write_lines(tmp_path / "in.en", read_lines("test2016.en.gz", 90))
    env = {"MTKIT_CACHE_DIR": str(tmp_path / "measured")}
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
