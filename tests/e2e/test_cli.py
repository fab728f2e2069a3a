"""The command chain through Typer's CliRunner on a 2,000-pair slice of Multi30k."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from mtkit.cli import app

from conftest import write_config

runner = CliRunner()


def test_tokenizer_then_preprocess(tmp_path, corpus):
    config = write_config(tmp_path, corpus)
    result = runner.invoke(app, ["tokenizer", "--config", str(config)])
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    assert (run / "spm.model").stat().st_size > 0 and (run / "spm.vocab").exists()
    result = runner.invoke(app, ["preprocess", "-c", str(config), "--set", "data.max_len=30"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((run / "data" / "train" / "manifest.json").read_text())
    assert (
        manifest["dropped"]["length"] > 0
        and manifest["pairs"] + sum(manifest["dropped"].values()) == 2000
    )
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["max_len"] == 30
    for split in ("valid", "test"):
        assert json.loads((run / "data" / split / "manifest.json").read_text())["pairs"] == 100


def test_config_typo_is_one_line_and_exit_2(tmp_path, corpus):
    config = write_config(tmp_path, corpus)
    result = runner.invoke(app, ["tokenizer", "-c", str(config), "--set", "model.dmodel=8"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"config error: {config}: model.dmodel is not a key; did you mean model.d_model?"
    )


def test_mismatched_corpus_is_one_line_and_writes_nothing(tmp_path, corpus):
    short = tmp_path / "short.de"
    short.write_text("eins\nzwei\n")
    config = write_config(tmp_path, corpus)
    result = runner.invoke(
        app, ["tokenizer", "-c", str(config), "--set", f"data.train.tgt={short}"]
    )
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: line counts differ: {corpus['train.en']} has 2000 lines, {short} has 2"
    )
    assert not (tmp_path / "run" / "spm.model").exists()


def test_preprocess_before_tokenizer_says_what_to_run(tmp_path, corpus):
    result = runner.invoke(app, ["preprocess", "-c", str(write_config(tmp_path, corpus))])
    assert result.exit_code == 2 and "run `mtkit tokenizer` first" in result.output


def test_vocab_too_large_is_one_line(tmp_path, corpus):
    config = write_config(tmp_path, corpus, tokenizer={"vocab_size": 90000})
    result = runner.invoke(app, ["tokenizer", "-c", str(config)])
    assert result.exit_code == 2
    assert result.output.startswith("error: tokenizer.vocab_size=90000 cannot be trained")
    assert len(result.output.strip().splitlines()) == 1


def test_every_design_command_is_registered_with_help():
    result = runner.invoke(app, ["--help"])
    for command in ("tokenizer", "preprocess", "train", "translate", "eval", "average", "run"):
        assert command in result.output
        assert runner.invoke(app, [command, "--help"]).exit_code == 0


def test_whole_chain_tokenizer_preprocess_train_translate_eval_average(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 20, "valid_every": 10})
    run = tmp_path / "run"
    for stage in ("tokenizer", "preprocess", "train"):
        result = runner.invoke(app, [stage, "-c", str(config)])
        assert result.exit_code == 0, (stage, result.output)
    best = run / "checkpoints" / "best.pt"
    assert best.exists() and (run / "checkpoints" / "step_20.pt").exists()

    lines = ["A dog runs in the park.", "", "   ", "Two men talk.\r", "Zwei \udcff"]
    source = tmp_path / "in.txt"
    source.write_bytes("\n".join(lines[:4]).encode() + b"\n\xff\xfe broken\n")
    out = tmp_path / "out.txt"
    result = runner.invoke(
        app, ["translate", "-m", str(best), "-i", str(source), "-o", str(out), "--beam", "2"]
    )
    assert result.exit_code == 0, result.output
    translated = out.read_text().split("\n")[:-1]
    assert len(translated) == 5
    assert translated[1] == translated[2] == "" and translated[0] and translated[4]

    result = runner.invoke(
        app,
        ["translate", "-m", str(best), "--nbest", "2", "--beam", "3"],
        input="Ein Hund.\nZwei Männer.\n",
    )
    assert result.exit_code == 0
    rows = [line.split(" ||| ") for line in result.stdout.strip().split("\n")]
    assert [r[0] for r in rows] == ["0", "0", "1", "1"] and all(len(r) == 3 for r in rows)

    result = runner.invoke(
        app,
        ["translate", "-m", str(best), "--format", "jsonl"],
        input='{"src": "A dog.", "id": "x7"}\n{"src": 3}\nnot json\n',
    )
    record, wrong, broken = [json.loads(x) for x in result.stdout.splitlines()]
    assert record["line"] == 0 and record["source"] == "A dog." and "score" in record
    assert record["id"] == "x7" and wrong["line"] == 1 and "expected" in wrong["error"]
    assert broken["line"] == 2 and broken["error"].startswith("not a JSON object")

    hyp = tmp_path / "hyp.txt"
    hyp.write_text("".join(x + "\n" for x in translated))
    result = runner.invoke(app, ["eval", "--hyp", str(hyp), "--ref", str(out), "--json"])
    scores = json.loads(result.stdout)
    assert scores["bleu"]["score"] == 100.0 and scores["bleu"]["signature"].startswith("nrefs:1")
    assert set(scores) == {"bleu", "chrf", "ter"}
    result = runner.invoke(
        app,
        [
            "eval",
            "-m",
            str(best),
            "--src",
            str(corpus["test.en"]),
            "--ref",
            str(corpus["test.de"]),
            "--metrics",
            "bleu",
        ],
    )
    assert result.exit_code == 0 and result.stdout.startswith("BLEU = ")
    assert result.stdout.splitlines()[-1].startswith("confidence: Spearman ")
    ranked = runner.invoke(
        app,
        [
            "eval",
            "-m",
            str(best),
            "--src",
            str(corpus["test.en"]),
            "--ref",
            str(corpus["test.de"]),
            "--json",
        ],
    )
    confidence = json.loads(ranked.stdout)["confidence"]
    assert -1 <= confidence["spearman_chrf"] <= 1 and confidence["sentences"] == 100
    result = runner.invoke(app, ["eval", "--hyp", str(hyp), "--ref", str(corpus["test.de"])])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: line counts differ: {hyp} has 5 lines, {corpus['test.de']} has 100"
    )

    averaged = tmp_path / "avg.pt"
    result = runner.invoke(app, ["average", str(run / "checkpoints"), "-o", str(averaged)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["translate", "-m", str(averaged)], input="A dog.\n")
    assert result.exit_code == 0 and len(result.stdout.split("\n")) == 2


def test_bad_checkpoints_are_one_line_errors(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    for path, message in (
        (tmp_path / "missing.pt", "no such checkpoint"),
        (garbage, "not a readable checkpoint"),
    ):
        result = runner.invoke(app, ["translate", "-m", str(path)], input="hello\n")
        assert result.exit_code == 2
        assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_python_dash_m_works():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "mtkit", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "translate" in done.stdout


def test_run_does_every_stage_then_skips_finished_ones(tmp_path, corpus):
    config = write_config(
        tmp_path,
        corpus,
        train={"max_steps": 20, "valid_every": 10, "save_every": 5, "average_last": 2},
    )
    result = runner.invoke(app, ["run", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("test BLEU ")
    assert "trained to step 20 (max_steps) in fp32" in result.stderr
    run = tmp_path / "run"
    hyps = (run / "test.hyp").read_text().split("\n")[:-1]
    assert len(hyps) == 100
    scores = json.loads((run / "test.scores.json").read_text())
    assert scores["checkpoint"].endswith("average.pt") and "chrf" in scores
    before = (run / "metrics.jsonl").read_text().count('"event": "train"')
    mtime = (run / "test.hyp").stat().st_mtime
    again = runner.invoke(app, ["run", "-c", str(config)])
    assert again.exit_code == 0 and again.stdout == result.stdout
    assert (run / "metrics.jsonl").read_text().count('"event": "train"') == before
    assert (run / "test.hyp").stat().st_mtime == mtime


def test_sampling_is_seeded_per_line_batched_or_alone(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 20, "valid_every": 20})
    for stage in ("tokenizer", "preprocess", "train"):
        assert runner.invoke(app, [stage, "-c", str(config)]).exit_code == 0
    best = str(tmp_path / "run" / "checkpoints" / "best.pt")
    lines = ["A dog runs in the park.", "Two men talk.", "A woman sings."]

    def sample(text: str, *extra: str) -> list[str]:
        result = runner.invoke(
            app,
            ["translate", "-m", best, "--sampling", "--beam", "2", "--nbest", "2", *extra],
            input=text,
        )
        assert result.exit_code == 0, result.output
        # texts only: a batch's scores differ from those of a line alone in float noise
        return [" ||| ".join(r.split(" ||| ")[:2]) for r in result.stdout.splitlines()]

    together = sample("".join(x + "\n" for x in lines), "--seed", "3")
    assert len(together) == 6
    one_per_batch = sample("".join(x + "\n" for x in lines), "--seed", "3", "--batch-tokens", "16")
    alone = [
        row
        for i, x in enumerate(lines)
        for row in (r.replace("0 |||", f"{i} |||", 1) for r in sample(x + "\n", "--seed", "3"))
    ]
    assert together == one_per_batch == alone
    assert sample("".join(x + "\n" for x in lines), "--seed", "4") != together
    greedy_like = sample(lines[0] + "\n", "--temperature", "0.001", "--seed", "5")
    beam = runner.invoke(
        app, ["translate", "-m", best, "--beam", "1", "--lenpen", "0"], input=lines[0] + "\n"
    ).stdout.strip()
    assert greedy_like[0].split(" ||| ")[1] == beam
