"""The PyTorch engine: checkpoints' models behind `mtkit.search.beam`.

`TorchEngine.translate` takes lines, sets empty ones aside (`Engine.prepare`), sorts the
rest by length, and runs each batch of at most `batch_tokens` source tokens x beam (the
rows the search carries) through greedy decoding, beam search or sampling;
`load_torch_engine` builds one from checkpoint files (several make an ensemble).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import torch

from mtkit.core.checkpoint import (
    CheckpointError,
    MappedFile,
    check_shortlist,
    describe_weights,
    load_checkpoint,
    payload_digest,
    trained_step,
)
from mtkit.core.config import Config, config_from_dict
from mtkit.core.device import (
    autocast,
    inference_shape,
    machine_key,
    precision_record,
    resolve_device,
    resolve_precision,
    tune_cpu_runtime,
)
from mtkit.core.errors import OptionError
from mtkit.core.hypothesis import Hypothesis
from mtkit.core.measured import holds_timings, remembered
from mtkit.core.search_options import (
    BATCH_TOKENS,
    Capabilities,
    SearchOptions,
    check_constraints,
    check_precision,
    cpu_workers,
    flag,
)
from mtkit.core.vocab import EOS, Vocab, entry_vocabs
from mtkit.engines.base import Engine
from mtkit.engines.workers import BatchJob, BatchWorkers
from mtkit.model import int8
from mtkit.model.attention import keep_stacked_weights
from mtkit.model.cache import preallocated_capacity
from mtkit.model.kernel_timing import AttentionShape, choose_decoding_attention
from mtkit.model.transformer import Transformer, build_model, count_parameters
from mtkit.search.alignment import align, check_layer
from mtkit.search.beam import StepModel, beam_search, greedy_hypotheses, padded
from mtkit.search.captured import CapturedDecoder, graph_choice
from mtkit.search.constraints import constrained_beam_search
from mtkit.search.ensemble import Ensemble
from mtkit.search.sampling import sample_search
from mtkit.search.shortlist import Shortlist, Shortlisted

log = logging.getLogger(__name__)


@dataclass
class TorchEngine(Engine):
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
    # are bf16, `bf16_weights`, and `autocast_dtype` is None) or int8 (`mtkit.model.int8`), and
    # the attention kernel they run with (`kernels.choose_decoding_attention`)
    precision: dict = field(default_factory=lambda: {"precision": "fp32", "asked": "fp32"})
    shortlist: Shortlist | None = None  # the (first) checkpoint's lexical shortlist
    # Decoder steps as CUDA graphs (`mtkit.search.captured`; `graph_choice`): each model's
    # steps through its `CapturedDecoder`, whose searches run in fixed shapes
    graphs: bool = False
    # Batches translated at once on a CPU (`mtkit.engines.workers`), from the checkpoint
    # files `sources`; 1: one at a time, in this process
    workers: int = 1
    sources: list[str] = field(default_factory=list)
    # Each model's weights' digest (`Weights.digest`): what a spawned helper checks that
    # it loaded
    digests: list[str] = field(default_factory=list)
    _pool: BatchWorkers | None = field(default=None, init=False, repr=False, compare=False)

    # Everything: sampling, alignments, constraints, and greedy lines stream
    # (`mtkit.serving`), for one model or an ensemble.
    capabilities = Capabilities(
        sampling=True, alignments=True, streaming=True, constraints=True, shortlist=True
    )

    def __post_init__(self) -> None:
        Engine.__init__(self)

    @property
    def model(self) -> Transformer:
        """The (first) model."""
        return self.models[0]

    @functools.cached_property
    def steppers(self) -> list[Transformer | CapturedDecoder]:
        """What steps each model in a search: the model, or with graphs its
        `CapturedDecoder` (kept: it holds the captured steps)."""
        return [CapturedDecoder(m) if self.graphs else m for m in self.models]

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
        precision record has one (`device_batch_tokens`), else decode.batch_tokens."""
        sized = self.precision.get("batch_tokens")
        return sized["tokens"] if sized else self.config.decode.batch_tokens

    def use_attention(self, kernel: str) -> None:
        """Attend with `kernel` (as measured at load, or as an earlier run chose)."""
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
            check_layer(options.align_layer, self.models)

    def translate(
        self,
        lines: list[str],
        opts: SearchOptions,
        done: Callable[[int], None] | None = None,
        prefixes: list[str] | None = None,
        *,
        batch_tokens: int = BATCH_TOKENS,
        constraints: list[list[tuple[str, ...]]] | None = None,
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
        pool = self.worker_pool(len(jobs))
        if pool is None:
            for i, job in enumerate(jobs):
                yield i, self.translate_batch(job, opts)
            return
        yield from pool.run(jobs, opts, self.translate_batch)

    def worker_pool(self, batches: int) -> BatchWorkers | None:
        """The helper processes that translate batches beside this one: started at the
        first input of several batches where `workers` > 1 on a CPU, then kept."""
        if self.workers <= 1 or batches < 2 or self.device.type != "cpu" or not self.sources:
            return None
        if self._pool is not None and self._pool.broken:  # a helper failed: new ones
            self.close()
        if self._pool is None:
            self._pool = BatchWorkers(
                self,
                functools.partial(
                    helper_engine,
                    self.sources,
                    self.precision["precision"],
                    self.precision.get("attention", {}).get("kernel"),
                    self.digests,
                ),
                self.workers,
            )
        return self._pool

    def close(self) -> None:
        """Stop the helper processes, if any (they also stop when the engine is let go,
        or with the process); a later input of several batches starts them again."""
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
        with self.searching():
            hyps = self.search(src, opts, job.forced, job.seeds, job.wanted, model)
            if opts.alignments:
                hyps = self.with_alignments(job.rows, hyps, opts.align_layer)
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
        inference mode, not only no_grad: no version counters or view records for the
        ~1,100 small tensor operations of a step (bf16 beam 5, 500 test2016 sentences,
        interleaved in one process: 4.26 against 4.56 s, and 3.56 against 4.05 s in an
        earlier run; the same outputs). Whatever a search makes is made and written
        inside it."""
        with autocast(self.device, self.autocast_dtype), torch.inference_mode():
            yield

    def with_alignments(
        self, sources: list[list[int]], hyps: list[list[Hypothesis]], layer: int | None
    ) -> list[list[Hypothesis]]:
        """Each hypothesis with its word links to its source (`mtkit.search.alignment`)."""
        pairs = [(src, h.tokens) for src, nbest in zip(sources, hyps, strict=True) for h in nbest]
        links = iter(
            align(
                self.models,
                [src for src, _ in pairs],
                [out for _, out in pairs],
                [[self.src_vocab.piece(i) for i in src] for src, _ in pairs],
                [[self.tgt_vocab.piece(i) for i in out] for _, out in pairs],
                layer,
                self.device,
                guided=bool(self.config.train.guided_alignment),
            )
        )
        return [[replace(h, alignment=next(links)) for h in nbest] for nbest in hyps]


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


def load_torch_engine(
    paths: Sequence[str | os.PathLike],
    device: str = "auto",
    device_option: str = "--device",
    precision: str | None = None,
    cuda_graphs: str | None = None,
    workers: int | None = None,
) -> TorchEngine:
    """Everything translation needs comes from the checkpoint file(s); several files make
    an ensemble, whose models must share the source and the target vocabulary (decoding
    defaults come from the first). `device_option` names the option `device` came from,
    for the error when it cannot be used. `precision` (None: the checkpoint's
    decode.precision): auto, fp32, bf16 or int8 (`inference_precision`); `cuda_graphs`
    (None: the checkpoint's decode.cuda_graphs): auto, on or off (`graph_choice`);
    `workers` (None: the checkpoint's decode.workers; 0: auto, `cpu_workers`): batches
    translated at once on a CPU (`mtkit.engines.workers`)."""
    dev = resolve_device(device, device_option)
    loaded = [load_model(p) for p in paths]
    first, (_, src_vocab, tgt_vocab, cfg, _, shortlist) = paths[0], loaded[0]
    for path, (_, src, tgt, *_) in zip(paths[1:], loaded[1:], strict=True):
        for side, mine, theirs in (("source", src, src_vocab), ("target", tgt, tgt_vocab)):
            if not mine.same(theirs):
                raise CheckpointError(
                    f"{path} and {first} have different {side} "
                    f"vocabularies; the models of an ensemble must share "
                    f"their tokenizers"
                )
    models = [model.to(dev).eval() for model, *_ in loaded]
    dtype, record = inference_precision(precision or cfg.decode.precision, dev, cfg)
    if record["precision"] == "int8":
        models = [
            int8.quantize(model, MappedFile(Path(path)).release)
            for model, path in zip(models, paths, strict=True)
        ]
    elif dtype is not None and dev.type == "cpu":  # bf16 weights, not autocast
        models = [
            bf16_weights(model, MappedFile(Path(path)).release)
            for model, path in zip(models, paths, strict=True)
        ]
        dtype = None
    rows, d_model, _ = inference_shape(
        cfg.decode.batch_tokens, cfg.model.d_model, cfg.model.ffn_dim
    )
    record["attention"] = choose_decoding_attention(
        dev,
        torch.bfloat16 if record["precision"] == "bf16" else None,
        AttentionShape(rows, 16, cfg.model.heads, d_model // cfg.model.heads),
    )
    for model in models:
        model.use_attention(record["attention"]["kernel"])
        keep_stacked_weights(model)  # its weights are final now
    record["graphs"] = graph_choice(cuda_graphs or cfg.decode.cuda_graphs, dev)
    if dev.type == "cuda" and cfg.decode.batch_tokens == BATCH_TOKENS:
        free, _ = torch.cuda.mem_get_info(dev)
        record["batch_tokens"] = device_batch_tokens(
            cfg, len(tgt_vocab), free, 2 if dtype is not None else 4, len(models)
        )
        log.info("batch budget on %s: %s", dev, record["batch_tokens"])
    return TorchEngine(
        models,
        src_vocab,
        tgt_vocab,
        dev,
        dtype,
        cfg,
        [x.weights.step for x in loaded],
        [x.weights.about for x in loaded],
        record,
        shortlist,
        record["graphs"]["graphs"] == "on",
        cpu_workers(cfg.decode.workers if workers is None else workers, torch.get_num_threads())
        if dev.type == "cpu"
        else 1,
        [str(p) for p in paths],
        [x.weights.digest for x in loaded],
    )


def helper_engine(
    paths: list[str], precision: str, attention: str | None, digests: list[str] | None = None
) -> TorchEngine:
    """The engine a spawned helper process loads (`mtkit.engines.workers`): the same
    checkpoint files, precision and attention kernel as its engine's, on the CPU, one
    batch at a time. `digests`: the engine's models' (`Weights.digest`); a file that
    holds other weights now (replaced since the engine loaded it) is a `CheckpointError`:
    one command translates with one model."""
    tune_cpu_runtime()
    engine = load_torch_engine(paths, "cpu", precision=precision, workers=1)
    for path, loaded, wanted in zip(paths, engine.digests, digests or engine.digests, strict=True):
        if loaded != wanted:
            raise CheckpointError(
                f"the model file changed since this command loaded it: {path} holds "
                f"other weights now; run the command again"
            )
    if attention is not None:
        engine.use_attention(attention)
    return engine


GPU_MEMORY_SHARE = 0.25  # of the memory free at load, for the search of one batch
MAX_DEVICE_BATCH_TOKENS = 512_000


def device_batch_tokens(
    cfg: Config, vocab_size: int, free: int, element_bytes: int = 2, models: int = 1
) -> dict:
    """The batch budget on a GPU where the checkpoint's decode.batch_tokens is the
    default (sized for a 2-core CPU: a GPU searching 1,600 source tokens at a time waits
    on its host), and its record: what `GPU_MEMORY_SHARE` of the `free` bytes holds.

    A budget of N is N source tokens x beam, so a batch of sources of S tokens carries
    N / S rows. For each of `models` models a row holds, in elements of `element_bytes`
    (2 in bf16): its self-attention keys/values three times over (a preallocated cache,
    its reorder, and a captured step's copy: `mtkit.search.captured`), 6 x layers x C x
    d_model for C positions (the output limit max_len_a x S + max_len_b and bos, rounded
    up as `preallocated_capacity` rounds it), and its share of its source's keys/values,
    at most 2 x layers x S x d_model; and its logits with their fp32 log-probabilities
    and the search's work on them, 12 bytes per target piece. The costliest per budget
    token is the shortest source (S = 1: a row's logits for a one-token source), which
    sets the budget, never below the CPU default nor above `MAX_DEVICE_BATCH_TOKENS`.
    Captured steps of other shapes are bounded apart (`captured.SLOT_MEMORY_SHARE`)."""
    d, m = cfg.decode, cfg.model
    limit = int(d.max_len_a * 1 + d.max_len_b)  # the longest output of a one-token source
    columns = preallocated_capacity(min(limit, m.max_positions - 1), m.max_positions)
    per_model = 6 * m.decoder_layers * columns * m.d_model + 2 * m.decoder_layers * m.d_model
    row = models * (element_bytes * per_model + 12 * vocab_size)
    tokens = int(GPU_MEMORY_SHARE * free // row)
    return {
        "tokens": max(BATCH_TOKENS, min(tokens, MAX_DEVICE_BATCH_TOKENS)),
        "free_gb": round(free / 2**30, 1),
        "rule": f"{GPU_MEMORY_SHARE} of the free memory, {row} bytes a budget token",
    }


def bf16_weights(
    model: Transformer, release: Callable[[torch.Tensor], None] | None = None
) -> Transformer:
    """The model with its weights in bf16, for translation on a CPU: every product,
    LayerNorm and residual runs in bf16, where bf16 autocast would cast each Linear's
    input to bf16 and its output back, and keep a bf16 copy of each weight beside the
    fp32 one. Beam 5 on the Multi30k model ran 1.06-1.15x autocast's speed with outputs
    and BLEU as close to fp32 (README: Speed); the logits are made log-probabilities
    in fp32 (`search.step_log_probs`). Each fp32 tensor is handed to `release` as soon
    as it is cast (a loaded model's are a checkpoint's mapped pages), so that the model
    is never resident in both precisions. In place; returns the model."""
    cast: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (fp32, bf16), tied
    for module in list(model.modules()):  # weights cast once (the fp32 kept: ids stay)
        for name, t in [
            *module.named_parameters(recurse=False),
            *module.named_buffers(recurse=False),
        ]:
            if not t.is_floating_point():
                continue
            if id(t) not in cast:
                new = t.detach().to(torch.bfloat16)
                cast[id(t)] = (
                    t,
                    torch.nn.Parameter(new, t.requires_grad)
                    if isinstance(t, torch.nn.Parameter)
                    else new,
                )
                if release is not None:
                    release(t.detach())
            setattr(module, name, cast[id(t)][1])
    return model


def inference_precision(
    asked: str, device: torch.device, cfg: Config
) -> tuple[torch.dtype | None, dict]:
    """The dtype translation runs in (None: fp32; bf16: autocast on CUDA, the models'
    weights on a CPU, `bf16_weights`) and its record. `auto` takes bf16 on CUDA; on a CPU
    it times the model's first FFN layer at one decoding step of a full batch, forward
    only, with bf16 weights and inputs, and takes bf16 only where it needs at most 90% of
    fp32's time (AVX512-BF16, AMX; never where bf16 is emulated). int8 (`mtkit.model.int8`) is taken
    only when asked, on a CPU: it rounds every product, so it changes more outputs; its
    record has the weight range `int8.weight_range()` found exact on this CPU."""
    check_precision(asked)
    if asked == "int8":
        if device.type != "cpu":
            raise OptionError("--precision int8 runs on a CPU; on CUDA use bf16 (or auto)")
        if not int8.int8_supported():
            raise OptionError(
                f"--precision int8 needs int8 matrix products on a CPU, which "
                f"this torch ({torch.__version__}) lacks; use fp32 or auto"
            )
        weights = int8.weight_range()
        if weights < int8.QMAX:
            log.info(
                "precision int8: full-range int8 products are not exact on this CPU "
                "(no VNNI instructions): weights are rounded to -%d..%d",
                weights,
                weights,
            )
        return None, {"precision": "int8", "asked": asked, "int8_weight_range": weights}
    shape = inference_shape(cfg.decode.batch_tokens, cfg.model.d_model, cfg.model.ffn_dim)

    def measured() -> dict:
        dtype, calibration = resolve_precision(asked, device, shape, backward=False)
        return precision_record(dtype, asked, calibration)

    if asked != "auto" or device.type != "cpu":
        record = measured()  # nothing measured
    else:  # measured once on this machine, then the same every time (`core.measured`)
        record = remembered(
            "translation precision", machine_key(shape=list(shape)), measured, _usable_precision
        )
    return (torch.bfloat16 if record["precision"] == "bf16" else None), record


def _usable_precision(record: dict) -> bool:
    """Whether a kept record of `--precision auto`'s choice on a CPU is one this mtkit
    makes (`precision_record`): fp32 or bf16 (never int8, which only a user asks for),
    asked as auto, with the calibration's timings where it has them."""
    calibration = record.get("calibration", {})
    return (
        record.get("precision") in ("fp32", "bf16")
        and record.get("asked") == "auto"
        and isinstance(calibration, dict)
        and holds_timings(calibration, ("fp32_ms", "bf16_ms"))
    )


class Weights(NamedTuple):
    """What a checkpoint's weights are: its training step (None: an average) and the
    same for people (`checkpoint.describe_weights`: "the average of steps 800 and 900")."""

    step: int | None
    about: str
    # SHA-256 of the checkpoint's content (its stored digest, checked on load; computed
    # for an older one without): the same digest, the same weights
    digest: str = ""


class Loaded(NamedTuple):
    """What a checkpoint holds for translation."""

    model: Transformer
    src_vocab: Vocab
    tgt_vocab: Vocab
    config: Config
    weights: Weights
    shortlist: Shortlist | None  # a distilled student's (`mtkit.search.shortlist`)


def load_model(path: str | os.PathLike) -> Loaded:
    """A checkpoint's model, vocabularies, config, what its weights are, and its lexical
    shortlist where it has one (checked against the vocabularies: `check_shortlist`). The
    checkpoint is read memory-mapped and the model's weights are its own (copy on
    write: nothing is written back): its training state is never read, and the weights
    are in memory once, paged in as they are used, not first drawn at random and then
    copied over."""
    payload = load_checkpoint(path, mmap=True)
    try:
        cfg = config_from_dict(payload["config"], str(path))
        src_vocab, tgt_vocab = entry_vocabs(payload["vocab"])
        model = build_model(cfg.model, len(src_vocab), len(tgt_vocab), initialize=False)
        model.load_state_dict(payload["model"], assign=True)
    except (KeyError, TypeError, RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"{path}: checkpoint is incomplete or does not match its "
            f"config ({type(e).__name__}: {str(e).splitlines()[0][:100]})"
        ) from None
    shortlist = None
    if "shortlist" in payload:  # checked: a search with it indexes the output layer
        check_shortlist(
            payload["shortlist"],
            len(src_vocab),
            len(tgt_vocab),
            Path(path),
            "this checkpoint cannot be used; rerun `mtkit distill`, then `mtkit train` "
            "writes checkpoints with a checked one",
        )
        shortlist = Shortlist.of_entry(payload["shortlist"])
    return Loaded(
        model,
        src_vocab,
        tgt_vocab,
        cfg,
        Weights(
            trained_step(payload),
            describe_weights(payload),
            payload.get("digest") or payload_digest(payload, MappedFile(Path(path)).release),
        ),
        shortlist,
    )
