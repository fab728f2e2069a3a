"""Sampling: outputs drawn from the model, token by token (pure).

Each token is drawn by inverse CDF from `sampling_logits` (temperature, top-k, top-p),
with each sentence's own seeded generator, so that its draws never depend on the batch it
is in. The decoding loop (one output per row, rows leaving as they end) and the
constraints (length limits, no-repeat n-grams, prefixes) are those of greedy search in
`mtkit.search.beam`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtkit.core.hypothesis import Hypothesis
from mtkit.core.search_options import DEFAULTS, SearchOptions
from mtkit.search.beam import StepModel, as_hypotheses, one_per_row, start_search


def sampling_logits(
    lprobs: Tensor,
    temperature: float = DEFAULTS.temperature,
    topk: int = DEFAULTS.topk,
    topp: float = DEFAULTS.topp,
) -> Tensor:
    """The sampling distribution, as unnormalized log-probabilities (rows, V): the model's
    scaled by 1/temperature, then cut to the `topk` most likely tokens (0: all) and to the
    smallest set of most likely tokens whose probability reaches `topp` (nucleus
    sampling; the most likely token always stays).

    Any temperature above 0 is safe: the scaled values are each token's distance below
    the most likely one, so that one stays at 0 (a tiny temperature is greedy, where a
    plain division left no finite value), a forbidden token stays -inf (a huge one, as
    float32 inf, would make it nan) and the others go to -inf or 0. The most likely
    token is kept by position, never by comparing with `topp` (a float32 subnormal such
    as 1e-38 is 0 where the CPU flushes subnormals)."""
    logits = lprobs  # (rows, V)
    if temperature != 1.0:
        top = lprobs.max(dim=-1, keepdim=True).values  # (rows, 1)
        logits = torch.where(lprobs == top, 0.0, (lprobs - top) / temperature)  # (rows, V)
        logits = logits.masked_fill(lprobs == float("-inf"), float("-inf"))
    if 0 < topk < logits.size(-1):
        kth = logits.topk(topk, dim=-1).values[:, -1:]  # (rows, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if topp < 1.0:
        ranked, order = logits.sort(dim=-1, descending=True)  # (rows, V)
        probs = ranked.softmax(dim=-1)
        beyond = (probs.cumsum(dim=-1) - probs) >= topp  # mass before it already reaches p
        beyond[:, 0] = False  # the most likely token
        logits = logits.masked_fill(beyond.scatter(1, order, beyond), float("-inf"))
    return logits


def sentence_generators(seeds: list[int], samples: int) -> list[torch.Generator]:
    """One CPU generator per sample row, from its sentence's seed and the sample's
    number, so that a sentence's draws never depend on the batch it is in."""
    return [
        torch.Generator().manual_seed((seed * 1_000_003 + j) % (1 << 63))
        for seed in seeds
        for j in range(samples)
    ]


@torch.no_grad()
def sample_search(
    model: StepModel,
    src: Tensor,
    options: SearchOptions = DEFAULTS,
    *,
    seeds: list[int],
    min_len: int = 1,
    prefixes: list[list[int]] | None = None,
) -> list[list[Hypothesis]]:
    """src (B, S) -> for each sentence `options.beam` outputs drawn from the model (each
    token from `sampling_logits`, by inverse CDF), best score first. Of `options` it reads
    the beam (the draws per sentence), temperature, top-k, top-p, the length penalty and
    limits and no-repeat n-grams; `seeds` (B,): one per sentence; `prefixes`: a target
    prefix per sentence (ids). A hypothesis' log_prob is the model's own (before
    temperature and cut-offs)."""
    samples = options.beam
    memory, src_mask, prefix, limits = start_search(
        model, src, prefixes, options.max_len_a, options.max_len_b
    )
    # Each row's uniform numbers, one per step it may take, drawn at once from its own
    # generator: (R, L), padded. A row's numbers depend on its sentence alone.
    steps = (limits + 1).repeat_interleave(samples).tolist()  # (R,)
    uniforms = (
        torch.nn.utils.rnn.pad_sequence(
            [
                torch.rand(n, generator=g)
                for g, n in zip(sentence_generators(seeds, samples), steps, strict=True)
            ],
            batch_first=True,
        )
        .clamp_(min=1e-12)
        .to(src.device)
    )  # (R, L)

    def draw(lprobs: Tensor, alive: Tensor, step: int) -> Tensor:
        """Inverse-CDF draws of the rows `alive` at `step`."""
        cdf = sampling_logits(lprobs, options.temperature, options.topk, options.topp)
        cdf = cdf.softmax(dim=-1).cumsum_(-1)
        u = uniforms[alive, step] * cdf[:, -1]  # (r,), scaled to the total's rounding
        token = torch.searchsorted(cdf, u[:, None]).squeeze(1)  # (r,)
        return token.clamp_(max=cdf.size(1) - 1)

    out, log_prob = one_per_row(
        model,
        memory,
        src_mask,
        prefix,
        limits,
        samples,
        min_len,
        options.no_repeat_ngram,
        draw,
    )
    return as_hypotheses(out, log_prob, samples, options.lenpen)
