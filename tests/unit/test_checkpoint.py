from __future__ import annotations

import os
import pickle

import pytest
import torch

from mtkit.core.checkpoint import (
    CheckpointError,
    average_checkpoints,
    find_resumable,
    load_checkpoint,
    save_checkpoint,
    write_training_checkpoint,
)


def payload(value: float, train: bool = True) -> dict:
    out = {
        "config": {"model": {}},
        "vocab": {"src": b"s", "tgt": b"t"},
        "model": {"w": torch.full((2, 3), value), "n": torch.tensor([7])},
    }
    if train:
        out["train"] = {"progress": {"step": int(value)}}
    return out


def test_save_then_load_round_trips_and_leaves_no_temporary_files(tmp_path):
    save_checkpoint(payload(1.0), tmp_path / "a.pt")
    loaded = load_checkpoint(tmp_path / "a.pt")
    assert torch.equal(loaded["model"]["w"], torch.ones(2, 3)) and loaded["vocab"]["src"] == b"s"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt"]


def test_a_memory_mapped_load_is_the_same_and_outlives_a_new_save(tmp_path):
    save_checkpoint(payload(1.0), tmp_path / "a.pt")
    mapped = load_checkpoint(tmp_path / "a.pt", mmap=True)
    assert torch.equal(mapped["model"]["w"], torch.ones(2, 3))
    save_checkpoint(payload(2.0), tmp_path / "a.pt")  # replaced, as training does
    mapped["model"]["w"].add_(1)  # copy-on-write: the file is never written through
    assert torch.equal(mapped["model"]["w"], torch.full((2, 3), 2.0))
    assert torch.equal(
        load_checkpoint(tmp_path / "a.pt", mmap=True)["model"]["w"], torch.full((2, 3), 2.0)
    )


def resident_kb(path) -> int:
    """KB of `path`'s pages resident in this process's mappings (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if "-" in line.split(" ", 1)[0] and ":" not in line.split(" ", 1)[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc")
def test_a_memory_mapped_load_hands_back_the_pages_it_checked(tmp_path):
    big = payload(1.0)
    big["model"]["big"] = torch.arange(2**20, dtype=torch.float32)  # 4 MB
    big["train"]["optimizer"] = {"exp_avg": torch.full((2**20,), 3.0)}  # never used
    save_checkpoint(big, tmp_path / "a.pt")
    mapped = load_checkpoint(tmp_path / "a.pt", mmap=True)  # digest: every page read
    assert resident_kb(tmp_path / "a.pt") < 200  # of 8 MB: only pages shared with others
    assert torch.equal(mapped["model"]["big"], torch.arange(2**20, dtype=torch.float32))
    assert 4000 <= resident_kb(tmp_path / "a.pt") < 4300  # paged in again, as used
    assert torch.equal(mapped["train"]["optimizer"]["exp_avg"], torch.full((2**20,), 3.0))


def test_handing_back_pages_leaves_memory_that_is_not_the_files_alone(tmp_path):
    from mtkit.core.checkpoint import MappedFile

    save_checkpoint(payload(1.0), tmp_path / "a.pt")
    mapped = load_checkpoint(tmp_path / "a.pt", mmap=True)
    own = torch.arange(2**20, dtype=torch.float32)  # the process's own memory
    MappedFile(tmp_path / "a.pt").release(own)  # not in the file's mapping: kept
    assert torch.equal(own, torch.arange(2**20, dtype=torch.float32))
    assert torch.equal(mapped["model"]["w"], torch.ones(2, 3))


@pytest.mark.parametrize("mmap", [False, True])
def test_truncated_checkpoint_is_a_one_line_error(tmp_path, mmap):
    save_checkpoint(payload(1.0), tmp_path / "a.pt")
    data = (tmp_path / "a.pt").read_bytes()
    (tmp_path / "a.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"a.pt: not a readable checkpoint") as e:
        load_checkpoint(tmp_path / "a.pt", mmap=mmap)
    assert "\n" not in str(e.value)


def test_foreign_and_missing_files_are_rejected(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match=r"not an mtkit checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(CheckpointError, match=r"not a readable checkpoint"):
        load_checkpoint(tmp_path / "text.pt")
    with pytest.raises(CheckpointError, match=r"no such checkpoint"):
        load_checkpoint(tmp_path / "none.pt")


def test_a_checkpoint_of_another_format_or_without_a_digest_is_refused_in_one_line(tmp_path):
    body = {"format": "mtkit-checkpoint-0", **payload(1.0)}
    torch.save(body, tmp_path / "old.pt")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path / "old.pt")
    assert str(e.value) == (
        f"{tmp_path / 'old.pt'}: checkpoint format mtkit-checkpoint-0, which this mtkit "
        f"does not read (it reads mtkit-checkpoint-1)"
    )
    torch.save({**body, "format": "mtkit-checkpoint-1"}, tmp_path / "undigested.pt")
    with pytest.raises(CheckpointError, match=r"undigested.pt: .*no digest") as e:
        load_checkpoint(tmp_path / "undigested.pt")
    assert "\n" not in str(e.value)


class Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {Exploit.marker}",))


def test_loading_never_runs_code(tmp_path):
    Exploit.marker = tmp_path / "pwned"
    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"format": "mtkit-checkpoint-1", "x": Exploit()}, f)
    torch.save({"format": "mtkit-checkpoint-1", "x": Exploit()}, tmp_path / "evil2.pt")
    for name in ("evil.pt", "evil2.pt"):
        for mmap in (False, True):
            with pytest.raises(CheckpointError):
                load_checkpoint(tmp_path / name, mmap=mmap)
    assert not Exploit.marker.exists()


def test_keep_last_and_best_links(tmp_path):
    for step in (10, 20, 30, 40):
        write_training_checkpoint(payload(step), tmp_path, step, is_best=step == 20, keep_last=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["best.pt", "last.pt", "step_30.pt", "step_40.pt"]
    assert load_checkpoint(tmp_path / "best.pt")["train"]["progress"]["step"] == 20
    assert load_checkpoint(tmp_path / "last.pt")["train"]["progress"]["step"] == 40


def test_resume_falls_back_to_the_newest_valid_checkpoint(tmp_path):
    for step in (10, 20):
        write_training_checkpoint(payload(step), tmp_path, step, is_best=False, keep_last=5)
    os.unlink(tmp_path / "last.pt")  # a half-written last.pt replaces the link
    (tmp_path / "last.pt").write_bytes((tmp_path / "step_20.pt").read_bytes()[:100])
    (tmp_path / "step_20.pt").write_bytes(b"garbage")
    path, loaded = find_resumable(tmp_path)
    assert path.name == "step_10.pt" and loaded["train"]["progress"]["step"] == 10
    assert find_resumable(tmp_path / "empty") is None


def test_average_is_the_element_wise_mean(tmp_path):
    save_checkpoint(payload(1.0), tmp_path / "a.pt")
    save_checkpoint(payload(4.0), tmp_path / "b.pt")
    avg = average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])
    assert torch.equal(avg["model"]["w"], torch.full((2, 3), 2.5))
    assert torch.equal(avg["model"]["n"], torch.tensor([7])) and "train" not in avg
    other = payload(1.0)
    other["model"]["w"] = torch.zeros(3, 3)
    save_checkpoint(other, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match=r"weights do not match"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "c.pt"])


def test_an_average_keeps_the_newest_checkpoints_language_pieces(tmp_path):
    """A run resumed by an mtkit that saves each target language's pieces: its average
    of an older step and a newer one has them."""
    save_checkpoint(payload(1.0), tmp_path / "old.pt")
    newer = payload(3.0)
    newer["vocab"] = {**newer["vocab"], "tgt_languages": {"de": [4, 9], "fr": [5, 9]}}
    save_checkpoint(newer, tmp_path / "new.pt")
    averaged = average_checkpoints([tmp_path / "old.pt", tmp_path / "new.pt"])
    assert averaged["vocab"]["tgt_languages"] == {"de": [4, 9], "fr": [5, 9]}
    assert "tgt_languages" not in load_checkpoint(tmp_path / "old.pt")["vocab"]
    save_checkpoint(averaged, tmp_path / "avg.pt")  # and the digest covers them
    assert load_checkpoint(tmp_path / "avg.pt")["vocab"]["tgt_languages"]["fr"] == [5, 9]


def test_an_average_says_which_steps_it_is_the_average_of(tmp_path):
    """What `mtkit serve`'s page shows as the model's weights (no more "step ?")."""
    from mtkit.core.checkpoint import describe_weights

    for step, value in ((800, 1.0), (900, 2.0), (1000, 3.0)):
        trained = payload(value) | {"train": {"progress": {"step": step}}}
        save_checkpoint(trained, tmp_path / f"step_{step}.pt")
    paths = [tmp_path / f"step_{s}.pt" for s in (800, 900, 1000)]
    assert describe_weights(load_checkpoint(paths[0])) == "step 800"
    averaged = average_checkpoints(paths)
    assert averaged["averaged_steps"] == [800, 900, 1000]
    assert describe_weights(averaged) == "the average of steps 800, 900 and 1000"
    save_checkpoint(averaged, tmp_path / "avg.pt")  # an average has no step of its own
    assert (
        describe_weights(average_checkpoints([tmp_path / "avg.pt", paths[0]]))
        == "the average of 2 checkpoints"
    )
    assert describe_weights({"model": {}}) == "unknown"
