"""Lexically constrained beam search: every required target phrase appears in the output.

Dynamic beam allocation (Post & Vilar, 2018), in the vectorized form of Hu et al.
(2019): each step's candidates are the N*2 best extensions of the beams, each beam's
best token, every token that would advance a constraint, and each beam's eos (so that a
beam that has met every constraint can end even where eos is not its best token; eos
is forbidden to the others); a candidate's *bank* is the number of constraint tokens its
output has met; the N beams are filled from the banks in turn (the best candidate of the
fullest bank, then of the next, ..., then the second best of each), so hypotheses that
have met more constraints are never crowded out by likelier ones that have met fewer.

A constraint is one or more alternative phrases (token ids), any one of which must
appear, contiguous, anywhere in the output; phrases may be met in any order, and one
that is partly met and then abandoned starts over. Each sentence's phrases form one
Aho-Corasick automaton (a trie with failure links), so a phrase that starts again in
the middle of a failed match ("a a b" in "a a a b") is still found. All sentences'
automata are one table of nodes, so that a batch of sentences with different
constraints (none, one, several) moves in one tensor operation per step.

The search itself is `beam.beam_search` with `BankedCandidates` as its choice of
candidates: prefixes, n-best, no-repeat n-grams (a constraint may repeat an n-gram),
ensembles and length limits work as in plain beam search.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mtkit.core.hypothesis import Hypothesis
from mtkit.core.search_options import DEFAULTS, MAX_CONSTRAINTS, SearchOptions
from mtkit.core.vocab import EOS
from mtkit.search.beam import Candidates, StepModel, beam_search, best_extensions, padded

Phrase = list[int]  # a target phrase's ids
Constraint = list[Phrase]  # alternatives: any one of them meets the constraint


@dataclass(frozen=True)
class Automaton:
    """One sentence's constraints as an Aho-Corasick automaton over the tokens of its
    phrases; node 0 is the root (nothing matched). Lists are indexed by node."""

    moves: list[dict[int, int]]  # token -> next node, where it is not back to the root
    advance: list[list[int]]  # tokens that keep or start a match: those of `moves`
    depth: list[int]  # tokens of the phrase(s) matched at the node
    # bit mask: constraints a match at the node can lead to, with a phrase ending under
    # it in the trie or under a node of its failure chain (a shorter match it holds)
    below: list[int]
    outputs: list[int]  # bit mask: constraints met on reaching the node
    weights: list[int]  # per constraint: its shortest phrase's length (its bank share)


def automaton(constraints: list[Constraint]) -> Automaton:
    """The automaton of one sentence's constraints (at most `MAX_CONSTRAINTS`)."""
    if len(constraints) > MAX_CONSTRAINTS:
        raise ValueError(
            f"at most {MAX_CONSTRAINTS} constraints per sentence, got {len(constraints)}"
        )
    children: list[dict[int, int]] = [{}]
    parent, depth, ends = [0], [0], [0]
    for c, phrases in enumerate(constraints):
        for phrase in phrases:
            node = 0
            for token in phrase:
                if token not in children[node]:
                    children[node][token] = len(children)
                    children.append({})
                    parent.append(node)
                    depth.append(depth[node] + 1)
                    ends.append(0)
                node = children[node][token]
            ends[node] |= 1 << c
    below = list(ends)
    for node in range(len(children) - 1, 0, -1):  # a child's id is above its parent's
        below[parent[node]] |= below[node]
    moves, outputs, fail = _goto(children, ends)
    for node in _breadth_first(children):  # a node's failure node comes before it
        if fail[node]:  # (the root's own mask is every constraint: it leads nowhere yet)
            below[node] |= below[fail[node]]
    advance = [list(m) for m in moves]  # children, failure moves, restarts from the root
    weights = [min((len(p) for p in phrases), default=0) for phrases in constraints]
    return Automaton(moves, advance, depth, below, outputs, weights)


def _breadth_first(children: list[dict[int, int]]) -> list[int]:
    """The trie's nodes but the root, breadth first."""
    queue = list(children[0].values())
    for node in queue:
        queue.extend(children[node].values())
    return queue


def _goto(
    children: list[dict[int, int]], ends: list[int]
) -> tuple[list[dict[int, int]], list[int], list[int]]:
    """The automaton's moves (node, token -> node, all but those back to the root),
    each node's outputs and its failure node, built breadth first."""
    alphabet = sorted({t for c in children for t in c})
    fail, outputs = [0] * len(children), list(ends)
    moves: list[dict[int, int]] = [dict(children[0])] + [{} for _ in children[1:]]
    for node in _breadth_first(children):  # a node's failure node is done before it
        outputs[node] |= outputs[fail[node]]
        for token in alphabet:
            child = children[node].get(token)
            if child is None:
                target = moves[fail[node]].get(token, 0)
            else:
                target = child
                fail[child] = moves[fail[node]].get(token, 0)
            if target:
                moves[node][token] = target
    return moves, outputs, fail


@dataclass(frozen=True)
class Tables:
    """All sentences' automata as one table of nodes (`automaton`'s lists, padded), on
    the search's device. N nodes, M moves, E advancing tokens, C constraints."""

    move_token: Tensor  # (N, M) padded with -1
    move_next: Tensor  # (N, M)
    advance: Tensor  # (N, E) padded with -1
    root: Tensor  # (N,) the root of the node's sentence
    depth: Tensor  # (N,)
    below: Tensor  # (N,) int64 bit masks
    outputs: Tensor  # (N,) int64 bit masks
    roots: Tensor  # (B,) each sentence's root
    want: Tensor  # (B,) int64: the mask of all of its constraints
    weights: Tensor  # (B, C) each constraint's bank share, padded with 0


def tables(constraints: list[list[Constraint]], device: torch.device) -> Tables:
    """The tables of a batch's constraints (one list per sentence, possibly empty)."""
    autos = [automaton(c) for c in constraints]
    starts = [0]
    for a in autos:
        starts.append(starts[-1] + len(a.depth))
    moves = [
        (list(m), [starts[s] + n for n in m.values()]) for s, a in enumerate(autos) for m in a.moves
    ]
    advance = [row for a in autos for row in a.advance]
    width = max([len(t) for t, _ in moves] + [len(r) for r in advance] + [1])
    count = max([len(c) for c in constraints] + [1])

    flat = {
        name: torch.tensor([v for a in autos for v in getattr(a, name)], dtype=torch.long)
        for name in ("depth", "below", "outputs")
    }
    return Tables(
        move_token=padded([t for t, _ in moves], -1, width).to(device),
        move_next=padded([n for _, n in moves], 0, width).to(device),
        advance=padded(advance, -1, width).to(device),
        root=torch.tensor([starts[s] for s, a in enumerate(autos) for _ in a.depth], device=device),
        **{name: value.to(device) for name, value in flat.items()},
        roots=torch.tensor(starts[:-1], device=device),
        want=torch.tensor([(1 << len(c)) - 1 for c in constraints], device=device),
        weights=padded([a.weights for a in autos], 0, count).to(device),
    )


def move(t: Tables, node: Tensor, met: Tensor, token: Tensor) -> tuple[Tensor, Tensor]:
    """Each hypothesis' state after it outputs `token`: node (c,), met (c,) masks."""
    hit = t.move_token[node] == token[:, None]  # (c, M)
    target = t.move_next[node].gather(1, hit.long().argmax(dim=1, keepdim=True)).squeeze(1)
    node = torch.where(hit.any(dim=1), target, t.root[node])  # (c,)
    return node, met | t.outputs[node]


def banks(t: Tables, node: Tensor, met: Tensor, sentence: Tensor) -> Tensor:
    """(c,) constraint tokens met: each met constraint's share (its shortest phrase's
    length), and the tokens matched so far towards one that is not met yet, counted up
    to one less than the smallest share of the unmet constraints they lead to (a match
    along a longer alternative never counts for more than meeting the constraint)."""
    bits = (met[:, None] >> torch.arange(t.weights.size(1), device=met.device)) & 1  # (c, C)
    weights = t.weights[sentence]  # (c, C)
    full = (bits * weights).sum(dim=1)  # (c,)
    ahead = (t.below[node][:, None] >> torch.arange(weights.size(1), device=met.device)) & 1
    ahead = ahead.bool() & ~bits.bool()  # (c, C): unmet constraints the match leads to
    cap = torch.where(ahead, weights, torch.iinfo(torch.long).max).min(dim=1).values - 1
    return full + torch.where(ahead.any(dim=1), torch.minimum(t.depth[node], cap), 0)


def advancing(t: Tables, node: Tensor, met: Tensor) -> Tensor:
    """(rows, E) the tokens that bring each row nearer an unmet constraint, -1 else."""
    tokens = t.advance[node]  # (rows, E)
    rows, e = tokens.shape
    after, _ = move(
        t, node.repeat_interleave(e), met.repeat_interleave(e), tokens.clamp(min=0).view(-1)
    )
    useful = (t.below[after] & ~met.repeat_interleave(e)).view(rows, e) != 0  # (rows, E)
    deeper = t.depth[after].view(rows, e) > 0
    return tokens.masked_fill(~(useful & deeper) | (tokens < 0), -1)


class BankedCandidates:
    """`beam.Choice` for constrained beam search (dynamic beam allocation). It holds
    each beam's automaton state: its node, the mask of constraints it has met, and
    whether its last token completed one. `inside_word` (V,) marks the tokens that
    continue a word (no word-start marker): none may follow a completed phrase, so that
    a phrase is met as whole words ("Busch" never becomes "Buscher")."""

    def __init__(self, t: Tables, beam: int, inside_word: Tensor | None = None):
        self.t, self.beam = t, beam
        self.inside_word = None if inside_word is None else inside_word.nonzero().view(1, -1)
        self.sentence = torch.arange(t.roots.numel(), device=t.roots.device)  # (b,)
        self.node = t.roots.repeat_interleave(beam)  # (b*N,)
        self.met = torch.zeros_like(self.node)  # (b*N,)
        self.closed = torch.zeros_like(self.node, dtype=torch.bool)  # (b*N,)
        self._advancing: Tensor | None = None  # the beams' advancing tokens, once asked

    @property
    def advancing(self) -> Tensor:
        """(b*N, E) each beam's tokens that advance an unmet constraint, padded with -1:
        computed once per step, when first asked."""
        if self._advancing is None:
            self._advancing = advancing(self.t, self.node, self.met)
        return self._advancing

    def exempt(self, width: int) -> Tensor:
        return self.advancing[:: self.beam // width]  # (b*width, E)

    def choose(self, scores: Tensor, lprobs: Tensor, at_limit: Tensor) -> Candidates:
        cand_scores, beams, tokens, states = self._ranked_candidates(scores, lprobs, at_limit)
        pick = self._open(tokens, scores.size(1))  # (b, N)
        node, met, closed = (x.gather(1, pick) for x in states)  # (b, N)
        self.node, self.met, self.closed = (x.reshape(-1) for x in (node, met, closed))
        self._advancing = None
        return Candidates(cand_scores, beams, tokens, pick)

    def keep(self, sentences: Tensor) -> None:
        rows = (
            sentences[:, None] * self.beam + torch.arange(self.beam, device=sentences.device)
        ).view(-1)
        self.sentence = self.sentence[sentences]
        self.node, self.met, self.closed = self.node[rows], self.met[rows], self.closed[rows]
        if self._advancing is not None:
            self._advancing = self._advancing[rows]

    def _ranked_candidates(
        self, scores: Tensor, lprobs: Tensor, at_limit: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor]]:
        """The candidates' scores, source beams and tokens (b, K) in fill order, and the
        automaton state each would reach: node, met mask, whether it completed a
        constraint, (b, K) each."""
        b, n = scores.shape
        if lprobs.size(0) < b * n:  # the first step: one row for the N same beams
            lprobs = lprobs.repeat_interleave(n, dim=0)  # (b*N, V)
        vocab = lprobs.size(1)
        want = self.t.want[self.sentence].repeat_interleave(n)  # (b*N,)
        lprobs[(self.met != want) & ~at_limit, EOS] = float("-inf")  # finish only when met
        if self.inside_word is not None and self.closed.any():
            self._whole_words(lprobs)
        cand_scores, flat = _candidates(scores, lprobs, self.advancing)
        beams, tokens = flat // vocab, flat % vocab  # (b, K)
        rows = (torch.arange(b, device=scores.device)[:, None] * n + beams).view(-1)
        node, met = move(self.t, self.node[rows], self.met[rows], tokens.view(-1))  # (b*K,)
        sentence = self.sentence.repeat_interleave(flat.size(1))  # (b*K,)
        unmet = (met != self.t.want[sentence]).view(b, -1)
        cand_scores = cand_scores.masked_fill((tokens == EOS) & unmet, float("-inf"))
        order = allocate(cand_scores, banks(self.t, node, met, sentence).view(b, -1))
        closed = met != self.met[rows]  # (b*K,): this token completed a constraint
        states = tuple(x.view(b, -1).gather(1, order) for x in (node, met, closed))
        return (
            cand_scores.gather(1, order),
            beams.gather(1, order),
            tokens.gather(1, order),
            states,
        )

    def _whole_words(self, lprobs: Tensor) -> None:
        """Forbid (in place) tokens inside a word right after a completed phrase, but
        those that advance another phrase, and on rows that have one token left (a
        target prefix's)."""
        rows = self.closed.nonzero().squeeze(1)  # (r,)
        rows = rows[torch.isfinite(lprobs[rows]).sum(dim=1) > 1]  # (r',): not forced
        kept = lprobs[rows[:, None], self.advancing[rows].clamp(min=0)]  # (r', E)
        lprobs[rows[:, None], self.inside_word] = float("-inf")
        adv = self.advancing[rows]
        lprobs[rows[:, None], adv.clamp(min=0)] = torch.where(
            adv >= 0, kept, lprobs[rows[:, None], adv.clamp(min=0)]
        )

    @staticmethod
    def _open(cand_tokens: Tensor, beam: int) -> Tensor:
        """(b, N) the first N candidates in fill order that do not end in eos."""
        k = cand_tokens.size(1)
        at = torch.arange(k, device=cand_tokens.device).expand_as(cand_tokens)  # (b, K)
        key = torch.where(cand_tokens == EOS, at + k, at)  # the first N that go on
        return key.topk(beam, dim=1, largest=False).indices  # (b, N), in fill order


def _candidates(scores: Tensor, lprobs: Tensor, adv: Tensor) -> tuple[Tensor, Tensor]:
    """Each sentence's candidates: scores (b, K) and beam * V + token (b, K), from
    scores (b, N), lprobs (b*N, V) and each beam's advancing tokens (b*N, E): the 2N
    best, each beam's best, each beam's eos, each beam's advancing tokens; a candidate
    in two of these lists once."""
    b, n = scores.shape
    vocab = lprobs.size(1)
    beam_of = torch.arange(n, device=scores.device) * vocab  # (N,)
    own, own_tokens = best_extensions(scores, lprobs)  # (b, N, k): a beam's best first
    own_keys = beam_of[:, None] + own_tokens  # (b, N, k)
    top_scores, top = own.view(b, -1).topk(min(2 * n, own[0].numel()), dim=-1)  # (b, 2N)
    eos_scores = scores + lprobs[:, EOS].view(b, n)  # (b, N)
    adv_scores = lprobs.gather(1, adv.clamp(min=0)).masked_fill(adv < 0, float("-inf"))
    adv_scores = (adv_scores.view(b, n, -1) + scores.unsqueeze(-1)).view(b, -1)  # (b, N*E)
    flat = torch.cat(
        [
            own_keys.view(b, -1).gather(1, top),
            own_keys[:, :, 0],
            (beam_of + EOS).expand(b, n),
            (beam_of[:, None] + adv.clamp(min=0).view(b, n, -1)).view(b, -1),
        ],
        dim=1,
    )  # (b, K)
    cand_scores = torch.cat([top_scores, own[:, :, 0], eos_scores, adv_scores], dim=1)
    return _without_duplicates(cand_scores, flat), flat


def _without_duplicates(scores: Tensor, keys: Tensor) -> Tensor:
    """scores (b, K) with every repeat of a key (b, K) but its best set to -inf: one
    candidate can come from two lists (the best, and one that advances a constraint)."""
    by_score = scores.argsort(dim=1, descending=True, stable=True)  # (b, K)
    sorted_keys, by_key = keys.gather(1, by_score).sort(dim=1, stable=True)  # best first
    repeat = torch.zeros_like(sorted_keys, dtype=torch.bool)
    repeat[:, 1:] = sorted_keys[:, 1:] == sorted_keys[:, :-1]
    where = by_score.gather(1, by_key)  # (b, K): each sorted key's place in `scores`
    return scores.masked_fill(torch.zeros_like(repeat).scatter(1, where, repeat), float("-inf"))


def allocate(scores: Tensor, bank: Tensor) -> Tensor:
    """(b, K) the order in which candidates fill the beam: the best of the fullest
    bank, the best of the next fullest, ..., then each bank's second best, and so on;
    candidates of score -inf last."""
    k = scores.size(1)
    by_score = scores.argsort(dim=1, descending=True, stable=True)  # (b, K)
    ranked = bank.gather(1, by_score)  # (b, K) banks, best score first
    count = int(ranked.max()) + 1 if ranked.numel() else 1
    seen = torch.nn.functional.one_hot(ranked, count).cumsum(dim=1)  # (b, K, banks)
    rank = seen.gather(2, ranked.unsqueeze(-1)).squeeze(-1) - 1  # (b, K) within its bank
    key = rank * count + (count - 1 - ranked)  # round robin, fullest bank first
    dead = ~torch.isfinite(scores.gather(1, by_score))
    key = torch.where(dead, k * count + torch.arange(k, device=scores.device), key)
    return by_score.gather(1, key.argsort(dim=1, stable=True))


@torch.no_grad()
def constrained_beam_search(
    model: StepModel,
    src: Tensor,
    constraints: list[list[Constraint]],
    options: SearchOptions = DEFAULTS,
    *,
    min_len: int = 1,
    prefixes: list[list[int]] | None = None,
    inside_word: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """src (B, S) and each sentence's constraints -> its `options.nbest` best hypotheses that
    meet all of them, best first: none where no hypothesis met them within the length
    limit (the caller decides what then: `engines.pytorch` falls back to plain beam
    search and says so). `inside_word` (V,): the tokens that may not follow a
    completed phrase (`BankedCandidates`); None: any may."""
    choice = BankedCandidates(tables(constraints, src.device), options.beam, inside_word)
    return beam_search(
        model,
        src,
        options,
        min_len=min_len,
        prefixes=prefixes,
        choice=choice,
    )
