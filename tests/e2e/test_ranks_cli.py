"""`mtkit translate`, `mtkit distill` and `mtkit run` under torchrun (`mtkit.engines.ranks`):
2 and 3 ranks over Gloo on the CPU, one thread each, write the bytes one process writes.

Each torchrun launch runs several commands in each rank (tests/ranks_commands.py); the one
process they are compared with runs in this process with one thread, and both keep their
measured choices in one folder (MTKIT_CACHE_DIR): the ranks translate as it did."""

from __future__ import annotations

import json

import pytest
import yaml

from mtkit.core.config import config_from_dict
from mtkit.core.device import torch_threads
from mtkit.stages.distill import distill
from mtkit.stages.tokenizer import build_tokenizer

from conftest import cli, one_line_error, read_lines, tiny_config_dict, write_lines
from ranks_commands import launch

PAIRS = 300


@pytest.fixture
def cache(tmp_path, monkeypatch) -> dict[str, str]:
    """One folder of measured choices for this process and the ranks it launches."""
    folder = tmp_path / "measured"
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(folder))
    return {"MTKIT_CACHE_DIR": str(folder)}


def _texts(tmp_path, model) -> dict[str, tuple[list, str]]:
    """Inputs and what one process writes for each: name -> (translate's arguments
    beside -i and -o, the input file's name)."""
    lines = read_lines("test2016.en.gz", 90)
    long = " ".join(lines[:25])  # one line as long as 25 others
    text = [*lines[:40], "", long, "%PDF-1.4 is a version of a format.", *lines[40:], "Ein ✓."]
    (tmp_path / "mixed.en").write_text("\n".join(text))  # (no newline at the end)
    records = [
        json.dumps({"src": line, "id": i} | ({"prefix": "Ein"} if i % 7 == 0 else {}))
        for i, line in enumerate(lines[:50])
    ]
    records[20] = "{not json"  # an error record, its "line" counted from the input's start
    write_lines(tmp_path / "records.jsonl", records)
    # 2 lines: the second starts a share, and starts as a PDF does (one process reads it
    # as text: only an input's start is checked)
    write_lines(tmp_path / "two.en", [lines[0], "%PDF-1.4 is a version of a format."])
    write_lines(tmp_path / "guided.en", lines[:30])  # each line's prefix and constraints
    write_lines(tmp_path / "prefixes.de", ["Ein" if i % 4 == 0 else "" for i in range(30)])
    write_lines(tmp_path / "terms.tsv", ["Hund\tMann" if i % 3 == 0 else "" for i in range(30)])
    fragments = [f"<p>{line} <b>{line.split()[0]}</b></p>" for line in lines[50:80]]
    write_lines(tmp_path / "fragments.html", fragments)
    return {
        "mixed": (["--batch-tokens", "120"], "mixed.en"),
        "segments": (["--format", "html", "--segments"], "fragments.html"),
        "guided": (
            ["--prefix-file", tmp_path / "prefixes.de", "--constraints", tmp_path / "terms.tsv"],
            "guided.en",
        ),
        "jsonl": (["--format", "jsonl"], "records.jsonl"),
        "two": ([], "two.en"),
    }


def _one_process(tmp_path, model, inputs) -> dict[str, bytes]:
    out = {}
    with torch_threads(1):
        for name, (args, file) in inputs.items():
            result = cli("-q", "translate", "-m", model, "-i", tmp_path / file, *args)
            assert result.exit_code == 0, result.output
            out[name] = result.stdout.encode()
    return out


def _student(trained, corpus, folder):
    """A student run (its config file) distilled by the trained run, 300 pairs in 3
    chunks of 100, 4 training steps."""
    small = {
        side: write_lines(folder / f"train.{side}", read_lines(f"train.{side}.gz", PAIRS))
        for side in ("en", "de")
    }
    data = tiny_config_dict(
        corpus,
        folder / "student",
        tokenizer={"from": str(trained / "run")},
        model={"encoder_layers": 2},
        distill={"teacher": [str(trained / "run")], "chunk_lines": 100, "precision": "fp32"},
        train={"max_steps": 4, "valid_every": 2},
    )
    data["data"]["train"] = {"src": str(small["en"]), "tgt": str(small["de"])}
    path = folder / "student.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _distilled(trained, corpus, folder) -> dict[str, bytes]:
    """One process's distillation of the student's corpus: its chunks and corpus."""
    folder.mkdir()
    cfg = config_from_dict(yaml.safe_load(_student(trained, corpus, folder).read_text()))
    build_tokenizer(cfg)
    with torch_threads(1):
        distill(cfg)
    return _distill_files(folder / "student")


def _distill_files(run) -> dict[str, bytes]:
    folder = run / "distill"
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and (p.name in ("train.en", "train.de") or p.parent.name == "chunks")
    }


def _assert_same_records(path, expected: bytes) -> None:
    """The JSON lines at `path` are `expected`'s: the same texts and ids exactly, the
    scores (rounded to 4 places) within one place's rounding. A rank batches its own
    share's lines, one process all of them: the float sums of a sentence's score run in
    another order, as between batched and alone (the translations are the same)."""
    got = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    want = [json.loads(line) for line in expected.decode().splitlines()]
    assert len(got) == len(want)
    for mine, theirs in zip(got, want, strict=True):
        assert _texts_of(mine) == _texts_of(theirs)
        for key, value in _numbers_of(theirs).items():
            assert abs(_numbers_of(mine)[key] - value) <= 2e-4, (key, mine, theirs)


def _texts_of(record):
    """`record` with its float numbers left out."""
    if isinstance(record, dict):
        return {k: _texts_of(v) for k, v in record.items() if not isinstance(v, float)}
    if isinstance(record, list):
        return [_texts_of(v) for v in record if not isinstance(v, float)]
    return record


def _numbers_of(record, at: str = "") -> dict[str, float]:
    """`record`'s float numbers by where they are."""
    if isinstance(record, float):
        return {at: record}
    if not isinstance(record, dict | list):
        return {}
    items = record.items() if isinstance(record, dict) else enumerate(record)
    out = {}
    for key, value in items:
        out.update(_numbers_of(value, f"{at}.{key}"))
    return out


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_write_the_bytes_one_process_writes(ranks, trained, corpus, tmp_path, cache):
    """Text (a very long line among short ones, an empty line, a line that starts as a
    PDF does, no newline at the end, small batches), html segments (a fragment a line),
    lines with their prefixes and constraints (a file each: sliced per share) and 2
    lines (on 3 ranks, one gets none; the second line starts a share, as a PDF starts):
    the same bytes from the ranks as from one process, no part left beside the outputs;
    jsonl (an error record numbered from the input's start; prefixes): the same records,
    scores equal to their rounding. With 2 ranks `mtkit run` distils (each chunk
    shared), trains a student over DDP and scores it; with 3 `mtkit distill`: the corpus
    is one process's, and the chunks' records (their costs equal to their rounding)."""
    model = trained / "run" / "checkpoints" / "best.pt"
    inputs = _texts(tmp_path, model)
    expected = _one_process(tmp_path, model, inputs)
    distilled = _distilled(trained, corpus, tmp_path / "alone")
    (tmp_path / "ranks").mkdir()
    student = _student(trained, corpus, tmp_path / "ranks")
    outputs = tmp_path / "out"
    commands = [
        ["-q", "translate", "-m", model, "-i", tmp_path / file, "-o", outputs / name, *args]
        for name, (args, file) in inputs.items()
    ]
    if ranks == 2:
        commands.append(["-q", "run", "-c", student])
    else:  # (the tokenizer command is one process's)
        build_tokenizer(config_from_dict(yaml.safe_load(student.read_text())))
        commands.append(["-q", "distill", "-c", student])
    job = launch(ranks, commands, cache)
    assert job.returncode == 0, job.stdout[-3000:]
    assert {p.name for p in outputs.iterdir()} == set(inputs)  # (no part, no record)
    for name in inputs:
        if name == "jsonl":  # scores of other batches: equal to their rounding
            _assert_same_records(outputs / name, expected[name])
        else:
            assert (outputs / name).read_bytes() == expected[name], name
    run = tmp_path / "ranks" / "student"
    mine = _distill_files(run)
    assert sorted(mine) == sorted(distilled)
    for name, data in distilled.items():
        if name.startswith("chunks/"):
            _assert_same_records(run / "distill" / name, data)
        else:
            assert mine[name] == data, name
    assert not list((run / "distill" / "chunks").glob("*.rank-*"))
    if ranks == 2:
        scores = json.loads((run / "test.scores.json").read_text())
        assert "bleu" in scores and (run / "test.hyp").exists()
        assert (run / "checkpoints" / "last.pt").exists()


def test_ranks_need_files_and_lines(work, monkeypatch, tmp_path):
    """Under torchrun the ranks cannot share stdin or stdout, nor a document: one line
    each, before any rank waits for another."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    model = work / "run" / "checkpoints" / "best.pt"
    source = write_lines(tmp_path / "in.en", ["A dog runs."])
    one_line_error(
        cli("translate", "-m", model, "-o", tmp_path / "out.de", input="A dog.\n"),
        "under torchrun the input must be a file (-i FILE): the ranks cannot share stdin",
    )
    one_line_error(
        cli("translate", "-m", model, "-i", source), "under torchrun the output must be a file"
    )
    page = tmp_path / "page.html"
    page.write_text("<p>A dog runs.</p>")
    one_line_error(
        cli("translate", "-m", model, "-i", page, "-o", tmp_path / "out.html"),
        "a html document is translated whole, by one process",
    )
