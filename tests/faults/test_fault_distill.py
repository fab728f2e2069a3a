"""A distillation that never goes stale or vanishes, and shortlists checked where they are
made and read.

One student (tests/e2e/test_distill.py's: the tiny trained run is its teacher, 300 pairs
in chunks of 100) is run through `mtkit run` once per module; each test works on a copy.
The faults are made by hand, deterministically: another corpus, a truncated or foreign
teacher, cut bookkeeping files, a shortlist of another shape.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

import mtkit.stages.distill as distill_stage
from mtkit.core.checkpoint import (
    SHORTLIST,
    VOCAB_SIZES,
    load_checkpoint,
    load_tensors,
    save_checkpoint,
    save_tensors,
)
from mtkit.core.config import config_from_dict

from conftest import read_lines, tiny_config_dict, write_lines
from faultkit import ROOT, assert_one_line, cli, snapshot

PAIRS = 300


@pytest.fixture(scope="module")
def student_run(trained, corpus, tmp_path_factory):
    """A folder with student.yaml and student/: a finished `mtkit run` of a distilled
    student (tokenizer from the teacher, distill/ with its shortlist, shards, 4 steps of
    training, the test set translated)."""
    folder = tmp_path_factory.mktemp("student")
    small = {
        side: write_lines(folder / f"train.{side}", read_lines(f"train.{side}.gz", PAIRS))
        for side in ("en", "de")
    }
    data = tiny_config_dict(
        corpus,
        folder / "student",
        tokenizer={"from": str(trained / "run")},
        distill={"teacher": [str(trained / "run")], "chunk_lines": 100, "precision": "fp32"},
        train={"max_steps": 4, "valid_every": 4},
    )
    data["data"]["train"] = {"src": str(small["en"]), "tgt": str(small["de"])}
    (folder / "student.yaml").write_text(yaml.safe_dump(data))
    result = cli("run", "-c", folder / "student.yaml")
    assert result.exit_code == 0, result.output
    return folder


@pytest.fixture
def student(student_run, tmp_path):
    """A private copy of the student: (its config file, its config as a dict, its run)."""
    run = tmp_path / "student"
    shutil.copytree(student_run / "student", run)
    data = yaml.safe_load((student_run / "student.yaml").read_text())
    data["run_dir"] = str(run)
    config = tmp_path / "student.yaml"
    config.write_text(yaml.safe_dump(data))
    return config, data, run


def _chunks(run) -> list:
    return sorted((run / "distill" / "chunks").iterdir())


def _identity(path) -> tuple[int, int]:
    """What tells a file rewritten (an atomic write is a new inode) from one kept."""
    stat = path.stat()
    return stat.st_ino, stat.st_mtime_ns


def _another_corpus(tmp_path, data, config) -> list[str]:
    """data.train pointed at new files: the same pairs but lines 100-199 (the second
    chunk) taken from further in Multi30k; returns the new source lines."""
    src = read_lines("train.en.gz", 1000)
    tgt = read_lines("train.de.gz", 1000)
    new_src = src[:100] + src[600:700] + src[200:PAIRS]
    new_tgt = tgt[:100] + tgt[600:700] + tgt[200:PAIRS]
    data["data"]["train"] = {
        "src": str(write_lines(tmp_path / "other.en", new_src)),
        "tgt": str(write_lines(tmp_path / "other.de", new_tgt)),
    }
    config.write_text(yaml.safe_dump(data))
    return new_src


# --- 3: a new corpus is translated, exactly where it changed -------------------------------


def test_a_changed_corpus_translates_the_changed_chunks_again(student, tmp_path):
    config, data, run = student
    chunks = _chunks(run)
    before = {p.name: _identity(p) for p in chunks}
    new_src = _another_corpus(tmp_path, data, config)
    result = cli("distill", "-c", config)
    assert result.exit_code == 0, result.output
    assert "data.train changed since the chunks" in result.stderr
    after = {p.name: _identity(p) for p in _chunks(run)}
    assert after.keys() == before.keys()
    assert after["000000.jsonl"] == before["000000.jsonl"]  # the same lines: kept
    assert after["000002.jsonl"] == before["000002.jsonl"]
    assert after["000001.jsonl"] != before["000001.jsonl"]  # translated again
    second = [json.loads(x)["src"] for x in (run / "distill/chunks/000001.jsonl").open()]
    assert second == [" ".join(x.split()) for x in new_src[100:200] if x.strip()]
    distilled = (run / "distill" / "train.en").read_text().splitlines()
    assert set(second) <= set(distilled)
    cfg = config_from_dict(data)
    manifest = json.loads((run / "distill" / "manifest.json").read_text())
    state = json.loads((run / "distill" / "state.json").read_text())
    wanted = distill_stage.corpus_identity(cfg.data)
    assert manifest["settings"]["corpus"] == state["settings"]["corpus"] == wanted
    # nothing changed since: a rerun translates nothing and keeps every chunk
    assert cli("distill", "-c", config).exit_code == 0
    assert {p.name: _identity(p) for p in _chunks(run)} == after


def test_an_interrupted_corpus_change_compares_the_chunks_again(student, tmp_path, monkeypatch):
    """The new corpus is recorded once every chunk holds its lines: killed between, the
    next run still compares them (no stale chunk is trusted by its number)."""
    config, data, run = student
    _another_corpus(tmp_path, data, config)
    real = distill_stage.atomic_text

    def killed_writing_a_chunk(path):
        if path.parent.name == "chunks":
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(distill_stage, "atomic_text", killed_writing_a_chunk)
    with pytest.raises(KeyboardInterrupt):
        distill_stage.distill(config_from_dict(data))
    assert not (run / "distill" / "manifest.json").exists()  # not a finished distillation
    old = json.loads((run / "distill" / "state.json").read_text())["settings"]["corpus"]
    assert old != distill_stage.corpus_identity(config_from_dict(data).data)
    monkeypatch.setattr(distill_stage, "atomic_text", real)
    assert cli("distill", "-c", config).exit_code == 0
    second = [json.loads(x)["src"] for x in (run / "distill/chunks/000001.jsonl").open()]
    assert second[0] == " ".join(read_lines("train.en.gz", 601)[600].split())


def test_run_distils_again_when_data_train_changed(student, tmp_path):
    config, data, run = student
    _another_corpus(tmp_path, data, config)
    result = cli("-q", "run", "-c", config)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    # the stage ran (a student trained on the old corpus is then refused, not resumed)
    assert "trained on another corpus than the teacher's translations" in result.stderr
    manifest = json.loads((run / "distill" / "manifest.json").read_text())
    assert manifest["settings"]["corpus"] == distill_stage.corpus_identity(
        config_from_dict(data).data
    )


def test_run_with_a_damaged_shard_manifest_is_one_line(student):
    config, _, run = student
    (run / "data" / "train" / "manifest.json").write_text('{"distilled": "ab')
    result = cli("run", "-c", config)
    assert_one_line(result, says="corrupt manifest (not JSON); rerun `mtkit preprocess`")


# --- 4: a refused teacher removes nothing --------------------------------------------------


def _teacher_of_other_pieces(path) -> None:
    """A checkpoint of a random model with a 120-piece vocabulary (not the student's)."""
    from mtkit.core.config import Config, ModelConfig, TokenizerConfig, config_to_dict
    from mtkit.core.vocab import Vocab, vocab_entry
    from mtkit.model.transformer import build_model
    from mtkit.stages.tokenizer import train_sentencepiece

    vocab = Vocab(
        train_sentencepiece(read_lines("train.en.gz", 300), TokenizerConfig(vocab_size=120))
    )
    model = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, heads=2, ffn_dim=32)
    built = build_model(model, len(vocab), len(vocab))
    cfg = Config(model=model)
    payload = {
        "config": config_to_dict(cfg),
        "vocab": vocab_entry(vocab, vocab),
        "model": built.state_dict(),
    }
    save_checkpoint(payload, path)


@pytest.mark.parametrize(
    "teacher, says",
    [
        ("truncated", "not a readable checkpoint"),
        ("text", "not a readable checkpoint"),
        ("other_pieces", "its tokenizer differs from this run's"),
    ],
)
def test_a_refused_new_teacher_leaves_the_finished_distillation(
    student, trained, tmp_path, teacher, says
):
    config, _, run = student
    path = tmp_path / "teacher.pt"
    if teacher == "truncated":
        whole = (trained / "run" / "checkpoints" / "best.pt").read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    elif teacher == "text":
        path.write_text("not a checkpoint, a note\n")
    else:
        _teacher_of_other_pieces(path)
    before = snapshot(run / "distill")
    assert len([p for p in before if p.parent.name == "chunks"]) == 3
    result = cli("distill", "-c", config, "--set", f"distill.teacher={path}")
    assert_one_line(result, says=says)
    assert snapshot(run / "distill") == before  # chunks, manifest, state, shortlist


# --- 13: bookkeeping that cannot be read ---------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "a list", "not utf-8", "a wrong type"])
def test_an_unreadable_state_is_one_line_and_removes_nothing(student, damage):
    config, _, run = student
    state = run / "distill" / "state.json"
    whole = state.read_bytes()
    state.write_bytes(
        {
            "truncated": whole[: len(whole) // 2],
            "a list": b"[]\n",
            "not utf-8": b"\xff\xfe{",
            "a wrong type": whole.replace(b'"precision": "fp32"', b'"precision": 32'),
        }[damage]
    )
    assert state.read_bytes() != whole
    before = snapshot(run / "distill")
    line = assert_one_line(cli("distill", "-c", config), says=f"{state}: unreadable")
    assert "delete it to distil again from the start" in line
    assert snapshot(run / "distill") == before


@pytest.mark.parametrize("key", ["settings", "precision", "attention", "settings.corpus"])
def test_a_state_without_a_key_this_mtkit_writes_is_one_line_and_removes_nothing(student, key):
    """A state.json lacking a key (one an older mtkit did not write) is refused, naming
    the key, rather than read with a guess for it."""
    config, _, run = student
    state = run / "distill" / "state.json"
    record = json.loads(state.read_text())
    part, _, name = key.rpartition(".")
    del (record[part] if part else record)[name]
    state.write_text(json.dumps(record, indent=2) + "\n")
    before = snapshot(run / "distill")
    line = assert_one_line(cli("distill", "-c", config), says=f"{state}: incomplete (no {key});")
    assert "delete it to distil again from the start" in line
    assert snapshot(run / "distill") == before


def test_a_state_whose_choices_are_not_measured_yet_measures_them_and_keeps_the_chunks(
    student, monkeypatch
):
    """A first start under `precision: auto` writes state.json with the precision and the
    attention kernel None, then measures them: a distillation stopped in between measures
    them when it goes on, and keeps its chunks."""
    config, _, run = student
    state = run / "distill" / "state.json"
    record = json.loads(state.read_text())
    record["settings"]["asked_precision"] = "auto"
    record.update(precision=None, attention=None)
    state.write_text(json.dumps(record, indent=2) + "\n")
    kept = {path: _identity(path) for path in _chunks(run)}
    monkeypatch.setattr(distill_stage, "clean", None)  # translating again would fail
    result = cli("distill", "-c", config, "--set", "distill.precision=auto")
    assert result.exit_code == 0, result.output
    assert {path: _identity(path) for path in _chunks(run)} == kept
    measured = json.loads(state.read_text())
    assert measured["precision"] in ("fp32", "bf16")
    assert measured["attention"] in ("sdpa", "matmul")


def test_an_unreadable_manifest_is_one_line_and_distill_writes_it_again(student, monkeypatch):
    config, data, run = student
    manifest = run / "distill" / "manifest.json"
    whole = manifest.read_bytes()
    manifest.write_bytes(whole[: len(whole) // 3])
    shutil.rmtree(run / "data" / "train")  # preprocess reads the manifest
    line = assert_one_line(cli("preprocess", "-c", config), says=f"{manifest}: unreadable")
    assert "rerun `mtkit distill`" in line
    monkeypatch.setattr(distill_stage, "clean", None)  # translating again would fail
    assert cli("distill", "-c", config).exit_code == 0
    assert manifest.read_bytes() == whole


def test_a_damaged_chunk_is_translated_again(student, monkeypatch):
    config, _, run = student
    before = snapshot(run / "distill")
    chunk = run / "distill" / "chunks" / "000001.jsonl"
    whole = chunk.read_bytes()
    chunk.write_bytes(whole[: len(whole) // 2])  # cut inside a record
    real, calls = distill_stage.clean, []
    monkeypatch.setattr(distill_stage, "clean", lambda s, t: (calls.append(len(s)), real(s, t))[1])
    result = cli("distill", "-c", config)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert f"{chunk} is damaged" in result.stderr
    assert calls == [100]  # only that chunk was translated
    after = snapshot(run / "distill")
    state = run / "distill" / "state.json"
    assert {p: b for p, b in after.items() if p != state} == {
        p: b for p, b in before.items() if p != state
    }


def test_a_chunk_cut_at_a_line_end_is_translated_again(student):
    """Whole records missing, every line still JSON: their count is not the chunk's."""
    config, _, run = student
    chunk = run / "distill" / "chunks" / "000002.jsonl"
    whole = chunk.read_bytes()
    chunk.write_bytes(b"".join(whole.splitlines(keepends=True)[:40]))
    result = cli("distill", "-c", config)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert f"{chunk} is damaged" in result.stderr
    assert chunk.read_bytes() == whole


def test_a_chunk_of_garbage_lines_is_translated_again(student):
    """As many lines as records, but not JSON: found when the corpus is written, then
    translated again before anything is renamed into place."""
    config, _, run = student
    chunk = run / "distill" / "chunks" / "000000.jsonl"
    whole = chunk.read_bytes()
    chunk.write_bytes(b"not json\n" * whole.count(b"\n"))
    result = cli("distill", "-c", config)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert f"{chunk} is damaged" in result.stderr
    assert chunk.read_bytes() == whole


def test_a_translation_holding_a_line_separator_is_no_damage(tmp_path):
    """JSON leaves U+2028 and U+0085 unescaped: a chunk's lines end at newlines only."""
    record = {"src": "a", "tgt": "b\u2028c\x85d", "src_pieces": 1, "tgt_pieces": 3, "cost": 0.5}
    chunk = tmp_path / "000000.jsonl"
    chunk.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    assert distill_stage._read_chunk(chunk) == [record]
    assert distill_stage._whole(chunk, ["a"], ["b"])


# --- 8, 14: training checks distill/shortlist.pt at its start ------------------------------


def _fresh_student(run) -> None:
    """The run as before its first training step (distilled and preprocessed)."""
    shutil.rmtree(run / "checkpoints")
    (run / "metrics.jsonl").unlink(missing_ok=True)


def _damaged_shortlist(path, damage: str) -> None:
    entry = load_tensors(path)
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        whole = path.read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    elif damage == "pickle":  # objects that safe loading refuses to build
        torch.save({"table": entry["table"], "why": object}, path)
    elif damage == "no table":
        save_tensors({"frequent": entry["frequent"]}, path)
    elif damage == "other shape":
        save_tensors(
            {**entry, "table": entry["table"][:10], VOCAB_SIZES: torch.tensor([10, 500])}, path
        )
    elif damage == "ids out of range":
        table = entry["table"].clone()
        table[5, 0] = 100_000
        save_tensors({k: v for k, v in {**entry, "table": table}.items() if k != VOCAB_SIZES}, path)


@pytest.mark.parametrize(
    "damage, says",
    [
        ("missing", "is missing; rerun `mtkit distill`"),
        ("empty", "unreadable"),
        ("truncated", "unreadable"),
        ("pickle", "unreadable"),
        ("no table", "no 'table' tensor"),
        ("other shape", "made for vocabularies of [10, 500] pieces"),
        ("ids out of range", "'table' holds ids outside the"),
    ],
)
def test_training_refuses_a_missing_or_unusable_shortlist_at_its_start(student, damage, says):
    config, _, run = student
    _fresh_student(run)
    path = run / SHORTLIST
    if damage == "missing":
        path.unlink()
    else:
        _damaged_shortlist(path, damage)
    result = cli("train", "-c", config, "--set", "train.save_every=1")
    line = assert_one_line(result, says=says)
    assert str(path) in line
    assert not list((run / "checkpoints").glob("*.pt"))  # refused before step 1


def test_run_makes_a_missing_shortlist_again(student):
    config, _, run = student
    _fresh_student(run)
    (run / SHORTLIST).unlink()
    result = cli("run", "-c", config)
    assert result.exit_code == 0, result.output
    assert "shortlist" in load_checkpoint(run / "checkpoints" / "last.pt")


def test_a_student_without_a_shortlist_trains_when_none_is_asked(student):
    config, _, run = student
    _fresh_student(run)
    (run / SHORTLIST).unlink()
    result = cli("train", "-c", config, "--set", "distill.shortlist=0")
    assert result.exit_code == 0, result.output
    assert "shortlist" not in load_checkpoint(run / "checkpoints" / "last.pt")


def test_distill_writes_the_shortlist_with_its_vocabulary_sizes(student):
    _, _, run = student
    entry = load_tensors(run / SHORTLIST)
    sizes = entry[VOCAB_SIZES].tolist()
    assert sizes[0] == entry["table"].size(0) and len(sizes) == 2
    assert "shortlist" in load_checkpoint(run / "checkpoints" / "last.pt")


# --- 9: a checkpoint's shortlist is checked when it is loaded ------------------------------


@pytest.fixture
def bad_students(student, tmp_path):
    """Checkpoints of the student whose shortlist is of another shape, names target ids
    past the vocabulary, or lacks its table."""
    _, _, run = student
    payload = load_checkpoint(run / "checkpoints" / "last.pt")
    good = payload["shortlist"]
    out = {}
    for name, shortlist in (
        ("other shape", {"frequent": good["frequent"], "table": good["table"][:50]}),
        ("ids out of range", {"frequent": good["frequent"] + 10_000, "table": good["table"]}),
        ("no table", {"frequent": good["frequent"]}),
    ):
        out[name] = tmp_path / f"{name.replace(' ', '_')}.pt"
        save_checkpoint({**payload, "shortlist": shortlist}, out[name])
    return out


@pytest.mark.parametrize(
    "bad, says",
    [
        ("other shape", "its table has 50 rows for"),
        ("ids out of range", "'frequent' holds ids outside the"),
        ("no table", "no 'table' tensor"),
    ],
)
def test_translate_with_a_checkpoints_bad_shortlist_is_one_line(bad_students, bad, says):
    path = bad_students[bad]
    for shortlist in ("--shortlist", "--no-shortlist"):
        result = cli("translate", "-m", path, shortlist, input="A dog runs.\n")
        line = assert_one_line(result, says=says)
        assert line.startswith(f"error: {path}: unusable lexical shortlist")


def test_serve_with_a_bad_shortlist_refuses_at_its_start(bad_students):
    pytest.importorskip("fastapi")
    from serverkit import free_port

    proc = subprocess.run(
        [sys.executable, "-m", "mtkit", "serve", "-m", bad_students["ids out of range"]]
        + ["--shortlist", "--device", "cpu", "--port", str(free_port())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and "unusable lexical shortlist" in lines[0], lines
