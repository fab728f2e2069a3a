"""Bad options, bad config values and awkward input: one line and exit 2 (130 on Ctrl-C)."""

from __future__ import annotations

import gzip
import io
import json
import signal
import subprocess
import sys
import tracemalloc

import pytest
import torch
import yaml

from mtkit.core.textio import MAX_LINE_BYTES, read_chunks

from conftest import write_config
from faultkit import ROOT, assert_one_line, cli, mtkit_process, snapshot, wait_for


@pytest.mark.parametrize(
    "args, says",
    [
        (["--beam", "0"], "--beam must be from 1 to 256, got 0"),
        (["--beam", "2", "--nbest", "3"], "--nbest 3 must not exceed --beam 2"),
        (["--nbest", "9"], "--nbest 9 must not exceed the checkpoint's beam size 5"),
        (["--nbest", "0"], "--nbest must be from 1 to 256, got 0"),
        (["--lenpen", "-1"], "--lenpen must be from 0 to 10, got -1.0"),
        (["--lenpen", "nan"], "--lenpen must be from 0 to 10, got nan"),
        (["--max-len-a", "-0.5"], "--max-len-a must be at least 0, got -0.5"),
        (["--max-len-b", "-1"], "--max-len-b must be at least 0, got -1"),
        (["--batch-tokens", "0"], "--batch-tokens must be from 1 to 2,147,483,647, got 0"),
        (
            ["--format", "rtf"],
            "--format must be text, jsonl, html, xml, srt, po, xliff, docx, pptx, xlsx, odt, "
            "odp or epub, got 'rtf'",
        ),
        (["--device", "tpu"], "--device must be auto, cpu or cuda, got 'tpu'"),
    ],
)
def test_translate_options_out_of_range_name_the_option(work, args, says):
    result = cli(
        "translate", "-m", work / "run" / "checkpoints" / "best.pt", *args, input="A dog.\n"
    )
    assert assert_one_line(result, says=says) == f"error: {says}"
    assert result.stdout == ""


def test_device_cuda_without_cuda_names_the_option_given(work):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = cli(
        "translate",
        "-m",
        work / "run" / "checkpoints" / "best.pt",
        "--device",
        "cuda",
        input="A dog.\n",
    )
    assert_one_line(
        result,
        says="error: --device cuda, but no CUDA device is available (use --device auto or cpu)",
    )
    result = cli("train", "-c", work / "exp.yaml", "--set", "train.device=cuda")
    assert_one_line(result, says="error: train.device=cuda, but no CUDA device")


def test_average_last_below_one_is_refused(work):
    result = cli("average", work / "run" / "checkpoints", "--last", "0", "-o", work / "a.pt")
    assert_one_line(result, says="error: --last must be at least 1, got 0")
    assert not (work / "a.pt").exists()


@pytest.mark.parametrize(
    "override, says",
    [
        ("train.lr=.nan", "train.lr must be a finite number, got nan"),
        ("train.max_time=.inf", "train.max_time must be a finite number, got inf"),
        ("model.dropout=nan", "model.dropout must be a finite number, got nan"),
        ("train.seed=-1", "train.seed must be in [0, inf], got -1"),
        ("tokenizer.seed=-3", "tokenizer.seed must be in [0, inf], got -3"),
        (
            "model.max_positions=100",
            "model.max_positions (100) must be at least data.max_len + 2 (258)",
        ),
        ("model.dmodel=8", "model.dmodel is not a key; did you mean model.d_model?"),
        ("model.heads=3", "model.d_model (16) must be divisible by model.heads (3)"),
    ],
)
def test_bad_config_values_are_refused_at_load(work, override, says):
    before = snapshot(work)
    for stage in ("tokenizer", "train"):
        result = cli(stage, "-c", work / "exp.yaml", "--set", override)
        assert_one_line(result, says=f"config error: {work / 'exp.yaml'}: {says}")
    assert snapshot(work) == before


def test_usage_errors_of_the_real_command_are_one_line():
    for args, says in (
        (["translate", "--bogus"], "No such option: --bogus"),
        (["translate"], "Missing option '--model'"),
        (["translate", "-m", "x.pt", "--beam", "two"], "Invalid value for '--beam'"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "mtkit", *args], cwd=ROOT, capture_output=True, text=True
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and says in lines[0], done.stderr
        assert lines[0].endswith("(see `mtkit translate --help`)")


def test_eval_on_empty_files_is_one_line(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("")
    ref.write_text("")
    assert_one_line(
        cli("eval", "--hyp", hyp, "--ref", ref), says=f"error: nothing to score: {ref} is empty"
    )


def test_byte_order_marks_are_dropped_from_corpora_and_references(tmp_path, work, corpus):
    ref = tmp_path / "ref.txt"
    ref.write_bytes(b"\xef\xbb\xbfEin Hund rennt.\nZwei M\xc3\xa4nner.\n")
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("Ein Hund rennt.\nZwei Männer.\n")
    result = cli("eval", "--hyp", hyp, "--ref", ref, "--json", "--metrics", "chrf")
    assert result.exit_code == 0 and json.loads(result.stdout)["chrf"]["score"] == 100.0

    for name in ("train.en", "train.de"):
        lines = corpus[name].read_bytes()
        (tmp_path / f"{name}.gz").write_bytes(gzip.compress(b"\xef\xbb\xbf" + lines))
    config = yaml.safe_load((work / "exp.yaml").read_text())
    config["data"]["train"] = {
        "src": str(tmp_path / "train.en.gz"),
        "tgt": str(tmp_path / "train.de.gz"),
    }
    (work / "exp.yaml").write_text(yaml.safe_dump(config))
    assert cli("tokenizer", "-c", work / "exp.yaml").exit_code == 0
    assert "\ufeff" not in (work / "run" / "spm.vocab").read_text()


def test_explain_attention_on_an_empty_source_is_one_line(work, tmp_path):
    result = cli(
        "explain",
        "attention",
        "-m",
        work / "run" / "checkpoints" / "best.pt",
        "--src",
        "   ",
        "-o",
        tmp_path / "pics",
    )
    assert_one_line(result, says="error: --src is empty: give a sentence to translate")
    assert not (tmp_path / "pics").exists()


class EndlessLine(io.RawIOBase):
    """`total` bytes of one line without a newline, made on the fly, then one short line."""

    def __init__(self, total: int):
        self.left, self.tail = total, b"\nshort line\n"

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.left > 0:
            size = min(n, self.left)
            self.left -= size
            return b"ab" * (size // 2) + b"a" * (size % 2)
        out, self.tail = self.tail, b""
        return out


def test_a_50_mb_line_is_cut_while_reading_in_bounded_memory():
    tracemalloc.start()
    lines = [line for chunk in read_chunks(EndlessLine(50 << 20)) for line in chunk]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [len(x) for x in lines] == [MAX_LINE_BYTES, len("short line")]
    assert peak < 8 * MAX_LINE_BYTES  # a few copies of one bounded line, not 50 MB


def test_a_byte_order_mark_on_translate_input_is_dropped():
    lines = [x for c in read_chunks(io.BytesIO(b"\xef\xbb\xbfHallo\nWelt\n")) for x in c]
    assert lines == ["Hallo", "Welt"]


def test_a_gzip_compressed_translate_input_is_one_line_not_garbage(work, tmp_path):
    """Read as text, its bytes were translated (invalid UTF-8 replaced) into garbage; no
    UTF-8 text starts with gzip's magic bytes."""
    packed = gzip.compress(b"A dog runs.\nTwo men talk.\n")
    path, out = tmp_path / "in.en.gz", tmp_path / "out.de"
    path.write_bytes(packed)
    best = work / "run" / "checkpoints" / "best.pt"
    says = "error: the input is gzip-compressed: decompress it first"
    assert_one_line(cli("translate", "-m", best, "-i", path, "-o", out), says=says)
    assert not out.exists()
    assert_one_line(cli("translate", "-m", best, input=packed), says=says)  # on stdin
    plain = [x for c in read_chunks(io.BytesIO(b"\x1fA unit separator first\n")) for x in c]
    assert plain == ["\x1fA unit separator first"]  # text that starts with 0x1f is text


def test_a_hub_dataset_without_network_is_one_line(work, monkeypatch):
    monkeypatch.setattr("mtkit.data.sources._hub_reachable", lambda timeout=3.0: False)
    result = cli(
        "tokenizer",
        "-c",
        work / "exp.yaml",
        "--set",
        "data.train.src=",
        "--set",
        "data.train.tgt=",
        "--set",
        "data.train.hub=nosuch/corpus-xyz",
    )
    assert_one_line(result, says="nosuch/corpus-xyz [train]: not in the cache")


def test_ctrl_c_in_run_stops_the_pipeline_after_the_checkpoint(work):
    run = work / "run"
    proc = mtkit_process(
        "run",
        "-c",
        work / "exp.yaml",
        "--set",
        "train.max_steps=2000",
        "--set",
        "train.save_every=5",
    )
    wait_for(lambda: (run / "checkpoints" / "step_25.pt").exists(), proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "interrupted: stopped by SIGINT after saving a checkpoint; rerun to go on"
    )
    assert not (run / "test.hyp").exists() and not (run / "test.scores.json").exists()
    steps = sorted(int(p.stem[5:]) for p in (run / "checkpoints").glob("step_*.pt"))
    last = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    # The signal may land while step 25 is still being saved; then step 25 is the stop's
    # checkpoint and nothing newer is written.
    assert last["train"]["progress"]["step"] == steps[-1] >= 25


@pytest.mark.parametrize(
    "args, says",
    [
        (["--sampling", "--topp", "1.5"], "--topp must be in (0, 1], got 1.5"),
        (["--sampling", "--temperature", "0"], "--temperature must be above 0, got 0.0"),
        (["--sampling", "--topk", "-1"], "--topk must be at least 0, got -1"),
        (["--no-repeat-ngram", "0"], "--no-repeat-ngram must be from 1 to 2,147,483,647, got 0"),
        (["--topk", "5"], "--topk is a sampling option: add --sampling"),
    ],
)
def test_decoding_options_out_of_range_name_the_option(work, args, says):
    result = cli(
        "translate", "-m", work / "run" / "checkpoints" / "best.pt", *args, input="A dog.\n"
    )
    assert assert_one_line(result, says=says) == f"error: {says}"
    assert result.stdout == ""


def test_a_prefix_file_must_match_the_input_line_for_line(work, tmp_path):
    best = work / "run" / "checkpoints" / "best.pt"
    prefixes, text = tmp_path / "prefix.txt", tmp_path / "in.txt"
    prefixes.write_text("Ein\nZwei\n")
    text.write_text("A dog runs.\nTwo men talk.\nA cat.\n")
    result = cli("translate", "-m", best, "-i", text, "--prefix-file", prefixes)
    assert_one_line(result, says=f"error: --prefix-file {prefixes} has 2 lines, the input has 3")
    assert result.stdout == ""
    result = cli(
        "translate", "-m", best, "--prefix-file", prefixes, input="A dog runs.\nTwo men talk.\n"
    )
    assert result.exit_code == 0, result.output
    outputs = result.stdout.splitlines()
    assert outputs[0].startswith("Ein") and outputs[1].startswith("Zwei")
    result = cli(
        "translate",
        "-m",
        best,
        "--format",
        "jsonl",
        input='{"src": "A dog runs.", "prefix": "Ein"}\n{"src": "Two men."}\n',
    )
    first, second = [json.loads(x) for x in result.stdout.splitlines()]
    assert first["translation"].startswith("Ein") and "translation" in second


def test_an_ensemble_of_models_with_different_vocabularies_is_refused(work, tmp_path, corpus):
    other = tmp_path / "other"
    other.mkdir()
    config = write_config(
        other, corpus, tokenizer={"vocab_size": 400}, train={"max_steps": 1, "valid_every": 1}
    )
    for stage in ("tokenizer", "preprocess", "train"):
        assert cli(stage, "-c", config).exit_code == 0
    best = work / "run" / "checkpoints" / "best.pt"
    foreign = other / "run" / "checkpoints" / "last.pt"
    result = cli("translate", "-m", best, "-m", foreign, input="A dog.\n")
    assert assert_one_line(result) == (
        f"error: {foreign} and {best} have different source "
        f"vocabularies; the models of an ensemble must share "
        f"their tokenizers"
    )
    assert result.stdout == ""


def test_a_config_that_cannot_be_read_is_one_line(work, monkeypatch):
    (work / "bad.yaml").write_text("data: [\n")
    monkeypatch.chdir(work)
    before = snapshot(work)
    for config, says in (
        ("none.yaml", "config error: none.yaml: no such config file"),
        ("run", "config error: run is a folder, not a config file"),
        ("bad.yaml", "config error: bad.yaml: invalid YAML (line 2)"),
    ):
        assert assert_one_line(cli("tokenizer", "-c", config)) == says
    assert snapshot(work) == before


def test_a_missing_checkpoint_or_a_plain_folder_is_one_line(work, monkeypatch):
    monkeypatch.chdir(work)
    before = snapshot(work)
    for model, says in (
        ("none.pt", "error: none.pt: no such checkpoint"),
        ("run", "error: run is a folder but not an exported model (no mtkit.json and model.bin)"),
    ):
        assert_one_line(cli("translate", "-m", model, input="A dog.\n"), says=says)
    assert snapshot(work) == before


def test_eval_names_the_metrics_it_knows(tmp_path):
    (tmp_path / "hyp").write_text("Ein Hund.\n")
    result = cli(
        "eval", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "hyp", "--metrics", "meteor"
    )
    assert assert_one_line(result) == "error: unknown metric 'meteor'; choose from bleu, chrf, ter"


@pytest.mark.slow
def test_a_50_mb_line_on_stdin_is_translated_by_the_real_command(work):
    """The whole command, through a pipe: the line is cut while reading (in bounded memory,
    above) and translated; exit 0, one output line."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtkit",
            "translate",
            "-m",
            "run/checkpoints/best.pt",
            "--beam",
            "1",
        ],
        cwd=work,
        input=b"a" * (50 << 20),
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert b"Traceback" not in done.stderr and len(done.stdout.splitlines()) == 1


def test_invalid_utf8_a_byte_order_mark_and_empty_lines_are_translated_line_for_line(work):
    best = work / "run" / "checkpoints" / "best.pt"
    result = cli("translate", "-m", best, input=b"\xef\xbb\xbfA dog.\n\n\xff\xfe x\n")
    assert result.exit_code == 0, result.output
    first, blank, replaced = result.stdout.split("\n")[:3]
    assert first and blank == "" and replaced


def test_eval_with_a_model_scores_exactly_what_translate_writes(trained, corpus, tmp_path):
    """Lines of three sentences: `eval -m` translates them as `translate` does (split
    into sentences by the checkpoint's decode.split, or not with --no-split), so its
    score is the score of `translate`'s output; it used to translate each line whole."""
    best = trained / "run" / "checkpoints" / "best.pt"
    sources = corpus["test.en"].read_text().splitlines()[:30]
    references = corpus["test.de"].read_text().splitlines()[:30]
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(" ".join(sources[i : i + 3]) + "\n" for i in range(0, 30, 3)))
    ref.write_text("".join(" ".join(references[i : i + 3]) + "\n" for i in range(0, 30, 3)))
    written = {}
    for way in ("--split", "--no-split", None):
        hyp = tmp_path / f"hyp{way}.txt"
        result = cli("translate", "-m", best, "-i", src, "-o", hyp, *([way] if way else []))
        assert result.exit_code == 0, result.output
        of_output = json.loads(cli("eval", "--hyp", hyp, "--ref", ref, "--json").stdout)
        result = cli(
            "eval", "-m", best, "--src", src, "--ref", ref, "--json", *([way] if way else [])
        )
        assert result.exit_code == 0, result.output
        of_model = json.loads(result.stdout)
        for metric in ("bleu", "chrf", "ter"):
            assert of_model[metric]["score"] == of_output[metric]["score"], (way, metric)
        written[way] = hyp.read_text()
    assert written["--split"] != written["--no-split"]  # the two ways differ on these lines
    assert written[None] == written["--split"]  # the checkpoint's decode.split is on
