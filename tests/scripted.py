"""A scripted step model for search tests: next-token probabilities from a table; small
random models and sources; and a helper that runs a real model's `GreedyStream` with
sentences joining at two steps."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from mtkit.core.config import ModelConfig
from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import EOS, PAD
from mtkit.model.transformer import build_model
from mtkit.search.captured import FixedShapes

A, B, C = 4, 5, 6
V = 8


class Prefixes:
    """Decoder state of the scripted model: the tokens so far, (rows, t)."""

    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens

    def index_select(self, rows: torch.Tensor, sentences=None) -> Prefixes:
        return Prefixes(self.tokens.index_select(0, rows))


class Scripted:
    """A step function from a table: prefix (tuple of ids after bos) -> {id: prob};
    unlisted prefixes put all mass on eos. Records the rows of every step."""

    def __init__(self, table: dict[tuple, dict[int, float]], max_positions: int = 64):
        self.table = table
        self.cfg = SimpleNamespace(max_positions=max_positions, d_model=1)
        self.rows: list[int] = []

    def encode(self, src):
        return torch.zeros(*src.shape, 1), src != PAD

    def decode_step(self, token, memory, src_mask, state):
        # memory (one row per sentence) is needed only until the state holds the source
        assert memory is not None or state is not None
        assert memory is None or memory.size(0) == src_mask.size(0)
        assert token.size(0) % src_mask.size(0) == 0
        self.rows.append(token.size(0))
        tokens = token[:, None] if state is None else torch.cat([state.tokens, token[:, None]], 1)
        logits = torch.full((token.size(0), V), -1e9)
        for r, prefix in enumerate(tokens[:, 1:].tolist()):
            for tok, p in self.table.get(tuple(prefix), {EOS: 1.0}).items():
                logits[r, tok] = math.log(p)
        return logits, Prefixes(tokens)


class InFixedShapes:
    """A model that says it steps in fixed shapes (`beam.step_shapes`), as a
    `CapturedDecoder` does, its steps eager on the search's own cache: the fixed-shape
    search without graphs."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    @property
    def step_shapes(self):
        return FixedShapes(self.model.cfg.max_positions)


def tiny(**kw) -> ModelConfig:
    """A tiny model's config (d_model 16, 2+2 layers), for a vocabulary of 40."""
    base = dict(
        encoder_layers=2,
        decoder_layers=2,
        d_model=16,
        heads=4,
        ffn_dim=32,
        dropout=0.0,
        max_positions=64,
    )
    return ModelConfig(**{**base, **kw})


def batch(seed: int = 0):
    """src (3, 7), two rows padded, and tgt (3, 6), of ids below 40."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (3, 7), generator=g)
    src[1, 4:] = PAD
    src[2, 6:] = PAD
    tgt = torch.randint(4, 40, (3, 6), generator=g)
    return src, tgt


def random_model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(
        d_model=32,
        heads=4,
        ffn_dim=64,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        max_positions=64,
    )
    return build_model(cfg, 40, 40).eval()


def random_src(n: int = 6, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (n, 9), generator=g)
    for i in range(n):
        src[i, 3 + i % 6 :] = PAD
        src[i, 3 + i % 6 - 1] = EOS
    return src


def stream_in_two_joins(
    model, src: torch.Tensor, max_len_a: float, max_len_b: int
) -> tuple[dict, torch.dtype]:
    """Half of src's rows join a `GreedyStream` (lenpen 0.6), the rest one step later:
    each row's hypothesis by row, and the dtype of the stream's caches."""
    from mtkit.serving.stream import GreedyStream

    half = src.size(0) // 2
    options = SearchOptions(lenpen=0.6, max_len_a=max_len_a, max_len_b=max_len_b)
    stream, got = GreedyStream(model, options), {}
    stream.add(src[:half], list(range(half)))
    dtype = stream.cache.self_k[0].dtype
    got.update(stream.step())
    stream.add(src[half:], list(range(half, src.size(0))))
    while len(stream):
        got.update(stream.step())
    return got, dtype
