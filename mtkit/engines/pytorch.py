"""The PyTorch engine: checkpoints' models behind `mtkit.search.beam`.

`TorchEngine.translate` takes lines, sets empty ones aside (`EngineBase.prepare`), sorts the
rest by length, and runs each batch of at most `batch_tokens` source tokens x beam (the
rows the search carries) through greedy decoding, beam search or sampling;
`mtkit.engines.pytorch_loading` builds one from checkpoint files (several make an
ensemble), in the precision `mtkit.engines.pytorch_precision` puts its models in.

Threads may share an engine (a `mtkit.Translator`, `mtkit serve`'s sessions). Its models
are only read while translating: the measured choices (precision, attention kernel,
captured steps, batch budget) are made at load, a batch's search and alignments keep
their state in the call (the cache a search carries; what an alignment pass watches,
`mtkit.model.attention.watching`), and calls on a CPU run at once, sharing its cores.
What must not be shared is taken one call at a time (`serial`): the helper
processes of `workers` > 1, which translate one call's batches together and are
started once; and captured decoder steps (`graphs`), whose slots hold one search's cache
and whose replays write into fixed tensors.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from mtkit.core.config import Config
from mtkit.core.device import (
    autocast,
    torch_threads,
)
from mtkit.core.errors import OptionError
from mtkit.core.hypothesis import Hypothesis
from mtkit.core.search_options import (
    BATCH_TOKENS,
    Capabilities,
    SearchOptions,
    check_constraints,
    flag,
    worker_threads,
)
from mtkit.core.vocab import EOS, Vocab
from mtkit.engines.base import EngineBase
from mtkit.engines.workers import BatchJob, BatchWorkers
from mtkit.model.transformer import Transformer, count_parameters
from mtkit.search.alignment import align, check_layer
from mtkit.search.beam import StepModel, beam_search, greedy_hypotheses, padded
from mtkit.search.captured import CapturedDecoder
from mtkit.search.compiled import CompiledDecoder
from mtkit.search.constraints import constrained_beam_search
from mtkit.search.ensemble import Ensemble
from mtkit.search.sampling import sample_search
from mtkit.search.shortlist import Shortlist, Shortlisted

log = logging.getLogger(__name__)


@dataclass
class TorchEngine(EngineBase):
    """One model, or an ensemble of models that share their vocabularies."""

    models: list[Transformer]
    src_vocab: Vocab
    tgt_vocab: Vocab
    device: torch.device
    autocast_dtype: torch.dtype | None
    config: Config  # the (first) checkpoint's: decoding defaults in config.decode
    steps: list[int | None] = field(default_factory=list)  # each model's training step
    weights: list[str] = field(default_factory=list)  # what each model's weights are
    # {"precision", "asked", "calibration"?, "attention"?}: what the models run in, fp32
    # (`autocast_dtype` None), bf16 (autocast on CUDA; on a CPU the models' own weights
    # are bf16, `pytorch_precision.bf16_weights`, and `autocast_dtype` is None) or int8
    # (`mtkit.model.int8`), and the attention kernel they run with
    # (`tuning.attention.choose_decoding_attention`)
    precision: dict = field(default_factory=lambda: {"precision": "fp32", "asked": "fp32"})
    shortlist: Shortlist | None = None  # the (first) checkpoint's lexical shortlist
    # Decoder steps as CUDA graphs (`mtkit.search.captured`; `tuning.capture.graph_choice`):
    # each model's steps through its `CapturedDecoder`, whose searches run in fixed shapes
    graphs: bool = False
    # Batches translated at once on a CPU (`mtkit.engines.workers`), from the checkpoint
    # files `sources`; 1: one at a time, in this process
    workers: int = 1
    sources: list[str] = field(default_factory=list)
    # Each model's weights' digest (`Weights.digest`): what a spawned helper checks that
    # it loaded
    digests: list[str] = field(default_factory=list)
    # What a spawned helper calls to load this engine again (picklable:
    # `pytorch_loading.helper_engine`); None: no helper processes
    helper: Callable[..., TorchEngine] | None = None
    _pool: BatchWorkers | None = field(default=None, init=False, repr=False, compare=False)
    # Decoder steps compiled by Inductor on a CPU (`tuning.compile.compile_choice`): each
    # model's steps through a `CompiledDecoder` (`mtkit.search.compiled`)
    compiled: bool = False
    # What steps each model in a search: the model, its `CompiledDecoder`, or with graphs
    # its `CapturedDecoder` (kept: it holds the compiled or captured steps; made with the
    # engine, so that threads that share it never make two)
    steppers: list[Transformer | CompiledDecoder | CapturedDecoder] = field(
        init=False, repr=False, compare=False
    )
    # Held by the one call at a time that uses what threads must not share (`serial`)
    _serial: threading.RLock = field(
        default_factory=threading.RLock, init=False, repr=False, compare=False
    )

    # Everything: sampling, alignments, constraints, and greedy lines stream
    # (`mtkit.serving`), for one model or an ensemble.
    capabilities = Capabilities(
        sampling=True, alignments=True, streaming=True, constraints=True, shortlist=True
    )

    def __post_init__(self) -> None:
        EngineBase.__init__(self)
        self.steppers = [
            CompiledDecoder(m) if self.compiled else CapturedDecoder(m) if self.graphs else m
            for m in self.models
        ]

    @property
    def model(self) -> Transformer:
        """The (first) model."""
        return self.models[0]

    @property
    def step_model(self) -> StepModel:
        """What search runs: the model, or the ensemble of all of them."""
        return self.steppers[0] if len(self.models) == 1 else Ensemble(self.steppers)

    def graph_record(self) -> dict:
        """Decoder steps replayed as graphs and run eagerly so far, over all models."""
        records = [s.record() for s in self.steppers if isinstance(s, CapturedDecoder)]
        return {key: sum(r[key] for r in records) for key in records[0]} if records else {}

    @functools.cached_property
    def inside_word(self) -> torch.Tensor:
        """(V,) the target pieces that continue a word: no word-start marker, and a
        letter or digit first (punctuation may follow a word). A constraint's phrase
        is never followed by one, so that it is met as whole words."""
        pieces = [self.tgt_vocab.piece(i) for i in range(len(self.tgt_vocab))]
        return torch.tensor(
            [p[:1].isalnum() and not p.startswith("\u2581") for p in pieces], device=self.device
        )

    @property
    def max_positions(self) -> int:
        return min(m.cfg.max_positions for m in self.models)

    @property
    def batch_tokens(self) -> int:
        """The batch budget where none is given: sized for the GPU at load, where the
        precision record has one (`tuning.budget.device_batch_tokens`), else decode.batch_tokens."""
        sized = self.precision.get("batch_tokens")
        return sized["tokens"] if sized else self.config.decode.batch_tokens

    def use_attention(self, kernel: str) -> None:
        """Attend with `kernel` (as measured at load, or as an earlier run chose): at
        load, before any thread translates (it sets every attention's kernel)."""
        for model in self.models:
            model.use_attention(kernel)
        self.precision = {**self.precision, "attention": {"kernel": kernel}}

    def describe(self) -> dict:
        return {
            "engine": "pytorch",
            "models": len(self.models),
            "parameters": sum(count_parameters(m) for m in self.models),
            "device": str(self.device),
            "precision": self.precision["precision"],
        }

    def check(self, options: SearchOptions, spell: Callable[[str], str] = flag) -> None:
        super().check(options, spell)
        if options.shortlist and self.shortlist is None:
            raise OptionError(
                f"{spell('shortlist')}: this model has no lexical shortlist (a distilled "
                f"student has one: mtkit distill)",
                "shortlist",
            )
        if options.alignments and options.align_layer is not None:
            check_layer(options.align_layer, self.models, spell("align_layer"))

    def translate(
        self,
        lines: list[str],
        opts: SearchOptions,
        done: Callable[[int], None] | None = None,
        prefixes: list[str] | None = None,
        *,
        batch_tokens: int = BATCH_TOKENS,
        constraints: list[list[tuple[str, ...]]] | None = None,
        links: list[bool] | None = None,
    ) -> list[list[Hypothesis]]:
        """Hypotheses for each line, in input order (`mtkit.engines.base.Translator`). With
        sampling, each line draws from a seed made of `opts.seed` and its text, so its
        samples are the same in any batch, at any place in the input, alone or not."""
        self.check(opts)
        constraints = constraints if constraints and any(constraints) else None
        if constraints:
            check_constraints(opts, self.capabilities)
        done = done or (lambda n: None)
        out, todo, ids, forced = self.prepare(lines, opts, done, prefixes, constraints)
        wanted = (
            self.constraint_ids(ids, [constraints[i] for i in todo], opts, [i + 1 for i in todo])
            if constraints
            else None
        )
        required = (
            [[i for c in line for alt in c for i in alt] for line in wanted] if wanted else None
        )
        batches = [
            (banned, batch)
            for banned, group in self.output_groups(ids, forced, opts, required)
            for batch in length_batches(
                sorted(group, key=lambda k: -len(ids[k])),  # longest first
                ids,
                max(batch_tokens // opts.beam, 1),
            )
        ]
        jobs = [
            BatchJob(
                [ids[k] for k in batch],
                [forced[k] for k in batch] if forced else None,
                [line_seed(opts.seed, lines[todo[k]]) for k in batch] if opts.sampling else [],
                [wanted[k] for k in batch] if wanted else None,
                banned,
                [links[todo[k]] for k in batch] if links is not None else None,
            )
            for banned, batch in batches
        ]
        for i, hyps in self.run_jobs(jobs, opts):
            for k, h in zip(batches[i][1], hyps, strict=True):
                out[todo[k]] = h
            done(len(hyps))
        if self.graphs:
            log.info("decoder steps so far (CUDA graphs): %s", self.graph_record())
        return out

    def run_jobs(self, jobs: list[BatchJob], opts: SearchOptions) -> Iterator[tuple[int, list]]:
        """(index, hypotheses) of each batch, as they are finished: in this process, one
        after another, or spread over helper processes where the engine has them
        (`workers`, on a CPU: `mtkit.engines.workers`)."""
        with self.serial():
            pool = self.worker_pool(len(jobs), opts)
            if pool is None:
                for i, job in enumerate(jobs):
                    yield i, self.translate_batch(job, opts)
                return
            yield from pool.run(jobs, opts, self.translate_batch)

    @contextmanager
    def serial(self) -> Iterator[None]:
        """Where threads share the engine: one call at a time in the block where it has
        what they must not share, helper processes (`workers` > 1: their shared counter
        serves one call's batches at a time, and the engine's own share of the threads,
        `torch_threads`, is the process's) or captured steps (`graphs`: a slot holds one
        search's cache, and a replay writes into its fixed tensors); each call at once
        otherwise."""
        if self.workers > 1 or self.graphs:
            with self._serial:
                yield
        else:
            yield

    def worker_pool(self, batches: int, opts: SearchOptions) -> BatchWorkers | None:
        """The helper processes that translate batches beside this one: started at the
        first input of several batches where `workers` > 1 on a CPU, then kept. Compiled
        steps are compiled first, so that the forked helpers have them
        (`CompiledDecoder.warm`): as `opts`, this first input's, search (greedy or beam
        search, with a shortlist or not), one graph; a later input of another kind steps
        eagerly in the helpers."""
        if (
            self.workers <= 1
            or batches < 2
            or self.device.type != "cpu"
            or not self.sources
            or self.helper is None
        ):
            return None
        if self._pool is not None and self._pool.broken:  # a helper failed: new ones
            self.close()
        if self._pool is None:
            for stepper in self.steppers:  # compiled before the fork: helpers inherit it
                if isinstance(stepper, CompiledDecoder):  # as a helper will step
                    hidden = opts.shortlist and self.shortlist is not None
                    share = worker_threads(self.workers, torch.get_num_threads())
                    with torch_threads(share), self.searching():
                        stepper.warm(len(self.src_vocab), opts.beam, hidden)
            self._pool = BatchWorkers(
                self,
                functools.partial(
                    self.helper,
                    self.sources,
                    self.precision["precision"],
                    self.precision.get("attention", {}).get("kernel"),
                    self.digests,
                    "on" if self.compiled else "off",
                ),
                self.workers,
            )
        return self._pool

    def close(self) -> None:
        """Stop the helper processes, if any (they also stop when the engine is let go,
        or with the process); a later input of several batches starts them again. A call
        of another thread that uses them ends first."""
        with self._serial:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def translate_batch(self, job: BatchJob, opts: SearchOptions) -> list[list[Hypothesis]]:
        """The hypotheses of one batch (its sentences' ids, without eos)."""
        src = padded([row + [EOS] for row in job.rows]).to(self.device)  # (B, S)
        model = (
            self.shortlisted(
                src,
                not (
                    job.banned or job.forced or job.wanted or opts.no_repeat_ngram or opts.sampling
                ),
            )
            if opts.shortlist
            else self.step_model
        )
        if job.banned:
            model = OutputVocabulary(model, job.banned, len(self.tgt_vocab), self.device)
        if opts.alignments:
            model = _Encoding(model)
        with self.searching():
            hyps = self.search(src, opts, job.forced, job.seeds, job.wanted, model)
            if opts.alignments:
                hyps = self.with_alignments(
                    job.rows, hyps, opts.align_layer, model.encoded, job.links
                )
        return hyps

    def shortlisted(self, src: torch.Tensor, compact: bool = False) -> StepModel:
        """The step model with its output layer cut to the shortlist of batch src (B, S);
        `compact`: logits of the shortlist's tokens only (`Shortlisted`), for one model
        searched without prefixes, constraints, banned pieces or n-gram bans (which name
        tokens), and not sampled (a draw over fewer columns draws other pieces)."""
        allowed = self.shortlist.allowed(src)  # (A,)
        if len(self.models) == 1:
            return Shortlisted(self.steppers[0], allowed, compact)
        return Ensemble([Shortlisted(m, allowed) for m in self.steppers])

    def search(
        self,
        src: torch.Tensor,
        opts: SearchOptions,
        prefixes: list[list[int]] | None,
        seeds: list[int],
        constraints: list[list[list[list[int]]]] | None = None,
        model: StepModel | None = None,
    ) -> list[list[Hypothesis]]:
        """One batch src (B, S) through sampling, greedy decoding, beam search or
        constrained beam search, of `model` (default: `step_model`)."""
        model = model or self.step_model
        if opts.sampling:
            hyps = sample_search(model, src, opts, seeds=seeds, prefixes=prefixes)
            return [h[: opts.nbest] for h in hyps]
        if opts.beam == 1:
            return greedy_hypotheses(model, src, opts, prefixes=prefixes)
        if constraints and any(constraints):
            return self.constrained(src, opts, prefixes, constraints, model)
        return beam_search(model, src, opts, prefixes=prefixes)

    def constrained(
        self,
        src: torch.Tensor,
        opts: SearchOptions,
        prefixes: list[list[int]] | None,
        constraints: list[list[list[list[int]]]],
        model: StepModel,
    ) -> list[list[Hypothesis]]:
        """Constrained beam search (`mtkit.search.constraints`). A sentence with fewer than
        n-best hypotheses that meet its constraints within its length limit (none, or
        too few for --nbest) is filled up with plain beam search's, marked `met=False`."""
        hyps = constrained_beam_search(
            model,
            src,
            constraints,
            opts,
            prefixes=prefixes,
            inside_word=self.inside_word,
        )
        hyps = [
            [replace(h, met=True) for h in nbest] if wanted else nbest
            for nbest, wanted in zip(hyps, constraints, strict=True)
        ]
        short = [i for i, h in enumerate(hyps) if len(h) < opts.nbest]
        if short:
            plain = self.search(
                src[short],
                opts,
                [prefixes[i] for i in short] if prefixes else None,
                [],
                model=model,
            )
            for i, more in zip(short, plain, strict=True):
                have = {tuple(h.tokens) for h in hyps[i]}
                hyps[i] = (
                    hyps[i]
                    + [replace(h, met=False) for h in more if tuple(h.tokens) not in have][
                        : opts.nbest - len(hyps[i])
                    ]
                )
        return hyps

    @contextmanager
    def searching(self) -> Iterator[None]:
        """What searches run in: their precision (bf16 autocast, or none: fp32), and
        inference mode, not only no_grad: no version counters or view records for the ~1,100
        small tensor operations of a step (the same outputs, faster). Whatever a search
        makes is made and written inside it."""
        with autocast(self.device, self.autocast_dtype), torch.inference_mode():
            yield

    def with_alignments(
        self,
        sources: list[list[int]],
        hyps: list[list[Hypothesis]],
        layer: int | None,
        encoded: tuple[torch.Tensor, torch.Tensor] | None = None,
        wanted: list[bool] | None = None,
    ) -> list[list[Hypothesis]]:
        """Each hypothesis with its word links to its source (`mtkit.search.alignment`),
        of the sources `wanted` (None: all; the others' hypotheses keep none); `encoded`:
        the sources' memory and mask as the search made them (one per source: an
        n-best's hypotheses are read against their source's own encoding again)."""
        rows = [i for i in range(len(sources)) if wanted is None or wanted[i]]
        if not rows:
            return hyps
        if encoded is not None and len(rows) < len(sources):  # those rows, as wide as they are
            index = torch.tensor(rows, device=encoded[0].device)
            width = max(len(sources[i]) for i in rows) + 1  # (eos)
            encoded = (encoded[0][index, :width], encoded[1][index, :width])
        pairs = [(sources[i], h.tokens) for i in rows for h in hyps[i]]
        found = iter(
            align(
                self.models,
                [src for src, _ in pairs],
                [out for _, out in pairs],
                [[self.src_vocab.piece(i) for i in src] for src, _ in pairs],
                [[self.tgt_vocab.piece(i) for i in out] for _, out in pairs],
                layer,
                self.device,
                guided=bool(self.config.train.guided_alignment),
                encoded=encoded if all(len(hyps[i]) == 1 for i in rows) else None,
            )
        )
        out = list(hyps)
        for i in rows:
            out[i] = [replace(h, alignment=next(found)) for h in hyps[i]]
        return out


class _Encoding:
    """A step model that keeps the encoding (memory, mask) of the first source its search
    encodes, so that the links' pass after it reads that memory instead of running the
    encoder again (the same tensors: the same links)."""

    def __init__(self, model: StepModel):
        self.model = model
        self.encoded: tuple[torch.Tensor, torch.Tensor] | None = None

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        encoded = self.model.encode(src)
        if self.encoded is None:  # (a constrained search's fallback encodes a part again)
            self.encoded = encoded
        return encoded


class OutputVocabulary:
    """A step model that never outputs the `banned` ids of a target vocabulary of
    `size`: their logits are -inf before the search reads them (so the other pieces'
    probabilities add up to 1). Everything else is the model's."""

    def __init__(self, model: StepModel, banned: list[int], size: int, device: torch.device):
        self.model = model
        self.banned = torch.zeros(size, dtype=torch.bool)
        self.banned[banned] = True
        self.banned = self.banned.to(device)  # (V,)

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def decode_step(
        self, token: torch.Tensor, memory: torch.Tensor | None, src_mask: torch.Tensor, cache
    ) -> tuple[torch.Tensor, object]:
        logits, cache = self.model.decode_step(token, memory, src_mask, cache)  # (rows, V)
        return logits.masked_fill_(self.banned, float("-inf")), cache


def line_seed(seed: int, line: str) -> int:
    """A sampling seed for one input line: from the user's seed and the line's text."""
    digest = hashlib.sha256(f"{seed}\0{line}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:7], "little")


def length_batches(
    order: list[int], ids: list[list[int]], batch_tokens: int
) -> Iterator[list[int]]:
    """Consecutive runs of `order` with (rows x longest + 1) <= batch_tokens."""
    batch: list[int] = []
    longest = 0
    for k in order:
        n = len(ids[k]) + 1
        if batch and (len(batch) + 1) * max(longest, n) > batch_tokens:
            yield batch
            batch, longest = [], 0
        batch.append(k)
        longest = max(longest, n)
    if batch:
        yield batch
