"""The CTranslate2 export maps every architecture variant exactly: greedy outputs and
teacher-forced token scores of the converted model equal mtkit's."""

from __future__ import annotations

import pytest
import torch

ct2 = pytest.importorskip("ctranslate2")

from mtkit.core.config import ModelConfig  # noqa: E402
from mtkit.core.search_options import SearchOptions  # noqa: E402
from mtkit.core.vocab import BOS, EOS, PAD  # noqa: E402
from mtkit.interop.ct2_export import model_spec  # noqa: E402
from mtkit.model.transformer import build_model  # noqa: E402
from mtkit.search.beam import greedy_search  # noqa: E402

V = 40
PIECES = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, V)]
NEVER = [["<pad>"], ["<s>"]]  # mtkit's search never outputs pad or bos


def converted(model, folder):
    spec = model_spec(model, PIECES, PIECES)

    class Converter(ct2.converters.Converter):
        def _load(self):
            return spec

    Converter().convert(str(folder), force=True)
    # CTranslate2 sets the process's OpenMP thread count: keep torch's, or later tests
    # that compare in-process training with a subprocess would see other float sums.
    return ct2.Translator(str(folder), device="cpu", intra_threads=torch.get_num_threads())


@pytest.mark.parametrize(
    "norm, positions, activation, shared",
    [
        ("post", "sinusoidal", "relu", True),
        ("pre", "learned", "gelu", False),
        ("post", "learned", "gelu", True),
        ("pre", "sinusoidal", "relu", False),
    ],
)
def test_every_variant_converts_exactly(tmp_path, norm, positions, activation, shared):
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=32,
        heads=4,
        ffn_dim=64,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        max_positions=64,
        norm=norm,
        positions=positions,
        activation=activation,
        share_embeddings=shared,
    )
    model = build_model(cfg, V, V).eval()
    engine = converted(model, tmp_path / "ct2")
    g = torch.Generator().manual_seed(1)
    sources = [torch.randint(4, V, (n,), generator=g).tolist() for n in (3, 7, 5, 9)]
    src = torch.full((4, 10), PAD)
    for i, s in enumerate(sources):
        src[i, : len(s) + 1] = torch.tensor(s + [EOS])
    ours = greedy_search(model, src, SearchOptions(max_len_a=0.0, max_len_b=12))
    theirs = engine.translate_batch(
        [[PIECES[i] for i in s] for s in sources],
        beam_size=1,
        max_decoding_length=12,
        suppress_sequences=NEVER,
    )
    assert [[PIECES.index(p) for p in r.hypotheses[0]] for r in theirs] == ours

    targets = [torch.randint(4, V, (n,), generator=g).tolist() for n in (4, 2, 6, 3)]
    tgt_in = torch.full((4, 7), PAD)
    for i, t in enumerate(targets):
        tgt_in[i, : len(t) + 1] = torch.tensor([BOS] + t)
    with torch.no_grad():
        lprobs = torch.log_softmax(model.decode(tgt_in, *model.encode(src)), dim=-1)  # (B, T, V)
    scored = engine.score_batch(
        [[PIECES[i] for i in s] for s in sources], [[PIECES[i] for i in t] for t in targets]
    )
    for i, t in enumerate(targets):
        expected = [float(lprobs[i, j, tok]) for j, tok in enumerate(t + [EOS])]
        assert scored[i].log_probs == pytest.approx(expected, abs=2e-4)
