"""Inputs that are pipes (process substitution `<(...)`, a FIFO): read once, as files are;
they were refused as "no such file"."""

from __future__ import annotations

import os
import threading

from faultkit import assert_one_line, cli, snapshot


def fifo_with(path, text: str) -> threading.Thread:
    """A FIFO at `path` that a thread fills with `text` once a reader opens it."""
    os.mkfifo(path)

    def write() -> None:
        with open(path, "w", encoding="utf-8") as f:  # blocks until the reader opens
            f.write(text)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return writer


def test_eval_reads_its_references_from_a_pipe(tmp_path):
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("a dog runs in the green park\ntwo men talk on a bench\n")
    writer = fifo_with(
        tmp_path / "ref.fifo", "a dog runs in the green park\ntwo men talk on a bench\n"
    )
    result = cli("eval", "--hyp", hyp, "--ref", tmp_path / "ref.fifo", "--metrics", "bleu")
    writer.join(timeout=10)
    assert result.exit_code == 0, result.output
    assert "BLEU = 100.00" in result.stdout


def test_translate_reads_its_prefix_file_from_a_pipe(work):
    best = work / "run" / "checkpoints" / "best.pt"
    writer = fifo_with(work / "prefix.fifo", "Ein\n\n")
    result = cli(
        "translate",
        "-m",
        best,
        "--prefix-file",
        work / "prefix.fifo",
        input="A dog runs.\nTwo men.\n",
    )
    writer.join(timeout=10)
    assert result.exit_code == 0, result.output
    first, second = result.stdout.split("\n")[:2]
    assert first.split()[0] == "Ein" and second


def test_a_folder_given_as_a_text_file_is_one_line(tmp_path):
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("a\n")
    assert_one_line(
        cli("eval", "--hyp", hyp, "--ref", tmp_path), says="is a folder, not a text file"
    )


def test_a_corpus_given_as_a_pipe_is_refused_with_the_reason(work):
    """It used to say "no pairs left after cleaning": counting its lines used the pipe up."""
    os.mkfifo(work / "train.fifo")  # never opened: the refusal comes before any read
    before = snapshot(work / "run")
    assert_one_line(
        cli(
            "preprocess", "-c", work / "exp.yaml", "--set", f"data.train.src={work / 'train.fifo'}"
        ),
        says="train.fifo is a pipe or a device, not a file: a corpus is read more than once",
    )
    assert snapshot(work / "run") == before
