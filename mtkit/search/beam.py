"""Offline decoding: greedy and batched beam search over `model.decode_step` (pure).

The decoding choices of greedy and beam search (beam size, length penalty, maximum and
minimum length, n-best, no-repeat n-grams, forced target prefixes) live here, sampling in
`mtkit.search.sampling`; the model only scores one step. Sentences x beams run as one tensor of
B*N rows; the decoder cache (the model's value: a `cache.BeamCache` for a
`Transformer`) is reordered with one `index_select` per step, and sentences that finish
leave the batch, so later steps do less work. The source side (memory, its mask, its
attention keys/values) is held once per sentence, never per beam.

Any `StepModel` can be searched: the tests drive it with scripted step functions, and
`ensemble.Ensemble` makes several models one. Greedy decoding for a server, where
sentences join and leave a running search, is `mtkit.serving.stream`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from mtkit.core.hypothesis import Hypothesis, length_penalty
from mtkit.core.search_options import DEFAULTS, SearchOptions
from mtkit.core.vocab import BOS, EOS, PAD
from mtkit.model.loss import fp32_log_softmax


class StepModel(Protocol):
    """What search needs of a model: `cfg.max_positions`, `encode`, and `decode_step`
    whose token holds W consecutive rows per sentence of memory and whose cache (any
    value: the model's) has `index_select(rows, sentences=None)`. The logits it returns
    are the search's to overwrite (`step_log_probs` turns them into log-probabilities in
    place): a new tensor, not one the model keeps.

    A model may also say how a search's batch takes shape step by step (`step_shapes`):
    see `StepShapes`."""

    cfg: Any

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]: ...  # (B, S, D), (B, S)

    def decode_step(
        self, token: Tensor, memory: Tensor | None, src_mask: Tensor, cache: Any
    ) -> tuple[Tensor, Any]: ...  # memory: None once in `cache`


def max_lengths(src_mask: Tensor, a: float, b: int, limit: int) -> Tensor:
    """Per-sentence output limit a * src_len + b, capped by the model's positions: (B,).
    A huge `a` or `b` means "as long as the model's positions allow"; capped before any
    float or int64 conversion, which would overflow and wrap to a tiny limit."""
    a, b = min(a, limit), min(b, limit)  # beyond the positions, all values mean the same
    src_len = src_mask.sum(dim=1).double()  # (B,)
    return (a * src_len + b).floor().clamp(min=1, max=limit - 1).long()  # (B,)


def ban_repeated_ngrams(
    lprobs: Tensor, history: Tensor, n: int, exempt: Tensor | None = None
) -> None:
    """Forbid (in place) every token that would complete an n-gram already in its row's
    history: lprobs (rows, V), history (rows, t) of the tokens output so far. `exempt`
    (rows, E), padded with -1: tokens never forbidden (a constraint's next tokens: a
    required phrase may repeat an n-gram)."""
    t = history.size(1)
    if n < 1 or t < n:  # no complete n-gram yet
        return
    windows = history.unfold(1, n, 1)  # (rows, t-n+1, n): every n-gram so far
    suffix = history[:, t - (n - 1) :]  # (rows, n-1): the n-gram so far
    seen = (windows[:, :, : n - 1] == suffix[:, None, :]).all(dim=-1)  # (rows, W)
    rows, at = seen.nonzero(as_tuple=True)
    tokens = windows[rows, at, n - 1]  # (hits,)
    if exempt is not None:
        free = ~(exempt[rows] == tokens[:, None]).any(dim=1)  # (hits,)
        rows, tokens = rows[free], tokens[free]
    lprobs[rows, tokens] = float("-inf")


def padded(rows: list[list[int]], fill: int = PAD, width: int | None = None) -> Tensor:
    """Lists of ids as one (R, W) tensor on the CPU, each row filled up with `fill` to
    `width` (default: the longest row's length). The one way id lists become a tensor:
    source batches (`mtkit.engines.pytorch`), prefixes, constraint tables."""
    width = max(map(len, rows), default=0) if width is None else width
    table = [list(r) + [fill] * (width - len(r)) for r in rows]
    return torch.tensor(table, dtype=torch.long).view(len(rows), width)  # (R, W)


def prefix_table(prefixes: list[list[int]] | None, device: torch.device) -> Tensor | None:
    """Target prefixes (one id list per sentence, possibly empty) as (B, L) padded with
    pad, or None when no sentence has one."""
    if not prefixes or not any(prefixes):
        return None
    return padded(prefixes).to(device)  # (B, L)


def _with_prefix_room(limits: Tensor, prefix: Tensor | None, max_positions: int) -> Tensor:
    """Output limits (B,) that leave room for each prefix and the eos after it."""
    if prefix is None:
        return limits
    need = (prefix != PAD).sum(dim=1) + 1  # (B,)
    return torch.maximum(limits, need).clamp(max=max_positions - 1)


def start_search(
    model: StepModel,
    src: Tensor,
    prefixes: list[list[int]] | None,
    max_len_a: float,
    max_len_b: int,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """Encode the source: memory (B, S, D), its mask (B, S), the prefix table (B, L) or
    None, and each sentence's output limit (B,), with room for its prefix."""
    memory, src_mask = model.encode(src)  # (B, S, D), (B, S)
    prefix = prefix_table(prefixes, src.device)  # (B, L) or None
    limits = _with_prefix_room(
        max_lengths(src_mask, max_len_a, max_len_b, model.cfg.max_positions),
        prefix,
        model.cfg.max_positions,
    )  # (B,)
    return memory, src_mask, prefix, limits


def _forced(prefix: Tensor | None, sentences: Tensor, step: int) -> Tensor | None:
    """(rows,) the prefix token each row must output at `step` (pad: none), or None."""
    if prefix is None or step >= prefix.size(1):
        return None
    return prefix[sentences, step]


def step_log_probs(
    model: StepModel,
    token: Tensor,
    memory: Tensor | None,
    src_mask: Tensor,
    cache: Any,
    step: int | Tensor,
    limits: Tensor,
    min_len: int,
    history: Tensor | None = None,
    no_repeat_ngram: int = DEFAULTS.no_repeat_ngram,
    forced: Tensor | None = None,
    exempt: Tensor | None = None,
) -> tuple[Tensor, Any]:
    """Next-token log-probabilities (rows, V) with the decoding constraints applied:
    never pad or bos, no eos before `min_len` tokens, no repeated n-gram of size
    `no_repeat_ngram` (given the rows' `history`), only eos once a row's limit is hit.
    Rows with a `forced` token (a target prefix) can only take it, at its own score;
    `exempt` tokens (rows, E) are never n-gram-banned (`ban_repeated_ngrams`). `step`
    is the tokens output so far: one count for all rows, or one per row (rows,).

    A model with `columns` (`output_columns`) scores only those tokens: its
    log-probabilities are (rows, A), column j being token columns[j], which never holds
    pad or bos; such a model takes no prefixes and no n-gram bans (which name tokens)."""
    columns = output_columns(model)
    logits, cache = model.decode_step(token, memory, src_mask, cache)  # (rows, V)
    # (rows, V) is the largest tensor of a step, and the logits are not needed after it:
    # they become the log-probabilities in place (bf16 ones cast once: 22 MB less at the
    # peak of 700 rows x 8,000 than `log_softmax(dtype=float32)`)
    lprobs = fp32_log_softmax(logits)  # (rows, V)
    del logits
    if columns is None:
        eos = EOS
        lprobs[:, PAD] = float("-inf")
        lprobs[:, BOS] = float("-inf")
    else:
        if forced is not None or (no_repeat_ngram and history is not None):
            raise ValueError(
                "a model that scores only some tokens takes no prefixes or n-gram bans"
            )
        eos = model.eos_column
    if forced is not None:
        rows = (forced != PAD).nonzero().squeeze(1)  # rows inside their prefix
        kept = lprobs[rows, forced[rows]]  # (rows',)
    if no_repeat_ngram and history is not None:
        ban_repeated_ngrams(lprobs, history, no_repeat_ngram, exempt)
    if isinstance(step, Tensor):  # each row at its own step (a stream): no host read
        lprobs[:, eos].masked_fill_(step < min_len, float("-inf"))
    elif step < min_len:
        lprobs[:, eos] = float("-inf")
    at_limit = step >= limits  # (rows,)
    # A row at its limit may only end. A GPU does this without asking first whether any
    # row is there (the answer is a wait for the device); a CPU asks, as the answer is
    # free and the fill a pass over all the log-probabilities.
    if lprobs.device.type != "cpu" or at_limit.any():
        lprobs.masked_fill_(at_limit[:, None], float("-inf"))
        lprobs[:, eos].masked_fill_(at_limit, 0.0)
    if forced is not None and rows.numel():
        lprobs[rows] = float("-inf")
        lprobs[rows, forced[rows]] = kept
    return lprobs, cache


class StepShapes(Protocol):
    """How a search's batch takes shape from step to step: the model's `step_shapes`
    (`step_shapes`). Two kinds: `GrowingShapes`, every model's unless it says otherwise,
    and `captured.FixedShapes`, the fixed shapes that captured steps on a GPU replay in."""

    fixed: bool  # whether every step of a batch has the same shapes, until rows leave

    def cache(self, cache: Any, longest: int) -> Any:
        """The cache to step on after the first step, for outputs of up to `longest`
        tokens."""
        ...

    def rows_leave(self, done: int, rows: int) -> bool:
        """Whether the `done` (at least one) of the batch's `rows` read as done leave the
        batch now, or stay in it, masked."""
        ...


class GrowingShapes:
    """The batch as it comes: the cache grows by a column each step, and rows leave as
    soon as the host reads them done, so that each step does only the work left."""

    fixed = False

    def cache(self, cache: Any, longest: int) -> Any:
        return cache

    def rows_leave(self, done: int, rows: int) -> bool:
        return True


GROWING = GrowingShapes()


def step_shapes(model: StepModel) -> StepShapes:
    """How a search of `model` shapes its batch: the model's `step_shapes` (a
    `captured.CapturedDecoder`, an `Ensemble` of them, or either shortlisted, steps in
    `captured.FixedShapes`), else `GROWING`. The outputs are the same either way."""
    return getattr(model, "step_shapes", GROWING)


def output_columns(model: StepModel) -> Tensor | None:
    """The token id of each column of the model's logits (A,), sorted, where it scores
    only some tokens (`shortlist.Shortlisted(compact=True)`: its `columns` and
    `eos_column`); None where column i is token i."""
    return getattr(model, "columns", None)


def greedy_search(
    model: StepModel,
    src: Tensor,
    options: SearchOptions = DEFAULTS,
    *,
    min_len: int = 1,
    prefixes: list[list[int]] | None = None,
) -> list[list[int]]:
    """src (B, S) -> for each sentence the argmax output ids, without bos/eos; an output
    starts with its sentence's prefix, when given. Of `options` it reads the length
    limits and no-repeat n-grams (`greedy_hypotheses`)."""
    return [
        hyps[0].tokens
        for hyps in greedy_hypotheses(model, src, options, min_len=min_len, prefixes=prefixes)
    ]


@torch.no_grad()
def greedy_hypotheses(
    model: StepModel,
    src: Tensor,
    options: SearchOptions = DEFAULTS,
    *,
    min_len: int = 1,
    prefixes: list[list[int]] | None = None,
    read_every: int | None = None,
) -> list[list[Hypothesis]]:
    """Greedy decoding (the most likely token at each step, until eos) with each output
    scored as a beam search scores it: src (B, S) -> one `Hypothesis` per sentence. Of
    `options` it reads the length penalty and limits and no-repeat n-grams (not the beam);
    `prefixes`: a target prefix per sentence (ids). The length penalty only scores;
    unlike a beam of one, it never keeps a sentence going past the eos it chose.
    `read_every`: `one_per_row`'s."""
    memory, src_mask, prefix, limits = start_search(
        model, src, prefixes, options.max_len_a, options.max_len_b
    )
    out, log_prob = one_per_row(
        model,
        memory,
        src_mask,
        prefix,
        limits,
        1,
        min_len,
        options.no_repeat_ngram,
        lambda lprobs, alive, step: lprobs.argmax(dim=-1),
        read_every=read_every,
    )
    return as_hypotheses(out, log_prob, 1, options.lenpen)


def one_per_row(
    model: StepModel,
    memory: Tensor,
    src_mask: Tensor,
    prefix: Tensor | None,
    limits: Tensor,
    samples: int,
    min_len: int,
    no_repeat_ngram: int,
    pick: Callable[[Tensor, Tensor, int], Tensor],
    *,
    read_every: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Decode one output per row (greedy, sampling) for B sentences (memory (B, S, D),
    limits (B,)): R = B * `samples` rows, consecutive per sentence. `pick(lprobs (r, V),
    alive (r,), step) -> (r,)` chooses each step's tokens (their columns, where the
    model scores only some: `output_columns`). Rows leave the batch as they end.
    Returns the outputs (R, L), padded, and their log-probabilities (R,).

    As in `beam_search`, the host reads which rows have ended every `read_every` steps
    (a GPU's `READ_EVERY_ON_GPU`, a CPU's 1), ended rows going on masked until then (what
    they output after their eos is cut, and adds nothing to their log-probability), and
    leave as the model's `step_shapes` let them."""
    sentences, device = memory.size(0), memory.device
    rows = sentences * samples
    longest = int(limits.max())  # read once: no row goes past it
    out = torch.full((rows, longest + 1), PAD, dtype=torch.long, device=device)
    log_prob = torch.zeros(rows, device=device)  # (R,)
    # The first step runs one row per sentence (its samples are identical until then),
    # then the cache is copied to the sample rows: as in beam search, each source's
    # cross-attention keys/values are projected once, not once per sample.
    token = torch.full((sentences,), BOS, dtype=torch.long, device=device)  # (B,)
    first = _forced(prefix, torch.arange(sentences, device=device), 0)  # (B,) or None
    lprobs, cache = step_log_probs(
        model, token, memory, src_mask, None, 0, limits, min_len, forced=first
    )
    if samples > 1:
        copy = torch.arange(sentences, device=device).repeat_interleave(samples)  # (R,)
        lprobs, limits, src_mask = lprobs[copy], limits[copy], src_mask[copy]
        cache = cache.index_select(copy, copy)
    shapes = step_shapes(model)
    cache = shapes.cache(cache, longest)
    read_every = read_every or (READ_EVERY_ON_GPU if device.type == "cuda" else 1)
    alive = torch.arange(rows, device=device)  # row of the shrinking batch -> row
    ended = torch.zeros(rows, dtype=torch.bool, device=device)  # (r,) masked until read
    step = 0
    columns = output_columns(model)
    while True:
        column = pick(lprobs, alive, step)  # (r,)
        gained = lprobs.gather(1, column[:, None]).squeeze(1)  # (r,)
        log_prob[alive] += gained.masked_fill(ended, 0.0)
        token = column if columns is None else columns[column]  # (r,)
        out[alive, step] = token  # an ended row's: after its eos, cut
        ended |= token == EOS
        step += 1
        if step % read_every == 0 or step > longest:
            count = int(ended.sum())
            if count == ended.numel():
                return out, log_prob
            if count and shapes.rows_leave(count, ended.numel()):  # they leave
                keep = (~ended).nonzero().squeeze(1)  # (r',)
                alive, token, src_mask, ended = (
                    alive[keep],
                    token[keep],
                    src_mask[keep],
                    ended[keep],
                )
                cache = cache.index_select(keep, keep)
        # memory None: the cache holds the source's keys/values from the first step
        lprobs, cache = step_log_probs(
            model,
            token,
            None,
            src_mask,
            cache,
            step,
            limits[alive],
            min_len,
            out[alive, :step] if no_repeat_ngram else None,
            no_repeat_ngram,
            _forced(prefix, alive // samples, step),
        )  # (r, V)


def strip_specials(ids: list[int]) -> list[int]:
    """Cut at the first eos and drop padding."""
    if EOS in ids:
        ids = ids[: ids.index(EOS)]
    return [i for i in ids if i != PAD]


class Choice(Protocol):
    """How beam search picks each step's candidates (`TopCandidates`: the N best by score;
    `constraints.BankedCandidates`: dynamic beam allocation over constraint banks). A
    choice may hold a state per beam; `choose` moves it to the beams it picks and `keep`
    drops finished sentences, so no call depends on another having come first."""

    def exempt(self, width: int) -> Tensor | None:
        """Tokens (rows, E), padded with -1, that no-repeat n-grams must not forbid in
        the coming step, for `width` rows per sentence (1 at the first step, else N);
        None: none. A question about the current beams: it changes nothing."""

    def choose(self, scores: Tensor, lprobs: Tensor, at_limit: Tensor) -> Candidates:
        """scores (b, N), lprobs (b*W, V), at_limit (b*N,) -> the step's `Candidates`;
        the choice's own state follows the picked ones. W is N, or 1 at the first step,
        whose N beams are the same (the first has score 0, the others -inf). lprobs is
        the step's own: it may be written in place."""

    def keep(self, sentences: Tensor) -> None:
        """Keep only the sentences (b',) (indices into the b now searched)."""


class Candidates(NamedTuple):
    """A step's candidates for each of b sentences, in the order beams are filled: their
    scores, source beams and tokens (b, K) each; an eos among the first N finishes a
    hypothesis (a -inf score never does). `pick` (b, N): the candidates (indices into K)
    that go on as the next beams."""

    scores: Tensor
    beams: Tensor
    tokens: Tensor
    pick: Tensor


TOPK_BLOCK = 64  # columns per block of `row_topk`


def row_topk(x: Tensor, k: int, block: int = TOPK_BLOCK) -> tuple[Tensor, Tensor]:
    """The k largest values of each row of x (rows, V), best first, and their columns:
    what `x.topk(k, dim=-1)` gives (the same values; which of two equal values comes
    first may differ), without searching all V columns. Each block of `block` columns
    is summed up by its maximum, and a row's k largest values all lie in its k blocks of
    largest maxima (a block holding one of them has a maximum at least as large, and
    fewer than k blocks have a larger one), so only those k x `block` columns, and the
    columns after the last whole block, are searched. Faster than `topk` over a
    vocabulary's columns: the largest search step of beam search after the model."""
    rows, width = x.shape
    blocks = width // block
    if blocks < 4 * k:  # too few blocks to leave many out
        return x.topk(k, dim=-1)
    whole = blocks * block
    maxima = x[:, :whole].view(rows, blocks, block).amax(dim=-1)  # (rows, blocks)
    chosen = maxima.topk(k, dim=-1, sorted=False).indices  # (rows, k)
    cols = (chosen[:, :, None] * block + torch.arange(block, device=x.device)).view(
        rows, k * block
    )  # (rows, k*block)
    if whole < width:  # the last, partial block is always searched
        tail = torch.arange(whole, width, device=x.device).expand(rows, -1)
        cols = torch.cat([cols, tail], dim=1)
    values, at = x.gather(1, cols).topk(k, dim=-1)  # (rows, k)
    return values, cols.gather(1, at)


def best_extensions(
    scores: Tensor, lprobs: Tensor, beam: int | None = None
) -> tuple[Tensor, Tensor]:
    """Each beam's own k = min(2N, V) best extensions, best first: their scores (the
    beam's score plus the token's log-prob) and tokens, (b, W, k) each, from scores
    (b, W) and lprobs (b*W, V), for a beam size N (default W). A sentence's 2N best
    extensions of all W x V are among them, so the beams' scores are never added to all
    (b*W, V) log-probabilities."""
    b, n = scores.shape
    k = min(2 * (beam or n), lprobs.size(-1))
    best, tokens = row_topk(lprobs, k)  # (b*W, k)
    return scores.unsqueeze(-1) + best.view(b, n, k), tokens.view(b, n, k)


class TopCandidates:
    """Plain beam search's choice: the 2N best extensions of each sentence's N beams,
    best first; the N best that do not end in eos go on. Taking 2N guarantees N
    candidates that do not end in eos whenever any remain."""

    def __init__(self, columns: Tensor | None = None):
        self.columns = columns  # the token of each log-prob column (`output_columns`)

    def exempt(self, width: int) -> None:
        return None

    def candidates(
        self, scores: Tensor, lprobs: Tensor, at_limit: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """scores (b, N), lprobs (b*W, V) -> the 2N best extensions' scores, source
        beams and tokens (b, 2N) each, best first."""
        b, beam = scores.shape
        n = lprobs.size(0) // b  # N, or 1 at the first step: only the first beam is live
        if n < beam and n * lprobs.size(1) < 2 * beam:  # < 2N tokens: all N beams give some
            lprobs, n = lprobs.repeat_interleave(beam // n, dim=0), beam
        own, tokens = best_extensions(scores[:, :n], lprobs, beam)  # (b, n, k) each
        k = own.size(-1)
        cand_scores, flat = own.view(b, n * k).topk(min(2 * beam, n * k), dim=-1)  # (b, 2N)
        tokens = tokens.view(b, n * k).gather(1, flat)  # (b, 2N)
        return cand_scores, flat // k, tokens if self.columns is None else self.columns[tokens]

    def open(self, cand_scores: Tensor, cand_tokens: Tensor, beam: int) -> Tensor:
        """(b, N) the N best candidates that do not end in eos, best first."""
        open_scores = cand_scores.masked_fill(cand_tokens == EOS, float("-inf"))  # (b, 2N)
        return open_scores.topk(beam, dim=-1).indices  # (b, N), best first

    def choose(self, scores: Tensor, lprobs: Tensor, at_limit: Tensor) -> Candidates:
        cand_scores, beams, tokens = self.candidates(scores, lprobs, at_limit)
        return Candidates(
            cand_scores, beams, tokens, self.open(cand_scores, tokens, scores.size(1))
        )

    def keep(self, sentences: Tensor) -> None:
        pass


READ_EVERY_ON_GPU = 8  # steps between the host's reads of which sentences are done


@torch.no_grad()
def beam_search(
    model: StepModel,
    src: Tensor,
    options: SearchOptions = DEFAULTS,
    *,
    min_len: int = 1,
    prefixes: list[list[int]] | None = None,
    choice: Choice | None = None,
    read_every: int | None = None,
) -> list[list[Hypothesis]]:
    """src (B, S) -> for each sentence its `options.nbest` best hypotheses, best first
    (fewer, or none, where `choice` leaves no way to finish: a constrained search). Of
    `options` it reads the beam size, the length penalty and limits, n-best and
    no-repeat n-grams; `prefixes`: a target prefix per sentence (ids).

    A hypothesis ends when eos is among the N candidates of its sentence that `choice`
    (default `TopCandidates`: the N best) takes. A sentence is done, and leaves the
    batch, once no open beam can beat its `nbest` best finished hypotheses (or at its
    maximum length): the output is what a search that waits for N finished hypotheses
    would give, in fewer steps.

    The bookkeeping stays on the device (`Finished`, `_sentences_done`): the host reads
    which sentences are done every `read_every` steps (and at each length limit), and
    a done sentence's rows are masked until then: on a GPU every `READ_EVERY_ON_GPU`
    steps, so that most steps wait for nothing; on a CPU every step, as decoding a
    masked row costs there what a read does not.

    Done sentences leave as the model's `step_shapes` let them: at once, or in fixed
    shapes (captured steps on a GPU) once at least half of the batch's are done."""
    beam, lenpen, nbest = options.beam, options.lenpen, options.nbest
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be between 1 and the beam size {beam}, got {nbest}")
    columns = output_columns(model)
    if choice is not None and columns is not None:
        raise ValueError("a choice of candidates needs a model that scores every token")
    choice = choice or TopCandidates(columns)
    device, batch = src.device, src.size(0)
    memory, src_mask, prefix, limits = start_search(
        model, src, prefixes, options.max_len_a, options.max_len_b
    )
    read_every = read_every or (READ_EVERY_ON_GPU if device.type == "cuda" else 1)
    finished = Finished(batch, beam, int(limits.max()) + 1, device)
    out: list[list[Hypothesis]] = [[] for _ in range(batch)]
    host_limits = limits.tolist()  # read once: when a sentence reaches its limit
    alive = torch.arange(batch, device=device)  # row block of the batch -> sentence
    alive_host = list(range(batch))
    scores = torch.full((batch, beam), float("-inf"), device=device)  # (B, N)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    history = torch.full((batch * beam, 0), BOS, dtype=torch.long, device=device)  # (B*N, 0)

    # The first step decodes one row per sentence (its N beams are identical until then),
    # and the model's cache is copied to the N beams after it: each beam's cache row is
    # its sentence's one row. memory and src_mask stay one per sentence throughout: the
    # model reads a sentence's N rows against its one source.
    token = torch.full((batch,), BOS, dtype=torch.long, device=device)  # (B,)
    lprobs, cache = step_log_probs(
        model,
        token,
        memory,
        src_mask,
        None,
        0,
        limits,
        min_len,
        None,  # no history yet
        options.no_repeat_ngram,
        _forced(prefix, alive, 0),
        choice.exempt(1),
    )  # (B, V)
    scores, token, history, reorder = _extend(
        choice, finished, alive, scores, history, limits, lprobs, lenpen, 0
    )
    cache = cache.index_select(reorder // beam)
    shapes = step_shapes(model)
    cache = shapes.cache(cache, max(host_limits))
    known_done: set[int] = set()  # sentences read as done that stay, masked
    step = 1
    while True:
        # Sentences that are done stay in the batch, their beams at -inf, until the host
        # reads which they are: every `read_every` steps, and at the step after a
        # sentence's length limit (known on the host), so no row outruns its limit. Then
        # they leave, or stay masked where the model's shapes keep them (`rows_leave`).
        done = _sentences_done(finished, alive, scores, limits, step, nbest, lenpen)  # (b,)
        scores = scores.masked_fill(done.unsqueeze(1), float("-inf"))
        if step % read_every == 0 or step > min(
            host_limits[s] for s in alive_host if s not in known_done
        ):
            gone = done.nonzero().squeeze(1).tolist()
            if gone and not shapes.rows_leave(len(gone), len(alive_host)):  # they stay
                known_done = {alive_host[row] for row in gone}
                gone = []
            if gone:  # they leave the batch
                known_done = set()
                keep = (~done).nonzero().squeeze(1)  # (b',)
                for row, hyps in zip(gone, finished.read(alive[gone]), strict=True):
                    out[alive_host[row]] = hyps[:nbest]
                choice.keep(keep)
                rows = (keep.unsqueeze(1) * beam + torch.arange(beam, device=device)).view(-1)
                alive, scores = alive[keep], scores[keep]
                alive_host = [alive_host[row] for row in keep.tolist()]
                token, history = token[rows], history[rows]
                memory, src_mask = memory[keep], src_mask[keep]  # (b', S, D), (b', S)
                cache = cache.index_select(rows, keep)
            if not alive_host:
                return out
        rows = alive.repeat_interleave(beam)  # each decoded row's sentence
        lprobs, cache = step_log_probs(
            model,
            token,
            memory,
            src_mask,
            cache,
            step,
            limits[rows],
            min_len,
            history,  # (b*N, t)
            options.no_repeat_ngram,
            _forced(prefix, rows, step),
            choice.exempt(beam),
        )  # (b*N, V)
        scores, token, history, reorder = _extend(
            choice, finished, alive, scores, history, limits, lprobs, lenpen, step
        )
        cache = cache.index_select(reorder)
        step += 1


def _extend(
    choice: Choice,
    finished: Finished,
    alive: Tensor,
    scores: Tensor,
    history: Tensor,
    limits: Tensor,
    lprobs: Tensor,
    lenpen: float,
    step: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One step's bookkeeping for b sentences of N beams, from the step's log-probs
    lprobs (b*W, V): `choice` takes the candidates, those that end are recorded as
    finished, and the N picked go on. Returns the new beams' scores (b, N), last tokens
    (b*N,) and histories (b*N, t+1), and the row (b*N,) each comes from, out of the b*N
    beams (at the first step, W = 1: row // N is its sentence's decoded row)."""
    beam = scores.size(1)
    at_limit = step >= limits[alive].repeat_interleave(beam)  # (b*N,)
    cand = choice.choose(scores, lprobs, at_limit)
    finished.add(alive, history, cand, length_penalty(step + 1, lenpen))
    offsets = torch.arange(alive.numel(), device=scores.device).unsqueeze(1) * beam  # (b, 1)
    reorder = (offsets + cand.beams.gather(1, cand.pick)).view(-1)  # (b*N,)
    token = cand.tokens.gather(1, cand.pick).view(-1)  # (b*N,)
    history = torch.cat([history[reorder], token.unsqueeze(1)], dim=1)  # (b*N, t+1)
    return cand.scores.gather(1, cand.pick), token, history, reorder


class Finished:
    """Each sentence's N best finished hypotheses, best first, kept on the device: their
    tokens (B, N, L), lengths, log-probabilities and scores (B, N) each; -inf scores where
    a sentence has fewer. Scores are log-prob / length penalty in float64, as Python
    floats would divide them, so that the order and the bound are those of a list of
    `Hypothesis` kept on the host."""

    def __init__(self, batch: int, beam: int, length: int, device: torch.device):
        self.beam = beam
        self.tokens = torch.full((batch, beam, length), PAD, dtype=torch.long, device=device)
        self.lengths = torch.zeros((batch, beam), dtype=torch.long, device=device)
        self.log_probs = torch.full((batch, beam), float("-inf"), device=device)
        self.scores = torch.full((batch, beam), float("-inf"), dtype=torch.float64, device=device)

    def add(self, sentences: Tensor, history: Tensor, cand: Candidates, penalty: float) -> None:
        """Record the eos candidates ranked among each sentence's N best (of b sentences,
        `sentences` (b,)), from the beams' `history` (b*N, t): merged with the sentence's
        finished ones by score, best first, ties in the order they came (those already
        there, then the new ones by rank); the N best are kept."""
        n, t = self.beam, history.size(1)
        lp = cand.scores[:, :n]  # (b, N)
        ends = (cand.tokens[:, :n] == EOS) & torch.isfinite(lp)  # (b, N)
        rows = torch.arange(sentences.numel(), device=lp.device)  # (b,)
        if lp.device.type == "cpu":  # a read costs a CPU nothing: merge where some end
            rows = ends.any(dim=1).nonzero().squeeze(1)  # (b',)
            if not rows.numel():
                return
            sentences, lp, ends = sentences[rows], lp[rows], ends[rows]
        b = rows.numel()
        new_lp = lp.masked_fill(~ends, float("-inf"))  # (b, N)
        new_scores = new_lp.double() / penalty  # (b, N)
        sources = rows.unsqueeze(1) * n + cand.beams[rows, :n]  # (b, N) rows of history
        new_tokens = torch.full_like(self.tokens[:b], PAD)  # (b, N, L)
        new_tokens[:, :, :t] = history[sources.view(-1)].view(b, n, t)
        scores = torch.cat([self.scores[sentences], new_scores], dim=1)  # (b, 2N)
        order = scores.sort(dim=1, descending=True, stable=True).indices[:, :n]  # (b, N)

        def merged(old: Tensor, new: Tensor) -> Tensor:
            both = torch.cat([old[sentences], new], dim=1)  # (b, 2N, ...)
            index = order.view(b, n, *([1] * (both.dim() - 2))).expand(b, n, *both.shape[2:])
            return both.gather(1, index)

        self.scores[sentences] = scores.gather(1, order)
        self.log_probs[sentences] = merged(self.log_probs, new_lp)
        self.lengths[sentences] = merged(self.lengths, torch.full_like(ends, t, dtype=torch.long))
        self.tokens[sentences] = merged(self.tokens, new_tokens)

    def count(self, sentences: Tensor) -> Tensor:
        """(b,) finished hypotheses of each sentence."""
        return torch.isfinite(self.scores[sentences]).sum(dim=1)

    def read(self, sentences: Tensor) -> list[list[Hypothesis]]:
        """The finished hypotheses of some sentences, best first, on the host."""
        scores = self.scores[sentences].tolist()
        log_probs = self.log_probs[sentences].tolist()
        lengths = self.lengths[sentences].tolist()
        tokens = self.tokens[sentences].tolist()
        return [
            [
                Hypothesis(tokens[i][j][: lengths[i][j]], log_probs[i][j], scores[i][j])
                for j in range(self.beam)
                if scores[i][j] != float("-inf")
            ]
            for i in range(len(scores))
        ]


def _sentences_done(
    finished: Finished,
    alive: Tensor,
    scores: Tensor,
    limits: Tensor,
    step: int,
    nbest: int,
    lenpen: float,
) -> Tensor:
    """(b,) True where no open beam can still enter the sentence's `nbest` best: it has
    `nbest` finished hypotheses and the best open beam, even ending at the longest
    allowed length (log-probs only fall; the penalty only grows), scores below the
    worst of them. Also True once the forced-eos step at the length limit has passed.
    On the device, no host read."""
    best_open = scores.max(dim=1).values  # (b,)
    limit = limits[alive]  # (b,)
    bound = best_open / length_penalty(limit.float() + 1.0, lenpen)  # (b,)
    worst = finished.scores[alive, nbest - 1].to(bound.dtype)  # (b,): -inf where fewer
    full = finished.count(alive) >= nbest  # (b,)
    return (step > limit) | (full & ~(bound > worst))


def as_hypotheses(
    out: Tensor, log_prob: Tensor, per_sentence: int, lenpen: float
) -> list[list[Hypothesis]]:
    """Outputs (R, L) and their log-probabilities (R,), `per_sentence` consecutive rows
    per sentence, as each sentence's hypotheses, best score first."""
    hyps = []
    for ids, lp in zip(out.tolist(), log_prob.tolist(), strict=True):
        tokens = strip_specials(ids)
        hyps.append(Hypothesis(tokens, lp, lp / length_penalty(len(tokens) + 1, lenpen)))
    return [
        sorted(hyps[i : i + per_sentence], key=lambda h: -h.score)
        for i in range(0, len(hyps), per_sentence)
    ]
