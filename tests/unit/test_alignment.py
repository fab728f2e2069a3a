from __future__ import annotations

import pytest
import torch

from mtkit.core.config import ModelConfig
from mtkit.core.errors import OptionError
from mtkit.core.hypothesis import pharaoh
from mtkit.data.batching import collate
from mtkit.model.transformer import build_model
from mtkit.search.alignment import (
    align,
    check_layer,
    cross_attention,
    default_layer,
    word_index,
    word_links,
)


def test_subwords_map_to_the_words_they_belong_to():
    assert word_index(["▁A", "▁do", "g", "▁runs", "."]) == [0, 1, 1, 2, 2]
    assert word_index(["ab", "c", "▁d"]) == [0, 0, 1]  # no marker on the first piece
    assert word_index(["▁", ",", "▁x"]) == [0, 0, 1]
    assert word_index([]) == []


def test_each_target_subword_links_its_most_attended_source_word():
    attention = torch.tensor(
        [
            [0.7, 0.2, 0.1, 0.0],  # target subword 0 -> source subword 0
            [0.1, 0.1, 0.8, 0.0],  # 1 -> 2
            [0.1, 0.6, 0.3, 0.0],  # 2 -> 1
            [0.0, 0.0, 0.0, 1.0],
        ]
    )  # a padding row beyond the output
    links = word_links(attention, ["▁a", "▁b", "c"], ["▁x", "y", "▁z"])
    assert links == ((0, 0), (1, 0), (1, 1))  # unique, sorted (source word, target word)
    assert pharaoh(links) == "0-0 1-0 1-1"
    assert word_links(attention, [], ["▁x"]) == () and pharaoh(()) == ""


def test_links_are_read_both_ways_and_symmetrized_with_grow_diag():
    attention = torch.tensor(
        [
            [0.7, 0.1, 0.1, 0.1],  # w -> a
            [0.1, 0.7, 0.1, 0.1],  # x -> b
            [0.1, 0.1, 0.7, 0.1],  # y -> c
            [0.4, 0.1, 0.1, 0.3],  # z -> a: a stray link far from the others
        ]
    )  # and each column's most attending row: a -> w, b -> x, c -> y, d -> z
    words = ["▁a", "▁b", "▁c", "▁d"], ["▁w", "▁x", "▁y", "▁z"]
    # the stray link is dropped (no agreed link beside it), d-z kept (grown from c-y)
    assert word_links(attention, *words) == ((0, 0), (1, 1), (2, 2), (3, 3))


def test_bare_space_pieces_neither_link_nor_are_linked_to():
    attention = torch.tensor(
        [
            [0.9, 0.1, 0.0],  # "▁" (target): no link of its own
            [0.6, 0.4, 0.0],  # "x" -> "b", not the bare "▁" it prefers
            [0.2, 0.1, 0.7],
        ]
    )  # "▁y" -> "▁c"
    assert word_links(attention, ["▁", "b", "▁c"], ["▁", "x", "▁y"]) == ((0, 0), (1, 1))
    assert word_links(attention[:1, :1], ["▁"], ["▁z"]) == ((0, 0),)


def tiny(layers: int = 3):
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=16,
        heads=2,
        ffn_dim=32,
        encoder_layers=1,
        decoder_layers=layers,
        dropout=0.0,
        max_positions=32,
    )
    return build_model(cfg, 30, 30).eval()


def test_cross_attention_is_a_distribution_over_real_source_tokens_only():
    model = tiny()
    batch = collate([([5, 6, 7, 8], [9, 10]), ([5, 6], [9, 10, 11])])
    weights = cross_attention(model, batch.src, batch.tgt_in, layer=1)  # (B, T, S)
    assert weights.shape == (2, 4, 5)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4), atol=1e-5)
    assert weights[1, :, 3:].abs().max() == 0  # the short source's padding
    alone = collate([([5, 6], [9, 10, 11])])
    assert torch.allclose(
        cross_attention(model, alone.src, alone.tgt_in, 1)[0], weights[1, :, :3], atol=1e-5
    )
    assert not torch.allclose(cross_attention(model, batch.src, batch.tgt_in, 0), weights)
    assert all(
        a.observer is None
        for layer in model.decoder_layers
        for a in (layer.self_attn, layer.cross_attn)
    )


def test_the_default_layer_is_the_last_or_a_guided_models_and_others_are_checked():
    assert default_layer(tiny(3)) == 2 and default_layer(tiny(1)) == 0
    assert default_layer(tiny(3), guided=True) == 1 and default_layer(tiny(1), guided=True) == 0
    check_layer(2, [tiny(3)])
    with pytest.raises(OptionError, match=r"must be 0 \(the model has 1 decoder layer\)"):
        check_layer(1, [tiny(3), tiny(1)])


def test_align_gives_word_links_within_each_pair():
    model = tiny()
    links = align(
        [model, model],
        [[5, 6, 7], [8]],
        [[9, 10, 11], []],
        [["▁a", "b", "▁c"], ["▁d"]],
        [["▁x", "▁y", "z"], []],
        None,
        torch.device("cpu"),
    )
    assert links[1] == ()
    assert links[0] and {t for _, t in links[0]} <= {0, 1} and {s for s, _ in links[0]} <= {0, 1}


def test_links_read_the_searchs_own_encoding_and_the_encoder_runs_once(tiny_engine, monkeypatch):
    """With links asked for, the search's memory of a batch is the links' pass's: the
    encoder runs once per batch, and the links are those a pass of its own finds."""
    from dataclasses import replace

    from mtkit.core.search_options import SearchOptions

    opts = SearchOptions(beam=2, alignments=True)
    lines = ["A dog runs in the park.", "Two men sit.", "A girl."]
    model = tiny_engine.models[0]
    encode, calls = type(model).encode, []

    def counted(self, src):
        calls.append(src.shape)
        return encode(self, src)

    monkeypatch.setattr(type(model), "encode", counted)
    reused = tiny_engine.translate(lines, opts)
    assert len(calls) == 1
    calls.clear()
    apart = tiny_engine.translate(lines, replace(opts, nbest=2))  # (n-best: encoded again)
    assert len(calls) == 2
    assert [h[0].alignment for h in reused] == [h[0].alignment for h in apart]
    assert all(h[0].alignment for h in reused)
