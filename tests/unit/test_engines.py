"""The engines' shared behaviour (`mtkit.engines`): beam 1 is greedy, overlong input is
truncated with one warning."""

from __future__ import annotations

import logging
import math

import pytest
from scripted import A, B, C, Scripted

from mtkit.decoding import SearchOptions
from mtkit.engines.pytorch import TorchEngine
from mtkit.search import length_penalty
from mtkit.vocab import EOS


def test_beam_one_is_greedy_decoding(tiny_engine):
    # eos is the argmax after A, but A B C A eos scores better under a strong length
    # penalty: a search with a beam of one would go on to it; greedy stops at its eos.
    table = {(): {A: 1.0}, (A,): {EOS: 0.6, B: 0.4}, (A, B): {C: 1.0}, (A, B, C): {A: 1.0},
             (A, B, C, A): {EOS: 1.0}}

    class ScriptedTranslator(TorchEngine):
        step_model = Scripted(table)

    scripted = ScriptedTranslator(tiny_engine.models, tiny_engine.src_vocab,
                                  tiny_engine.tgt_vocab, tiny_engine.device, None,
                                  tiny_engine.config)
    (hyp,), _ = scripted.translate(["A dog.", ""], SearchOptions(beam=1, lenpen=2.0))
    assert hyp.tokens == [A]
    assert hyp.score == pytest.approx(math.log(0.6) / length_penalty(2, 2.0))
    (longer,), _ = scripted.translate(["A dog.", ""], SearchOptions(beam=2, lenpen=2.0))
    assert longer.tokens == [A, B, C, A]


def test_overlong_lines_are_truncated_with_one_warning(tiny_engine, caplog):
    long = " ".join(["A man in a blue shirt is standing on a ladder."] * 10)
    opts = SearchOptions(beam=2, max_len_a=0.0, max_len_b=5)
    with caplog.at_level(logging.WARNING, logger="mtkit.engines.base"):
        out = tiny_engine.translate([long, long, "A dog."], opts)
        tiny_engine.translate([long], opts)
    assert len(out) == 3 and all(len(h) == 1 for h in out)
    warnings = [r for r in caplog.records if "truncated" in r.getMessage()]
    assert len(warnings) == 1 and "input lines longer than 23 subwords" in warnings[0].getMessage()
    # A target prefix is cut too, leaving room for eos, with a warning of its own.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mtkit.engines.base"):
        (hyp,) = tiny_engine.translate(["A dog."], opts, prefixes=[long])[0]
    cut = tiny_engine.tgt_vocab.encode([long])[0][:22]
    assert hyp.tokens[:22] == cut and len(hyp.tokens) <= 23  # within the positions
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "target prefixes longer than 22 subwords are truncated"]
