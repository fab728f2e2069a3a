from __future__ import annotations

import io
import json
import logging
import math
import os
import threading

import pytest
import torch
from scripted import A, B, C, Scripted

from mtkit.config import Config, ModelConfig, TokenizerConfig
from mtkit.decoding import SearchOptions
from mtkit.engines.pytorch import TorchEngine
from mtkit.model import build_model
from mtkit.search import length_penalty
from mtkit.textio import OutputFormat, Request, format_lines, read_chunks, translate_stream
from mtkit.tokenizer import train_sentencepiece
from mtkit.vocab import EOS, Vocab

from conftest import read_lines


@pytest.fixture(scope="module")
def translator() -> TorchEngine:
    vocab = Vocab(train_sentencepiece(read_lines("train.en.gz", 300),
                                      TokenizerConfig(vocab_size=120)))
    torch.manual_seed(0)
    cfg = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, heads=2, ffn_dim=32,
                      dropout=0.0, max_positions=24)
    model = build_model(cfg, len(vocab), len(vocab)).eval()
    return TorchEngine([model], vocab, vocab, torch.device("cpu"), None, Config(model=cfg))


def test_one_output_line_per_input_line_in_order(translator):
    lines = ["A dog.", "", "A man in a blue shirt is standing on a ladder.", "   ", "Hi."]
    opts = SearchOptions(beam=3, max_len_a=1.0, max_len_b=3)
    sink = io.StringIO()
    assert translate_stream(translator, io.BytesIO("\n".join(lines).encode()), sink, opts) == 5
    out = sink.getvalue().split("\n")
    assert len(out) == 6 and out[-1] == "" and out[1] == out[3] == ""
    # The same lines one at a time give the same outputs: order is restored exactly.
    one_by_one = [translator.translate([x], opts)[0][0].tokens for x in lines]
    together = [h[0].tokens for h in translator.translate(lines, opts)]
    assert one_by_one == together


def test_beam_one_is_greedy_decoding(translator):
    # eos is the argmax after A, but A B C A eos scores better under a strong length
    # penalty: a search with a beam of one would go on to it; greedy stops at its eos.
    table = {(): {A: 1.0}, (A,): {EOS: 0.6, B: 0.4}, (A, B): {C: 1.0}, (A, B, C): {A: 1.0},
             (A, B, C, A): {EOS: 1.0}}

    class ScriptedTranslator(TorchEngine):
        step_model = Scripted(table)

    scripted = ScriptedTranslator(translator.models, translator.src_vocab,
                                  translator.tgt_vocab, translator.device, None,
                                  translator.config)
    (hyp,), _ = scripted.translate(["A dog.", ""], SearchOptions(beam=1, lenpen=2.0))
    assert hyp.tokens == [A]
    assert hyp.score == pytest.approx(math.log(0.6) / length_penalty(2, 2.0))
    (longer,), _ = scripted.translate(["A dog.", ""], SearchOptions(beam=2, lenpen=2.0))
    assert longer.tokens == [A, B, C, A]


def test_overlong_lines_are_truncated_with_one_warning(translator, caplog):
    long = " ".join(["A man in a blue shirt is standing on a ladder."] * 10)
    opts = SearchOptions(beam=2, max_len_a=0.0, max_len_b=5)
    with caplog.at_level(logging.WARNING, logger="mtkit.engines.base"):
        out = translator.translate([long, long, "A dog."], opts)
        translator.translate([long], opts)
    assert len(out) == 3 and all(len(h) == 1 for h in out)
    warnings = [r for r in caplog.records if "truncated" in r.getMessage()]
    assert len(warnings) == 1 and "input lines longer than 23 subwords" in warnings[0].getMessage()
    # A target prefix is cut too, leaving room for eos, with a warning of its own.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mtkit.engines.base"):
        (hyp,) = translator.translate(["A dog."], opts, prefixes=[long])[0]
    cut = translator.tgt_vocab.encode([long])[0][:22]
    assert hyp.tokens[:22] == cut and len(hyp.tokens) <= 23  # within the positions
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "target prefixes longer than 22 subwords are truncated"]


def test_invalid_utf8_is_replaced_not_fatal():
    chunks = list(read_chunks(io.BytesIO(b"ok\n\xff\xfe bad\nlast")))
    assert chunks == [["ok", "\ufffd\ufffd bad"], ["last"]]


def test_lines_are_translated_as_soon_as_they_arrive():
    read_fd, write_fd = os.pipe()
    reader = os.fdopen(read_fd, "rb")
    chunks = read_chunks(reader)
    os.write(write_fd, b"first line\n")
    got: list = []
    thread = threading.Thread(target=lambda: got.append(next(chunks)))
    thread.start()
    thread.join(timeout=5)
    assert got == [["first line"]]  # no waiting for more input or end of file
    os.write(write_fd, b"second\nthird\n")
    os.close(write_fd)
    assert list(chunks) == [["second", "third"]]
    reader.close()


def test_output_formats(translator):
    hyps = translator.translate(["A dog."], SearchOptions(beam=3, nbest=2, max_len_b=3))[0]
    nbest = format_lines(7, Request("A dog."), hyps, translator.tgt_vocab,
                         SearchOptions(beam=3, nbest=2))
    assert len(nbest) == 2 and all(line.startswith("7 ||| ") for line in nbest)
    scored = format_lines(0, Request("A dog."), hyps[:1], translator.tgt_vocab,
                          SearchOptions(), OutputFormat(scores=True))
    assert scored[0].count("\t") == 1 and float(scored[0].split("\t")[1]) <= 0
    record = json.loads(format_lines(0, Request("A dog."), hyps, translator.tgt_vocab,
                                     SearchOptions(beam=3, nbest=2),
                                     OutputFormat("jsonl"))[0])
    assert record["source"] == "A dog." and len(record["nbest"]) == 2


def test_nbest_larger_than_beam_is_rejected_naming_where_the_beam_came_from():
    from mtkit.config import DecodeConfig
    from mtkit.errors import OptionError

    with pytest.raises(OptionError, match=r"--nbest 6 must not exceed the checkpoint's beam "
                                          r"size 5"):
        SearchOptions.from_config(DecodeConfig(), nbest=6)
    with pytest.raises(OptionError, match=r"--nbest 3 must not exceed --beam 2"):
        SearchOptions.from_config(DecodeConfig(), nbest=3, beam=2)


def test_progress_bar_only_for_long_files_on_a_terminal(tmp_path):
    import io

    from rich.console import Console

    from mtkit.textio import progress_bar

    long, short = tmp_path / "long.txt", tmp_path / "short.txt"
    long.write_text("a line\n" * 400)
    short.write_text("a line\n" * 100)
    screen = io.StringIO()
    with progress_bar(long, Console(file=screen, force_terminal=True, width=120)) as done:
        for _ in range(4):
            done(100)
    assert "400/400" in screen.getvalue() and "sentences/s" in screen.getvalue()
    for path, terminal in ((short, True), (long, False), (None, True)):
        console = Console(file=io.StringIO(), force_terminal=terminal)
        with progress_bar(path, console) as done:
            assert done is None
