"""Lexical shortlists: what `build_shortlist` counts, and the step model cut to them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtkit.core.config import ModelConfig
from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import BOS, EOS, PAD, UNK
from mtkit.model import int8
from mtkit.model.transformer import build_model
from mtkit.search.beam import beam_search, greedy_hypotheses
from mtkit.search.shortlist import Shortlist, Shortlisted, build_shortlist


def test_each_source_piece_keeps_its_likeliest_targets_and_every_batch_the_frequent_ones():
    a = np.array
    # source 10 always comes with 20, once with 21; 11 with 22; 30 is in every target
    src = [a([10, 11]), a([10]), a([10, 11]), a([11])]
    tgt = [a([20, 22, 30]), a([20, 21, 30]), a([20, 22, 30]), a([22, 30])]
    shortlist = build_shortlist(src, tgt, 12, 40, per_source=2, frequent=1)
    assert shortlist.frequent.tolist() == [30]
    assert shortlist.table[10].tolist() == [20, 22]  # p = 3/3, then 2/3 (21: 1/3)
    assert shortlist.table[11].tolist() == [22, 20]  # p = 3/3, then 2/3
    assert shortlist.table[5].tolist() == [-1, -1]  # never seen
    batch = torch.tensor([[10, EOS, PAD]])
    assert shortlist.allowed(batch).tolist() == sorted({UNK, EOS, 20, 22, 30})


def test_specials_never_enter_a_source_pieces_list():
    src = [np.array([5])] * 3
    tgt = [np.array([PAD, BOS, 7])] * 3
    assert build_shortlist(src, tgt, 8, 8, per_source=3, frequent=0).table[5].tolist() == [
        7,
        -1,
        -1,
    ]


def _model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(
        encoder_layers=1, decoder_layers=2, d_model=16, heads=2, ffn_dim=32, dropout=0.0
    )
    return build_model(cfg, 60, 60).eval()


def test_a_shortlist_of_every_piece_searches_as_the_full_model():
    model = _model()
    src = torch.randint(4, 60, (3, 7))
    everything = torch.arange(60)
    with torch.inference_mode():
        full = beam_search(model, src)
        cut = beam_search(Shortlisted(model, everything), src)
    assert [[h.tokens for h in n] for n in cut] == [[h.tokens for h in n] for n in full]


def test_compact_logits_search_as_logits_of_every_piece_with_minus_infinity_elsewhere():
    # pieces 5..59 minus a few; pad and bos are never among a batch's pieces
    for model in (_model(1), int8.quantize(_model(1))):
        allowed = torch.tensor([UNK, EOS, *range(5, 60, 2), 58]).unique()  # sorted
        src = torch.randint(4, 60, (4, 6))
        opts = SearchOptions(beam=4, nbest=3, max_len_b=12)
        tokens = lambda found: [[h.tokens for h in n] for n in found]  # noqa: E731
        with torch.inference_mode():
            compact, scattered = (
                Shortlisted(model, allowed, compact=True),
                Shortlisted(model, allowed),
            )
            assert compact.columns is allowed and allowed[compact.eos_column] == EOS
            beams = beam_search(compact, src, opts), beam_search(scattered, src, opts)
            greedy = greedy_hypotheses(compact, src), greedy_hypotheses(scattered, src)
        for ours, theirs in (beams, greedy):
            assert tokens(ours) == tokens(theirs)
            assert all(set(h.tokens) <= set(allowed.tolist()) for n in ours for h in n)
            for a, b in zip(ours, theirs, strict=True):
                assert [h.log_prob for h in a] == pytest.approx([h.log_prob for h in b], abs=1e-4)
        with pytest.raises(ValueError, match="no prefixes"):
            beam_search(compact, src, prefixes=[[7]] * 4)


def test_a_shortlisted_step_scores_its_pieces_as_the_full_step_and_no_others():
    for model in (_model(), int8.quantize(_model())):
        src = torch.randint(4, 60, (2, 5))
        allowed = torch.tensor([EOS, 7, 8, 30, 59])
        memory, mask = model.encode(src)
        token = torch.tensor([BOS, BOS])
        with torch.inference_mode():
            full, _ = model.decode_step(token, memory, mask)
            cut, _ = Shortlisted(model, allowed).decode_step(token, memory, mask, None)
        torch.testing.assert_close(cut[:, allowed], full[:, allowed])
        others = torch.ones(60, dtype=torch.bool)
        others[allowed] = False
        assert torch.isneginf(cut[:, others]).all()


def test_a_shortlist_round_trips_through_its_checkpoint_entry():
    shortlist = Shortlist(torch.tensor([4, 9]), torch.tensor([[5, -1], [6, 7]]))
    entry = {k: v.int() for k, v in shortlist.as_entry().items()}
    back = Shortlist.of_entry(entry)
    assert back.frequent.tolist() == [4, 9] and back.table.tolist() == [[5, -1], [6, 7]]
