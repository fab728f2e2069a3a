"""`mtkit distill` and a student's `mtkit run`: the tiny trained run (tests/conftest.py) is
the teacher of a student that shares its tokenizer, on a 300-pair slice of Multi30k."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml

import mtkit.stages.distill as distill_stage
from mtkit.core.checkpoint import load_checkpoint, trained_model
from mtkit.core.config import config_from_dict
from mtkit.core.search_options import SearchOptions
from mtkit.engines.loader import load_engine
from mtkit.engines.session import Session
from mtkit.stages.distill import distill

from conftest import cli, one_line_error, read_lines, tiny_config_dict, write_lines

PAIRS = 300


@pytest.fixture
def student(trained, corpus, tmp_path):
    """A student's config (student.yaml, its run in tmp_path/student) whose teacher is the
    trained run, and the config as a dict (tests change it)."""
    small = {
        side: write_lines(tmp_path / f"train.{side}", read_lines(f"train.{side}.gz", PAIRS))
        for side in ("en", "de")
    }
    data = tiny_config_dict(
        corpus,
        tmp_path / "student",
        tokenizer={"from": str(trained / "run")},
        model={"encoder_layers": 2},
        distill={"teacher": [str(trained / "run")], "chunk_lines": 100, "precision": "fp32"},
        train={"max_steps": 4, "valid_every": 2},
    )
    data["data"]["train"] = {"src": str(small["en"]), "tgt": str(small["de"])}
    path = tmp_path / "student.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data


def _files(run) -> dict[str, bytes]:
    folder = run / "distill"
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "state.json"
    }


def test_a_student_run_trains_on_the_teachers_beam_search_translations(student, trained):
    config, data = student
    result = cli("run", "-c", config)
    assert result.exit_code == 0, result.output
    run = config.parent / "student"
    manifest = json.loads((run / "distill" / "manifest.json").read_text())
    assert manifest["pairs"]["translated"] == PAIRS and manifest["chunks"] == 3
    kept = manifest["pairs"]["kept"]
    assert kept + sum(manifest["pairs"]["dropped"].values()) == PAIRS
    sources = (run / "distill" / "train.en").read_text().splitlines()
    targets = (run / "distill" / "train.de").read_text().splitlines()
    assert len(sources) == len(targets) == kept
    # the teacher's translations are its beam 5's, with the kernel it measured
    teacher = trained / "run" / "checkpoints" / "best.pt"
    state = json.loads((run / "distill" / "state.json").read_text())
    engine = load_engine(teacher, "cpu", precision="fp32")
    engine.use_attention(state["attention"])
    opts = SearchOptions.from_config(engine.config.decode)
    given = [t.text for t in Session(engine, opts).translate_texts(sources[:20])]
    assert given == targets[:20]
    shards = json.loads((run / "data" / "train" / "manifest.json").read_text())
    assert shards["distilled"] == manifest["corpus_sha256"]
    assert [c["origin"] for c in shards["corpora"]] == [
        f"{run / 'distill' / 'train.en'} + {run / 'distill' / 'train.de'}"
    ]
    assert (run / "checkpoints" / "last.pt").exists() and (run / "test.hyp").exists()
    # its checkpoints keep the shortlist of the distilled corpus: --shortlist uses it
    student = run / "checkpoints" / "last.pt"
    assert "shortlist" in load_checkpoint(student)
    text = "\n".join(sources[:30]) + "\n"
    for precision in ("fp32", "int8"):
        cut = cli("translate", "-m", student, "--shortlist", "--precision", precision, input=text)
        assert cut.exit_code == 0 and len(cut.stdout.splitlines()) == 30, cut.output
    one_line_error(
        cli("translate", "-m", teacher, "--shortlist", input=text), "has no lexical shortlist"
    )
    # exported, the shortlist is CTranslate2's vocabulary map
    pytest.importorskip("ctranslate2")
    folder = run / "ct2"
    assert cli("export", "-m", student, "-o", folder).exit_code == 0
    assert (folder / "vmap.txt").read_text().startswith("\t")
    cut = cli("translate", "-m", folder, "--shortlist", input=text)
    assert cut.exit_code == 0 and len(cut.stdout.splitlines()) == 30, cut.output


def test_a_student_starts_from_its_teachers_chosen_layers(student, trained):
    """`train.init_from` a run directory with `init_decoder_layers`: the student has as
    many decoder layers as chosen (here the teacher's one, twice), each starting as the
    chosen one, and the teacher's encoder; a layer the teacher lacks is one line."""
    config, data = student
    teacher = trained_model(trained / "run")
    data["train"].update(
        init_from=str(trained / "run"), init_decoder_layers=[0, 0], lr=1e-12, max_steps=1
    )
    config.write_text(yaml.safe_dump(data))
    result = cli("run", "-c", config)
    assert result.exit_code == 0, result.output
    run = config.parent / "student"
    start = load_checkpoint(run / "checkpoints" / "last.pt")
    assert start["config"]["model"]["decoder_layers"] == 2
    assert start["config"]["model"]["encoder_layers"] == 1  # the teacher's, not the yaml's 2
    theirs = load_checkpoint(teacher)["model"]
    for name, value in theirs.items():  # lr 1e-12: one update moves nothing measurable
        copies = (
            [name.replace("decoder_layers.0.", f"decoder_layers.{i}.") for i in (0, 1)]
            if name.startswith("decoder_layers.")
            else [name]
        )
        for copy in copies:
            torch.testing.assert_close(start["model"][copy], value, rtol=0, atol=1e-9)
    data["train"]["init_encoder_layers"] = [0, 3]
    config.write_text(yaml.safe_dump(data))
    shutil.rmtree(run / "checkpoints")
    one_line_error(cli("train", "-c", config), "has 1 encoder layer (0 to 0), not 3")
    for missing, says in (
        (config.parent / "nowhere.pt", "no such checkpoint or run directory"),
        (config.parent, "has no trained model yet"),  # a directory, but no run's
    ):
        data["train"]["init_from"] = str(missing)
        config.write_text(yaml.safe_dump(data))
        one_line_error(cli("train", "-c", config), says)
    data["train"]["init_from"] = ""
    config.write_text(yaml.safe_dump(data))
    one_line_error(cli("train", "-c", config), "train.init_encoder_layers chooses layers of")


def test_an_export_without_a_shortlist_refuses_it_in_one_line(exported):
    one_line_error(
        cli("translate", "-m", exported, "--shortlist", input="A dog.\n"),
        "this export has no vocabulary map",
    )


def test_an_interrupted_distillation_resumes_to_the_same_files(student, monkeypatch):
    config, data = student
    cfg = config_from_dict(data)
    assert cli("tokenizer", "-c", config).exit_code == 0
    distill(cfg)
    whole = _files(cfg.run_path)
    assert len([f for f in whole if f.startswith("chunks/")]) == 3
    shutil.rmtree(cfg.run_path / "distill")

    real, calls = distill_stage.clean, []

    def stop_at_the_third_chunk(src, tgt):
        calls.append(len(src))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(src, tgt)

    monkeypatch.setattr(distill_stage, "clean", stop_at_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        distill(cfg)
    chunks = sorted(p.name for p in (cfg.run_path / "distill" / "chunks").iterdir())
    assert chunks == ["000000.jsonl", "000001.jsonl"]  # no partial third one
    assert not (cfg.run_path / "distill" / "manifest.json").exists()
    calls.clear()
    monkeypatch.setattr(distill_stage, "clean", lambda s, t: (calls.append(len(s)), real(s, t))[1])
    distill(cfg)
    assert calls == [100]  # only the missing chunk was translated
    assert _files(cfg.run_path) == whole


def test_a_new_teacher_starts_over_and_a_trained_student_is_not_resumed(student, trained, tmp_path):
    config, data = student
    assert cli("run", "-c", config).exit_code == 0
    other = tmp_path / "other.pt"
    shutil.copy(trained / "run" / "checkpoints" / "step_10.pt", other)
    result = cli("-q", "run", "-c", config, "--set", f"distill.teacher={other}")
    assert result.exit_code == 2 and "Traceback" not in result.output and not result.stdout
    warned, error = result.stderr.strip().splitlines()  # -q: warnings and the error
    assert "fingerprint, teacher changed since the chunks" in warned
    assert "trained on another corpus than the teacher's translations" in error
    manifest = json.loads((config.parent / "student" / "distill" / "manifest.json").read_text())
    assert manifest["settings"]["teacher"] == [str(other)]  # redistilled, nothing trained


def test_filters_and_keep_original_are_counted_without_translating_again(student, monkeypatch):
    config, data = student
    assert cli("tokenizer", "-c", config).exit_code == 0
    distill(config_from_dict(data))
    chunks = sorted((config.parent / "student" / "distill" / "chunks").iterdir())
    records = [json.loads(line) for f in chunks for line in f.open()]
    costs = sorted(r["cost"] for r in records)
    max_cost = costs[len(costs) * 3 // 4]  # drops about a quarter
    ratios = [max(r["src_pieces"], r["tgt_pieces"]) / min(r["src_pieces"], r["tgt_pieces"])
              for r in records]  # fmt: skip
    max_ratio = sorted(ratios)[len(ratios) * 3 // 4]
    data["distill"].update(max_cost=max_cost, max_len_ratio=max_ratio, keep_original=True)
    cfg = config_from_dict(data)
    monkeypatch.setattr(distill_stage, "clean", None)  # translating again would fail
    pairs = distill(cfg)["pairs"]
    over = [r["cost"] > max_cost for r in records]
    assert pairs["dropped"]["cost"] == sum(over) > 0
    assert (
        pairs["dropped"]["ratio"]
        == sum(x > max_ratio for x, o in zip(ratios, over, strict=True) if not o)
        > 0
    )
    from mtkit.stages.preprocess import preprocess

    shards = preprocess(cfg)["train"]
    assert [c["read"] for c in shards["corpora"]] == [pairs["kept"], PAIRS]


@pytest.mark.parametrize(
    "teacher, says",
    [
        ("missing.pt", "no such checkpoint, run directory or config"),
        ("missing.yaml", "no such config file"),
        ("emptyrun", "has no trained model yet"),
    ],
)
def test_a_bad_teacher_is_one_line(student, tmp_path, teacher, says):
    config, _ = student
    (tmp_path / "emptyrun").mkdir()
    assert cli("tokenizer", "-c", config).exit_code == 0
    one_line_error(
        cli("distill", "-c", config, "--set", f"distill.teacher={tmp_path / teacher}"), says
    )
    assert not (config.parent / "student" / "distill" / "manifest.json").exists()


def test_a_teacher_with_other_pieces_is_one_line(student, tmp_path):
    config, data = student
    data["tokenizer"] = {"vocab_size": 400}  # its own tokenizer, not the teacher's
    config.write_text(yaml.safe_dump(data))
    assert cli("tokenizer", "-c", config).exit_code == 0
    one_line_error(cli("distill", "-c", config), "its tokenizer differs from this run's")


def test_distill_without_a_teacher_is_one_line(student):
    config, _ = student
    assert cli("tokenizer", "-c", config).exit_code == 0
    one_line_error(
        cli("distill", "-c", config, "--set", "distill.teacher=[]"), "distill.teacher is not set"
    )


def test_a_full_disk_is_one_line_and_keeps_the_chunks_written(student, monkeypatch):
    import errno
    from contextlib import contextmanager

    config, data = student
    assert cli("tokenizer", "-c", config).exit_code == 0
    real = distill_stage.atomic_text

    @contextmanager
    def full_after_the_first_chunk(path):
        with real(path) as f:
            if path.parent.name == "chunks" and path.name != "000000.jsonl":
                raise OSError(errno.ENOSPC, "No space left on device")
            yield f

    monkeypatch.setattr(distill_stage, "atomic_text", full_after_the_first_chunk)
    one_line_error(cli("-q", "distill", "-c", config), "no space left on device while writing")
    chunks = config.parent / "student" / "distill" / "chunks"
    assert [p.name for p in chunks.iterdir()] == ["000000.jsonl"]  # no partial file
    monkeypatch.setattr(distill_stage, "atomic_text", real)
    real_clean, calls = distill_stage.clean, []
    monkeypatch.setattr(
        distill_stage, "clean", lambda s, t: (calls.append(len(s)), real_clean(s, t))[1]
    )
    assert cli("-q", "distill", "-c", config).exit_code == 0
    assert calls == [100, 100]  # the first chunk was kept, not translated again
