"""`mtkit.engines.ranks` in one process: how lines are shared among ranks, and when a
rank's part is kept (the torchrun jobs: tests/e2e/test_ranks_cli.py)."""

from __future__ import annotations

import json
import random

import pytest

import mtkit.engines.ranks as ranks_module
from mtkit.engines.ranks import RankPart, Ranks, cut_shares, scan_file, scan_texts


def _nearest_cuts(texts: list[str], world: int) -> list[tuple[int, int]]:
    """The shares by their definition: rank k's ends at the line start nearest to k/world
    of the bytes (the earlier on a tie), each line weighing its bytes and newline."""
    starts = [0]
    for text in texts:
        starts.append(starts[-1] + len(text.encode()) + 1)
    cuts = [0]
    for k in range(1, world):
        best = min(range(len(starts)), key=lambda i: (abs(starts[i] * world - starts[-1] * k), i))
        cuts.append(max(best, cuts[-1]))
    cuts.append(len(texts))
    return list(zip(cuts, cuts[1:], strict=False))


def test_shares_end_at_the_line_starts_nearest_each_ranks_part():
    rng = random.Random(1)
    for _ in range(500):
        texts = ["x" * rng.choice([0, 1, 3, 50, 500]) for _ in range(rng.randint(0, 12))]
        world = rng.randint(1, 5)
        shares = scan_texts(texts, world).shares
        assert [(s.first, s.end) for s in shares] == _nearest_cuts(texts, world)
        assert shares[0].start == 0 and all(
            a.stop == b.start and a.end == b.first for a, b in zip(shares, shares[1:], strict=False)
        )


def test_uneven_shares_more_ranks_than_lines_and_one_long_line():
    assert [(s.first, s.end) for s in scan_texts(["a", "b"], 3).shares] == [(0, 1), (1, 1), (1, 2)]
    assert [s.lines for s in scan_texts([], 3).shares] == [0, 0, 0]
    long = ["a"] * 4 + ["x" * 1000] + ["b"] * 4
    assert [(s.first, s.end) for s in scan_texts(long, 3).shares] == [(0, 4), (4, 5), (5, 9)]


def test_a_file_is_shared_as_its_lines_are(tmp_path, monkeypatch):
    """A file read in blocks smaller than its lines, with and without a newline at its
    end, is shared as the same lines in memory are, with their bytes and SHA-256."""
    monkeypatch.setattr(ranks_module, "BLOCK", 7)
    texts = ["short", "", "a much longer line than the others", "é ✓", "x" * 40, "end"]
    path = tmp_path / "in.txt"
    for data in ("".join(t + "\n" for t in texts), "\n".join(texts)):
        path.write_text(data)
        for world in (1, 2, 3, 4, 7):
            scanned, expected = scan_file(path, world), scan_texts(texts, world)
            assert scanned.lines == len(texts) and scanned.size == len(data.encode())
            mine = [(s.first, s.end, s.start) for s in scanned.shares]
            assert mine == [(s.first, s.end, s.start) for s in expected.shares]
            assert scanned.shares[-1].stop == scanned.size
    path.write_text("".join(t + "\n" for t in texts))
    assert scan_file(path, 3).sha256 == scan_texts(texts, 3).sha256


def test_cut_shares_takes_line_starts_in_blocks():
    import numpy as np

    starts = [np.array([2, 4]), np.array([], dtype=np.int64), np.array([6, 100])]
    shares = cut_shares(starts, 5, 102, 2)
    assert [(s.first, s.end, s.start, s.stop) for s in shares] == [(0, 3, 0, 6), (3, 5, 6, 102)]


def test_a_finished_part_is_kept_unless_its_input_options_or_bytes_changed(tmp_path, caplog):
    output = tmp_path / "out.txt"
    alone = Ranks(0, 1)
    written = []

    def write(share, sink) -> None:
        written.append(share.lines)
        sink.write("translated\n" * share.lines)

    def run(texts, options="o") -> RankPart:
        part = RankPart(alone, output, scan_texts(texts, 1), options)
        with part.writing() as sink:  # (as a rank killed after its part: not put together)
            write(part.share, sink)
        return part

    part = run(["a", "b"])
    assert part.finished() and json.loads(part.record_path.read_text())["lines"] == [0, 2]
    assert not RankPart(alone, output, scan_texts(["a", "c"], 1), "o").finished()
    assert not RankPart(alone, output, scan_texts(["a", "b"], 1), "p").finished()
    part.path.write_text("translated\nTranslated\n")  # same size, other bytes
    assert not part.finished()
    part = run(["a", "b"])
    written.clear()
    with caplog.at_level("INFO"):
        assert part.translate(write) is True  # kept, then put together
    assert written == [] and "lines 1 to 2 of out.txt already translated (kept)" in caplog.text
    assert output.read_text() == "translated\n" * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.parametrize("damage", ["missing", "changed"])
def test_a_part_damaged_before_it_is_put_together_is_one_line(tmp_path, damage):
    output = tmp_path / "out.txt"
    part = RankPart(Ranks(0, 1), output, scan_texts(["a"], 1), "o")
    with part.writing() as sink:
        sink.write("translated\n")
    if damage == "missing":
        part.path.unlink()
    else:
        part.path.write_text("changed\n")
    with pytest.raises(ranks_module.RanksError, match="missing or damaged before it was put"):
        part.assemble()
    assert not output.exists()


def test_a_share_is_read_as_the_rest_of_its_input(tmp_path):
    """A share that starts with a line one process reads as text (as a PDF starts, with a
    byte-order mark) is read so, and no further than its end; the input's own start is
    checked as one process checks it."""
    from mtkit.core.errors import OptionError
    from mtkit.core.textio import read_chunks
    from mtkit.engines.ranks import ShareReader

    path = tmp_path / "in.txt"
    path.write_bytes("A dog.\n%PDF-1.4 is a format.\n\ufeffA cat.\nLast.\n".encode())
    first, second = scan_file(path, 2).shares
    assert (first.first, second.first) == (0, 2)  # (the nearest line start to the middle)
    middle = ranks_module.Share(1, 3, 7, first.stop + len("\ufeffA cat.\n".encode()))
    with ShareReader(path, middle) as source:
        assert list(read_chunks(source, continued=True)) == [
            ["%PDF-1.4 is a format.", "\ufeffA cat."]
        ]
    with ShareReader(path, middle) as source, pytest.raises(OptionError, match="a PDF"):
        list(read_chunks(source))
    path.write_bytes(b"%PDF-1.4\n" + b"text\n" * 10)
    with pytest.raises(OptionError, match="a PDF"):
        scan_file(path, 2)
