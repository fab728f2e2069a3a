"""Decoding: greedy and batched beam search over `model.decode_step` (pure).

All decoding choices (beam size, length penalty, maximum and minimum length, n-best,
no-repeat n-grams, sampling with temperature, top-k and top-p, forced target prefixes)
live here; the model only scores one step. Sentences x beams run as one tensor of
B*N rows; the decoder state is reordered with one `index_select` per step, and
sentences that finish leave the batch, so later steps do less work. The source side
(memory, its mask, its attention keys/values) is held once per sentence, never per beam.

Anything with `encode(src) -> (memory, src_mask)`, `decode_step(token, memory,
src_mask, state) -> (logits, state)` (token: W consecutive rows per sentence of memory;
state with `index_select(rows, sentences=None)`) and `cfg.max_positions` can be
searched: the tests drive it with scripted step functions, and `Ensemble` makes several
models one such step model.

`GreedyStream` is greedy decoding for a server (continuous batching): sentences join the
running search between any two steps and leave it as they end, each in its own slot of
a `cache.SlotCache`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol

import torch
from torch import Tensor

from mtkit.cache import resize
from mtkit.hypothesis import Hypothesis, length_penalty
from mtkit.vocab import BOS, EOS, PAD


class StepModel(Protocol):
    cfg: Any

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]: ...

    def decode_step(self, token: Tensor, memory: Tensor | None, src_mask: Tensor,
                    state: Any) -> tuple[Tensor, Any]: ...  # memory: None once in `state`


def max_lengths(src_mask: Tensor, a: float, b: int, limit: int) -> Tensor:
    """Per-sentence output limit a * src_len + b, capped by the model's positions: (B,).
    A huge `a` or `b` means "as long as the model's positions allow"; capped before any
    float or int64 conversion, which would overflow and wrap to a tiny limit."""
    a, b = min(a, limit), min(b, limit)  # beyond the positions, all values mean the same
    src_len = src_mask.sum(dim=1).double()  # (B,)
    return (a * src_len + b).floor().clamp(min=1, max=limit - 1).long()  # (B,)


def ban_repeated_ngrams(lprobs: Tensor, history: Tensor, n: int) -> None:
    """Forbid (in place) every token that would complete an n-gram already in its row's
    history: lprobs (rows, V), history (rows, t) of the tokens output so far."""
    t = history.size(1)
    if n < 1 or t < n:  # no complete n-gram yet
        return
    windows = history.unfold(1, n, 1)  # (rows, t-n+1, n): every n-gram so far
    suffix = history[:, t - (n - 1):]  # (rows, n-1): the n-gram so far
    seen = (windows[:, :, : n - 1] == suffix[:, None, :]).all(dim=-1)  # (rows, W)
    rows, at = seen.nonzero(as_tuple=True)
    lprobs[rows, windows[rows, at, n - 1]] = float("-inf")


def prefix_table(prefixes: list[list[int]] | None, device: torch.device) -> Tensor | None:
    """Target prefixes (one id list per sentence, possibly empty) as (B, L) padded with
    pad, or None when no sentence has one."""
    if not prefixes or not any(prefixes):
        return None
    table = torch.full((len(prefixes), max(len(p) for p in prefixes)), PAD, dtype=torch.long)
    for i, p in enumerate(prefixes):
        table[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    return table.to(device)  # (B, L)


# Source tokens (with padding) encoded together on a CPU by `GreedyStream`, whose
# sentences join unsorted. Encoding them sorted by length in chunks of about 512 tokens
# took 2.1-2.2 s for 1,771 Multi30k sentences joining in groups of ~22, against 2.5-2.8 s
# unsplit (2-core AMD EPYC; `benchmarks/serve_load.py`'s requests). A GPU takes them whole.
ENCODE_CHUNK_TOKENS = 512


def encode_in_chunks(model: StepModel, src: Tensor) -> tuple[Tensor, Tensor]:
    """`model.encode(src)`; on a CPU, rows of similar length are encoded together, in
    chunks of at most `ENCODE_CHUNK_TOKENS` tokens with padding (the memory and mask
    padded back to src's width, rows in src's order)."""
    rows, width = src.shape
    if src.device.type != "cpu" or rows * width <= ENCODE_CHUNK_TOKENS:
        return model.encode(src)
    lengths = (src != PAD).sum(dim=1)  # (B,)
    order = lengths.argsort(descending=True)
    sorted_lengths = lengths[order].tolist()
    memories, masks, start = [], [], 0
    while start < rows:  # a chunk as wide as its first (longest) row
        longest = max(sorted_lengths[start], 1)
        count = max(1, ENCODE_CHUNK_TOKENS // longest)
        chunk = src.index_select(0, order[start : start + count])[:, :longest]
        memory, src_mask = model.encode(chunk)
        memories.append(torch.nn.functional.pad(memory, (0, 0, 0, width - longest)))
        masks.append(torch.nn.functional.pad(src_mask, (0, width - longest), value=False))
        start += count
    back = order.argsort()  # sorted position of each row
    return torch.cat(memories).index_select(0, back), torch.cat(masks).index_select(0, back)


def _with_prefix_room(limits: Tensor, prefix: Tensor | None, max_positions: int) -> Tensor:
    """Output limits (B,) that leave room for each prefix and the eos after it."""
    if prefix is None:
        return limits
    need = (prefix != PAD).sum(dim=1) + 1  # (B,)
    return torch.maximum(limits, need).clamp(max=max_positions - 1)


def _start(model: StepModel, src: Tensor, prefixes: list[list[int]] | None,
           max_len_a: float, max_len_b: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """Encode the source: memory (B, S, D), its mask (B, S), the prefix table (B, L) or
    None, and each sentence's output limit (B,), with room for its prefix."""
    memory, src_mask = model.encode(src)  # (B, S, D), (B, S)
    prefix = prefix_table(prefixes, src.device)  # (B, L) or None
    limits = _with_prefix_room(max_lengths(src_mask, max_len_a, max_len_b,
                                           model.cfg.max_positions), prefix,
                               model.cfg.max_positions)  # (B,)
    return memory, src_mask, prefix, limits


def _forced(prefix: Tensor | None, sentences: Tensor, step: int) -> Tensor | None:
    """(rows,) the prefix token each row must output at `step` (pad: none), or None."""
    if prefix is None or step >= prefix.size(1):
        return None
    return prefix[sentences, step]


def _step_log_probs(model: StepModel, token: Tensor, memory: Tensor | None,
                    src_mask: Tensor, state: Any, step: int | Tensor, limits: Tensor,
                    min_len: int,
                    history: Tensor | None = None, no_repeat_ngram: int = 0,
                    forced: Tensor | None = None) -> tuple[Tensor, Any]:
    """Next-token log-probabilities (rows, V) with the decoding constraints applied:
    never pad or bos, no eos before `min_len` tokens, no repeated n-gram of size
    `no_repeat_ngram` (given the rows' `history`), only eos once a row's limit is hit.
    Rows with a `forced` token (a target prefix) can only take it, at its own score.
    `step` is the tokens output so far: one count for all rows, or one per row (rows,)."""
    logits, state = model.decode_step(token, memory, src_mask, state)  # (rows, V)
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (rows, V)
    if forced is not None:
        rows = (forced != PAD).nonzero().squeeze(1)  # rows inside their prefix
        kept = lprobs[rows, forced[rows]]  # (rows',)
    lprobs[:, PAD] = float("-inf")
    lprobs[:, BOS] = float("-inf")
    if no_repeat_ngram and history is not None:
        ban_repeated_ngrams(lprobs, history, no_repeat_ngram)
    if isinstance(step, Tensor):  # each row at its own step (`GreedyStream`)
        lprobs[step < min_len, EOS] = float("-inf")
    elif step < min_len:
        lprobs[:, EOS] = float("-inf")
    at_limit = step >= limits  # (rows,)
    if at_limit.any():
        eos_only = torch.full_like(lprobs[0], float("-inf"))
        eos_only[EOS] = 0.0
        lprobs[at_limit] = eos_only
    if forced is not None and rows.numel():
        lprobs[rows] = float("-inf")
        lprobs[rows, forced[rows]] = kept
    return lprobs, state


def greedy_search(model: StepModel, src: Tensor, max_len_a: float = 1.2, max_len_b: int = 10,
                  min_len: int = 1, no_repeat_ngram: int = 0,
                  prefixes: list[list[int]] | None = None) -> list[list[int]]:
    """src (B, S) -> for each sentence the argmax output ids, without bos/eos; an output
    starts with its sentence's prefix, when given."""
    return [hyps[0].tokens for hyps in greedy_hypotheses(model, src, 0.0, max_len_a,
                                                         max_len_b, min_len,
                                                         no_repeat_ngram, prefixes)]


@torch.no_grad()
def greedy_hypotheses(model: StepModel, src: Tensor, lenpen: float = 0.6,
                      max_len_a: float = 1.2, max_len_b: int = 10, min_len: int = 1,
                      no_repeat_ngram: int = 0, prefixes: list[list[int]] | None = None
                      ) -> list[list[Hypothesis]]:
    """Greedy decoding (the most likely token at each step, until eos) with each output
    scored as a beam search scores it: src (B, S) -> one `Hypothesis` per sentence. The
    length penalty only scores; unlike a beam of one, it never keeps a sentence going
    past the eos it chose."""
    memory, src_mask, prefix, limits = _start(model, src, prefixes, max_len_a, max_len_b)
    out, log_prob = _one_per_row(model, memory, src_mask, prefix, limits, 1, min_len,
                                 no_repeat_ngram,
                                 lambda lprobs, alive, step: lprobs.argmax(dim=-1))
    return _hypotheses(out, log_prob, 1, lenpen)


def _one_per_row(model: StepModel, memory: Tensor, src_mask: Tensor, prefix: Tensor | None,
                 limits: Tensor, samples: int, min_len: int, no_repeat_ngram: int,
                 pick: Callable[[Tensor, Tensor, int], Tensor]) -> tuple[Tensor, Tensor]:
    """Decode one output per row (greedy, sampling) for B sentences (memory (B, S, D),
    limits (B,)): R = B * `samples` rows, consecutive per sentence. `pick(lprobs (r, V),
    alive (r,), step) -> (r,)` chooses each step's tokens. Rows leave the batch as they end.
    Returns the outputs (R, L), padded, and their log-probabilities (R,)."""
    sentences, device = memory.size(0), memory.device
    rows = sentences * samples
    out = torch.full((rows, int(limits.max()) + 1), PAD, dtype=torch.long, device=device)
    log_prob = torch.zeros(rows, device=device)  # (R,)
    # The first step runs one row per sentence (its samples are identical until then),
    # then the state is copied to the sample rows: as in beam search, each source's
    # cross-attention keys/values are projected once, not once per sample.
    token = torch.full((sentences,), BOS, dtype=torch.long, device=device)  # (B,)
    first = _forced(prefix, torch.arange(sentences, device=device), 0)  # (B,) or None
    lprobs, state = _step_log_probs(model, token, memory, src_mask, None, 0, limits,
                                    min_len, forced=first)
    if samples > 1:
        copy = torch.arange(sentences, device=device).repeat_interleave(samples)  # (R,)
        lprobs, limits, src_mask = lprobs[copy], limits[copy], src_mask[copy]
        state = state.index_select(copy, copy)
    alive = torch.arange(rows, device=device)  # row of the shrinking batch -> row
    step = 0
    while True:
        token = pick(lprobs, alive, step)  # (r,)
        log_prob[alive] += lprobs.gather(1, token[:, None]).squeeze(1)
        out[alive, step] = token
        step += 1
        done = token == EOS  # (r,)
        if done.any():
            alive, token, src_mask, state = _drop_rows(done, alive, token, src_mask, state)
            if not alive.numel():
                return out, log_prob
        # memory None: the state holds the source's keys/values from the first step
        lprobs, state = _step_log_probs(model, token, None, src_mask, state, step,
                                        limits[alive], min_len,
                                        out[alive, :step] if no_repeat_ngram else None,
                                        no_repeat_ngram,
                                        _forced(prefix, alive // samples, step))  # (r, V)


def _drop_rows(done: Tensor, alive: Tensor, token: Tensor, src_mask: Tensor, state: Any
               ) -> tuple[Tensor, Tensor, Tensor, Any]:
    """Keep only the rows that are not `done` (one output per row, so a row is its own
    sentence to the model: greedy, sampling)."""
    keep = (~done).nonzero().squeeze(1)  # (rows',)
    return alive[keep], token[keep], src_mask[keep], state.index_select(keep, keep)


class GreedyStream:
    """Greedy decoding with continuous batching: sentences `add`ed between any two steps
    join the running batch, and each `step` returns those that ended. A server keeps its
    batch full this way, where fixed rounds wait for their slowest sentence and then
    start small. Each output is the one `greedy_hypotheses` gives its sentence alone.

    The sentences live in the slots of the model's `cache.SlotCache` (`slot_cache`;
    `decode_step` steps its first B slots): one joining or leaving copies no other's
    cache. When sentences end, those in the last slots move into the freed ones, so that
    a step runs live slots only. Beside the cache, the stream keeps each slot's last
    token, output limit, tokens so far, log-probability, output and source mask."""

    def __init__(self, model: StepModel, lenpen: float = 0.6, max_len_a: float = 1.2,
                 max_len_b: int = 10, min_len: int = 1):
        self.model, self.lenpen, self.min_len = model, lenpen, min_len
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self._clear()

    def _clear(self) -> None:
        """No slots, no cache: the memory goes."""
        self.keys: list[Any] = []  # the caller's key of each slot (None: free)
        self.live = 0  # sentences in the slots
        self.cache: Any = None
        self.token: Tensor | None = None  # (slots,) last token
        self.limits: Tensor | None = None  # (slots,) output limit
        self.steps: Tensor | None = None  # (slots,) tokens output so far
        self.log_prob: Tensor | None = None  # (slots,)
        self.out: Tensor | None = None  # (slots, C) output so far
        self.src_mask: Tensor | None = None  # (slots, P) True at real source tokens

    def __len__(self) -> int:
        """Sentences being decoded (in slots 0..len-1: `_compact`)."""
        return self.live

    @property
    def capacity(self) -> tuple[int, int, int]:
        """Slots, target columns C and source positions P, of the cache and the stream."""
        return self.out.size(0), self.out.size(1), self.src_mask.size(1)

    @torch.no_grad()
    def add(self, src: Tensor, keys: list[Any]) -> None:
        """Sentences src (B, S), one key each, join the search at its next step."""
        memory, src_mask = encode_in_chunks(self.model, src)  # (B, S, D), (B, S)
        limits = max_lengths(src_mask, self.max_len_a, self.max_len_b,
                             self.model.cfg.max_positions)  # (B,)
        sources = self.model.cross_kv(memory)  # per layer (B, H, S, K) (per model)
        b, n, width = len(self), src.size(0), src.size(1)
        if self.cache is None:  # caches in the keys' dtype (bf16 under CUDA autocast)
            columns = int(limits.max()) + 1
            self.cache = self.model.slot_cache(sources, n, columns, width)
            self._empty_rows(src.device)
            self._resize_rows(n, columns, width)
        else:
            self._fit(b + n, int(limits.max()) + 1, width)
        free = list(range(b, b + n))  # live slots are 0..b-1 (`_compact`)
        slots = torch.tensor(free, dtype=torch.long, device=src.device)
        self.cache.fill(slots, sources)
        self.src_mask[slots] = False
        self.src_mask[slots, :width] = src_mask
        self.token[slots] = BOS
        self.limits[slots] = limits
        self.steps[slots] = 0
        self.log_prob[slots] = 0.0
        self.out[slots] = PAD
        for slot, key in zip(free, keys, strict=True):
            self.keys[slot] = key
        self.live += n

    def _fit(self, slots: int, columns: int, source: int) -> None:
        """Make the cache hold `slots` sentences of up to `columns` output tokens and
        `source` source tokens, with those live now. It grows with a quarter to spare,
        and shrinks once it is over twice what is needed (as after a long sentence)."""
        b = len(self)
        if b:
            columns = max(columns, int(self.limits[:b].max()) + 1)
            source = max(source, int(self.src_mask[:b].sum(dim=1).max()))
        need = (slots, columns, source)
        if all(n <= h <= 2 * n + 8 for h, n in zip(self.capacity, need, strict=True)):
            return
        new = [n + n // 4 for n in need]
        self.cache = self.cache.resized(*new)
        self._resize_rows(*new)

    def _empty_rows(self, device: torch.device) -> None:
        """Per-slot tensors for no slot yet, for `_resize_rows` to grow."""
        empty = torch.zeros(0, dtype=torch.long, device=device)  # each resized into its own
        self.token = self.limits = self.steps = empty
        self.log_prob = torch.zeros(0, dtype=torch.float, device=device)
        self.out = empty.view(0, 0)
        self.src_mask = torch.zeros(0, 0, dtype=torch.bool, device=device)

    def _resize_rows(self, slots: int, columns: int, source: int) -> None:
        """Per-slot tensors for `slots` slots, outputs of `columns` tokens and sources of
        `source` tokens (what fits is kept)."""
        self.token = resize(self.token, (slots,), BOS)
        self.limits = resize(self.limits, (slots,), 1)
        self.steps = resize(self.steps, (slots,), 0)
        self.log_prob = resize(self.log_prob, (slots,), 0.0)
        self.out = resize(self.out, (slots, columns), PAD)
        self.src_mask = resize(self.src_mask, (slots, source), False)
        self.keys = (self.keys + [None] * slots)[:slots]

    @torch.no_grad()
    def step(self) -> list[tuple[Any, Hypothesis]]:
        """One token for every sentence; those that end leave: (key, hypothesis) each."""
        b = len(self)  # the live slots: 0..b-1 (`_compact`)
        if not b:
            return []
        src_mask = self.src_mask[:b]
        src_mask = src_mask[:, : int(src_mask.sum(dim=1).max())]  # to the longest source
        lprobs, self.cache = _step_log_probs(self.model, self.token[:b], None, src_mask,
                                             self.cache, self.steps[:b], self.limits[:b],
                                             self.min_len)  # (b, V)
        token = lprobs.argmax(dim=-1)  # (b,)
        rows = torch.arange(b, device=token.device)
        self.log_prob[:b] += lprobs[rows, token]
        self.out[rows, self.steps[:b]] = token
        self.steps[:b] += 1
        self.token[:b] = token
        ended = (token == EOS).nonzero().squeeze(1)
        if not ended.numel():
            return []
        hyps = _hypotheses(self.out[ended], self.log_prob[ended], 1, self.lenpen)
        finished = []
        for slot, h in zip(ended.tolist(), hyps, strict=True):
            finished.append((self.keys[slot], h[0]))
            self.keys[slot] = None
        self.live -= len(finished)
        self._compact()
        if len(self):
            self._fit(len(self), 1, 1)
        else:  # nothing left: let the memory go
            self._clear()
        return finished

    def _compact(self) -> None:
        """Live slots at the back move into the free ones at the front, so that steps
        run live slots only."""
        holes = [i for i, k in enumerate(self.keys[: self.live]) if k is None]
        if not holes:
            return
        movers = [i for i, k in enumerate(self.keys) if k is not None and i >= self.live]
        old, new = (torch.tensor(x, dtype=torch.long, device=self.token.device)
                    for x in (movers, holes))
        self.cache.move(old, new)
        for t in (self.token, self.limits, self.steps, self.log_prob, self.out, self.src_mask):
            t[new] = t[old]
        for i, j in zip(movers, holes, strict=True):
            self.keys[j], self.keys[i] = self.keys[i], None


def strip_specials(ids: list[int]) -> list[int]:
    """Cut at the first eos and drop padding."""
    if EOS in ids:
        ids = ids[: ids.index(EOS)]
    return [i for i in ids if i != PAD]


def _choose_candidates(scores: Tensor, lprobs: Tensor, beam: int
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """The 2N best extensions of each sentence's N beams.

    scores (B, N) cumulative log-probs, lprobs (B*N, V) -> candidate scores, source
    beams and tokens, each (B, 2N), best first. Taking 2N guarantees N candidates that
    do not end in eos whenever any remain."""
    b, n = scores.shape
    vocab = lprobs.size(-1)
    total = (scores.unsqueeze(-1) + lprobs.view(b, n, vocab)).view(b, n * vocab)  # (B, N*V)
    k = min(2 * beam, n * vocab)
    cand_scores, flat = total.topk(k, dim=-1)  # (B, 2N)
    return cand_scores, flat // vocab, flat % vocab


@torch.no_grad()
def beam_search(model: StepModel, src: Tensor, beam: int = 5, lenpen: float = 0.6,
                max_len_a: float = 1.2, max_len_b: int = 10, min_len: int = 1,
                nbest: int = 1, no_repeat_ngram: int = 0,
                prefixes: list[list[int]] | None = None) -> list[list[Hypothesis]]:
    """src (B, S) -> for each sentence its `nbest` best hypotheses, best first.

    A hypothesis ends when eos is among the N best candidates of its sentence. A
    sentence is done, and leaves the batch, once no open beam can beat its `nbest` best
    finished hypotheses (or at its maximum length): the output is what a search that
    waits for N finished hypotheses would give, in fewer steps."""
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be between 1 and the beam size {beam}, got {nbest}")
    device = src.device
    batch = src.size(0)
    memory, src_mask, prefix, limits = _start(model, src, prefixes, max_len_a, max_len_b)
    alive = torch.arange(batch, device=device)  # row block of the batch -> sentence
    scores = torch.full((batch, beam), float("-inf"), device=device)  # (B, N)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    history = torch.full((batch * beam, 0), BOS, dtype=torch.long, device=device)  # (B*N, t)
    # The first step runs one row per sentence (its beams are identical until then), and
    # the model's state is copied to the N beams after it. memory and src_mask stay one
    # per sentence: the model reads a sentence's N rows against its one source.
    width = 1  # rows per sentence: 1 for the first step, N after
    token = torch.full((batch,), BOS, dtype=torch.long, device=device)  # (B*width,)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    state = None
    step = 0
    while alive.numel():
        rows_limit = limits[alive].repeat_interleave(width)  # (b*width,)
        lprobs, state = _step_log_probs(model, token, memory, src_mask, state, step,
                                        rows_limit, min_len, history[::beam // width],
                                        no_repeat_ngram,
                                        _forced(prefix, alive.repeat_interleave(width),
                                                step))  # (b*width, V)
        if width == 1:
            lprobs = lprobs.repeat_interleave(beam, dim=0)  # (b*N, V)
        cand_scores, cand_beams, cand_tokens = _choose_candidates(scores, lprobs, beam)
        _collect_finished(finished, alive, history, cand_scores, cand_beams, cand_tokens,
                          beam, lenpen, step)
        # Continue with the N best candidates that did not end in eos.
        open_scores = cand_scores.masked_fill(cand_tokens == EOS, float("-inf"))  # (b, 2N)
        scores, pick = open_scores.topk(beam, dim=-1)  # (b, N)
        source = cand_beams.gather(1, pick)  # (b, N)
        token = cand_tokens.gather(1, pick).view(-1)  # (b*N,)
        offsets = torch.arange(alive.numel(), device=device).unsqueeze(1) * beam  # (b, 1)
        reorder = (offsets + source).view(-1)  # (b*N,)
        history = torch.cat([history[reorder], token.unsqueeze(1)], dim=1)  # (b*N, t+1)
        state = state.index_select(reorder // (beam // width))  # rows of the step's state
        width = beam
        step += 1
        done = _sentences_done(finished, alive, scores, limits, step, nbest, lenpen)  # (b,)
        if done.any():
            keep = (~done).nonzero().squeeze(1)  # (b',)
            rows = (keep.unsqueeze(1) * beam + torch.arange(beam, device=device)).view(-1)
            alive, scores = alive[keep], scores[keep]
            token, history = token[rows], history[rows]
            memory, src_mask = memory[keep], src_mask[keep]  # (b', S, D), (b', S)
            state = state.index_select(rows, keep)
    return [hyps[:nbest] for hyps in finished]


def _collect_finished(finished: list[list[Hypothesis]], alive: Tensor, history: Tensor,
                      cand_scores: Tensor, cand_beams: Tensor, cand_tokens: Tensor,
                      beam: int, lenpen: float, step: int) -> None:
    """Record eos candidates ranked among a sentence's N best as finished hypotheses;
    each sentence keeps its N best finished ones, best first."""
    ends = (cand_tokens[:, :beam] == EOS) & torch.isfinite(cand_scores[:, :beam])  # (b, N)
    if not ends.any():
        return
    penalty = length_penalty(step + 1, lenpen)
    for row, rank in ends.nonzero().tolist():
        sentence = int(alive[row])
        source = row * beam + int(cand_beams[row, rank])
        log_prob = float(cand_scores[row, rank])
        hyps = finished[sentence]
        hyps.append(Hypothesis(history[source].tolist(), log_prob, log_prob / penalty))
        hyps.sort(key=lambda h: -h.score)
        del hyps[beam:]


def _sentences_done(finished: list[list[Hypothesis]], alive: Tensor, scores: Tensor,
                    limits: Tensor, step: int, nbest: int, lenpen: float) -> Tensor:
    """(b,) True where no open beam can still enter the sentence's `nbest` best: it has
    `nbest` finished hypotheses and the best open beam, even ending at the longest
    allowed length (log-probs only fall; the penalty only grows), scores below the
    worst of them. Also True once the forced-eos step at the length limit has passed."""
    best_open = scores[:, 0]  # (b,): beams are kept sorted, best first
    limit = limits[alive]  # (b,)
    bound = best_open / length_penalty(limit.float() + 1.0, lenpen)  # (b,)
    done = step > limit  # (b,)
    for row, sentence in enumerate(alive.tolist()):
        hyps = finished[sentence]
        if len(hyps) >= nbest and not bool(bound[row] > hyps[nbest - 1].score):
            done[row] = True
    return done


# --- sampling --------------------------------------------------------------------------


def sampling_logits(lprobs: Tensor, temperature: float = 1.0, topk: int = 0,
                    topp: float = 1.0) -> Tensor:
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
    return [torch.Generator().manual_seed((seed * 1_000_003 + j) % (1 << 63))
            for seed in seeds for j in range(samples)]


@torch.no_grad()
def sample_search(model: StepModel, src: Tensor, seeds: list[int], samples: int = 1,
                  temperature: float = 1.0, topk: int = 0, topp: float = 1.0,
                  lenpen: float = 0.6, max_len_a: float = 1.2, max_len_b: int = 10,
                  min_len: int = 1, no_repeat_ngram: int = 0,
                  prefixes: list[list[int]] | None = None) -> list[list[Hypothesis]]:
    """src (B, S) -> for each sentence `samples` outputs drawn from the model (each token
    from `sampling_logits`, by inverse CDF), best score first. `seeds` (B,): one per
    sentence. A hypothesis' log_prob is the model's own (before temperature and
    cut-offs)."""
    memory, src_mask, prefix, limits = _start(model, src, prefixes, max_len_a, max_len_b)
    # Each row's uniform numbers, one per step it may take, drawn at once from its own
    # generator: (R, L), padded. A row's numbers depend on its sentence alone.
    steps = (limits + 1).repeat_interleave(samples).tolist()  # (R,)
    uniforms = torch.nn.utils.rnn.pad_sequence(
        [torch.rand(n, generator=g) for g, n in zip(sentence_generators(seeds, samples),
                                                    steps, strict=True)],
        batch_first=True).clamp_(min=1e-12).to(src.device)  # (R, L)

    def draw(lprobs: Tensor, alive: Tensor, step: int) -> Tensor:
        """Inverse-CDF draws of the rows `alive` at `step`."""
        cdf = sampling_logits(lprobs, temperature, topk, topp).softmax(dim=-1).cumsum_(-1)
        u = uniforms[alive, step] * cdf[:, -1]  # (r,), scaled to the total's rounding
        token = torch.searchsorted(cdf, u[:, None]).squeeze(1)  # (r,)
        return token.clamp_(max=cdf.size(1) - 1)

    out, log_prob = _one_per_row(model, memory, src_mask, prefix, limits, samples, min_len,
                                 no_repeat_ngram, draw)
    return _hypotheses(out, log_prob, samples, lenpen)


def _hypotheses(out: Tensor, log_prob: Tensor, per_sentence: int, lenpen: float
                ) -> list[list[Hypothesis]]:
    """Outputs (R, L) and their log-probabilities (R,), `per_sentence` consecutive rows
    per sentence, as each sentence's hypotheses, best score first."""
    hyps = []
    for ids, lp in zip(out.tolist(), log_prob.tolist(), strict=True):
        tokens = strip_specials(ids)
        hyps.append(Hypothesis(tokens, lp, lp / length_penalty(len(tokens) + 1, lenpen)))
    return [sorted(hyps[i : i + per_sentence], key=lambda h: -h.score)
            for i in range(0, len(hyps), per_sentence)]


# --- ensembles -------------------------------------------------------------------------


@dataclass(frozen=True)
class EnsembleState:
    """The decoder state of each model of an ensemble (each keeps its own cache)."""

    states: tuple[Any, ...]

    def index_select(self, rows: Tensor, sentences: Tensor | None = None) -> EnsembleState:
        return EnsembleState(tuple(s.index_select(rows, sentences) for s in self.states))


class Ensemble:
    """Several models that share their vocabularies, searched as one step model: at each
    step the next-token log-probabilities are the mean of the models' log-probabilities
    (a log-linear ensemble, renormalized by the search), each model with its own cache.

    The models' memories lie side by side on the last axis, (B, S, D1 + D2 + ...), so
    that the search's row operations (repeat, select) move them together; the widths
    come from each model's `cfg.d_model`. One model's output is exactly its own: its
    logits pass through unchanged."""

    def __init__(self, models: list[StepModel]):
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = list(models)
        self.widths = [m.cfg.d_model for m in self.models]
        self.cfg = SimpleNamespace(max_positions=min(m.cfg.max_positions for m in self.models))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        encoded = [m.encode(src) for m in self.models]  # each (B, S, Di), (B, S)
        return torch.cat([memory for memory, _ in encoded], dim=-1), encoded[0][1]

    def decode_step(self, token: Tensor, memory: Tensor | None, src_mask: Tensor,
                    state: EnsembleState | None) -> tuple[Tensor, EnsembleState]:
        memories = (memory.split(self.widths, dim=-1) if memory is not None  # (rows, S, Di)
                    else (None,) * len(self.models))  # after the first step
        states = state.states if state is not None else (None,) * len(self.models)
        outputs = [m.decode_step(token, mem, src_mask, s)
                   for m, mem, s in zip(self.models, memories, states, strict=True)]
        new_state = EnsembleState(tuple(s for _, s in outputs))
        if len(outputs) == 1:
            return outputs[0][0], new_state
        total = torch.log_softmax(outputs[0][0].float(), dim=-1)  # (rows, V)
        for logits, _ in outputs[1:]:
            total += torch.log_softmax(logits.float(), dim=-1)
        return total.div_(len(outputs)), new_state  # the mean: (rows, V)
