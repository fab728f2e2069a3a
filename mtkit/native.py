"""The native translator: checkpoints' models behind `mtkit.search`, in PyTorch.

`Translator.translate` takes lines, sets empty ones aside (`Frontend`), sorts the rest
by length, and runs each batch of at most `batch_tokens` / beam source tokens through
greedy decoding, beam search or sampling; `load_checkpoints` builds one from checkpoint
files. The text side (streaming, formats, order) is `mtkit.translate`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace

import torch

from mtkit.align import align, check_layer
from mtkit.checkpoint import CheckpointError, load_checkpoint
from mtkit.config import Config, config_from_dict
from mtkit.device import resolve_device, resolve_precision
from mtkit.ensemble import Ensemble
from mtkit.hypothesis import Hypothesis
from mtkit.model import Transformer, build_model, count_parameters
from mtkit.sampling import sample_search
from mtkit.search import beam_search, greedy_hypotheses
from mtkit.serving.stream import GreedyStream
from mtkit.translate import DecodeOptions, Frontend, length_batches, line_seed
from mtkit.vocab import EOS, PAD, Vocab


@dataclass
class Translator(Frontend):
    """One model, or an ensemble of models that share their vocabularies."""

    models: list[Transformer]
    src_vocab: Vocab
    tgt_vocab: Vocab
    device: torch.device
    autocast_dtype: torch.dtype | None
    config: Config  # the (first) checkpoint's: decoding defaults in config.decode
    steps: list[int | None] = field(default_factory=list)  # each model's training step
    _truncated: set[str] = field(default_factory=set)

    @property
    def model(self) -> Transformer:
        """The (first) model."""
        return self.models[0]

    @property
    def step_model(self) -> Transformer | Ensemble:
        """What search runs: the model, or the ensemble of all of them."""
        return self.models[0] if len(self.models) == 1 else Ensemble(self.models)

    @property
    def max_positions(self) -> int:
        return min(m.cfg.max_positions for m in self.models)

    def describe(self) -> dict:
        return {"engine": "pytorch", "models": len(self.models),
                "parameters": sum(count_parameters(m) for m in self.models)}

    def translate(self, lines: list[str], opts: DecodeOptions,
                  done: Callable[[int], None] | None = None,
                  prefixes: list[str] | None = None) -> list[list[Hypothesis]]:
        """Hypotheses for each line, in input order; empty lines get one empty one.
        A line's output starts with its target `prefixes` entry, when given.
        `done(n)` is called as lines are finished (for a progress bar). With sampling,
        each line draws from a seed made of `opts.seed` and its text, so its samples are
        the same in any batch, at any place in the input, alone or not. With
        `opts.alignments`, each hypothesis carries its word alignment."""
        if opts.alignments and opts.align_layer is not None:
            check_layer(opts.align_layer, self.models)
        done = done or (lambda n: None)
        out, todo, ids, forced = self.prepare(lines, opts, done, prefixes)
        if not todo:
            return out
        order = sorted(range(len(todo)), key=lambda k: -len(ids[k]))  # longest first
        model = self.step_model
        for batch in length_batches(order, ids, max(opts.batch_tokens // opts.beam, 1)):
            src = pad_rows([ids[k] + [EOS] for k in batch]).to(self.device)  # (B, S)
            pre = [forced[k] for k in batch] if forced else None
            with self.autocast():
                if opts.sampling:
                    seeds = [line_seed(opts.seed, lines[todo[k]]) for k in batch]
                    hyps = sample_search(model, src, seeds, opts.beam, opts.temperature,
                                         opts.topk, opts.topp, opts.lenpen, opts.max_len_a,
                                         opts.max_len_b, no_repeat_ngram=opts.no_repeat_ngram,
                                         prefixes=pre)
                    hyps = [h[: opts.nbest] for h in hyps]
                elif opts.beam == 1:
                    hyps = greedy_hypotheses(model, src, opts.lenpen, opts.max_len_a,
                                             opts.max_len_b,
                                             no_repeat_ngram=opts.no_repeat_ngram,
                                             prefixes=pre)
                else:
                    hyps = beam_search(model, src, opts.beam, opts.lenpen,
                                       opts.max_len_a, opts.max_len_b, nbest=opts.nbest,
                                       no_repeat_ngram=opts.no_repeat_ngram, prefixes=pre)
                if opts.alignments:
                    hyps = self.with_alignments([ids[k] for k in batch], hyps,
                                                opts.align_layer)
            for k, h in zip(batch, hyps, strict=True):
                out[todo[k]] = h
            done(len(batch))
        return out

    def autocast(self) -> AbstractContextManager:
        """The precision searches run in: bf16 autocast on CUDA, none on a CPU."""
        return torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                              enabled=self.autocast_dtype is not None)

    def stream(self, opts: DecodeOptions) -> LineStream | None:
        """Continuous batching for greedy decoding with one model (`LineStream`)."""
        if not LineStream.can_take(opts) or len(self.models) > 1:
            return None
        return LineStream(self, opts)

    def with_alignments(self, sources: list[list[int]], hyps: list[list[Hypothesis]],
                        layer: int | None) -> list[list[Hypothesis]]:
        """Each hypothesis with its word links to its source (`mtkit.align`)."""
        pairs = [(src, h.tokens) for src, nbest in zip(sources, hyps, strict=True)
                 for h in nbest]
        links = iter(align(self.models, [src for src, _ in pairs], [out for _, out in pairs],
                           [[self.src_vocab.piece(i) for i in src] for src, _ in pairs],
                           [[self.tgt_vocab.piece(i) for i in out] for _, out in pairs],
                           layer, self.device))
        return [[replace(h, alignment=next(links)) for h in nbest] for nbest in hyps]


class LineStream:
    """Lines translated with continuous batching, for `mtkit serve`: `add` lines (a key
    each) between any two steps and they join the running greedy search
    (`search.GreedyStream`); each `step` returns the lines that ended, with their
    hypotheses. A line's output is what `Translator.translate` gives it alone.

    Takes the requests whose options differ from the first's at most in alignments."""

    def __init__(self, translator: Translator, opts: DecodeOptions):
        self.translator, self.opts = translator, opts
        self.search = GreedyStream(translator.model, opts.lenpen, opts.max_len_a,
                                   opts.max_len_b)
        self.ready: list[tuple[Hashable, list[Hypothesis]]] = []  # empty lines
        self.joining: list[tuple[Hashable, list[int]]] = []  # key, source ids
        self.aligned: dict[Hashable, tuple[list[int], int | None]] = {}  # key -> ids, layer

    @staticmethod
    def can_take(opts: DecodeOptions) -> bool:
        """Whether these options decode greedily, with nothing a stream cannot do."""
        return opts.beam == 1 and not opts.sampling and not opts.no_repeat_ngram

    def accepts(self, opts: DecodeOptions) -> bool:
        return self.can_take(opts) and replace(opts, alignments=False, align_layer=None,
                                               batch_tokens=self.opts.batch_tokens) == \
            replace(self.opts, alignments=False, align_layer=None)

    def __len__(self) -> int:
        """Lines taken and not yet returned."""
        return len(self.search) + len(self.ready) + len(self.joining)

    def add(self, lines: list[str], keys: list[Hashable], opts: DecodeOptions) -> None:
        """Lines (a key each) that join the search at the next step: all those added
        between two steps are encoded together."""
        if opts.alignments and opts.align_layer is not None:
            check_layer(opts.align_layer, self.translator.models)
        out, todo, ids, _ = self.translator.prepare(lines, opts, lambda n: None, None)
        taken = set(todo)
        self.ready += [(keys[i], out[i]) for i in range(len(lines)) if i not in taken]
        self.joining += [(keys[i], x) for i, x in zip(todo, ids, strict=True)]
        if opts.alignments:
            self.aligned.update((keys[i], (x, opts.align_layer))
                                for i, x in zip(todo, ids, strict=True))

    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """One token for every line; the lines that ended: (key, hypotheses) each."""
        finished, self.ready = self.ready, []
        with self.translator.autocast():
            if self.joining:
                src = pad_rows([x + [EOS] for _, x in self.joining])  # (B, S)
                self.search.add(src.to(self.translator.device), [k for k, _ in self.joining])
                self.joining = []
            ended = self.search.step()
        for key, hyp in ended:
            if key in self.aligned:
                ids, layer = self.aligned.pop(key)
                finished.append((key, self.translator.with_alignments([ids], [[hyp]],
                                                                      layer)[0]))
            else:
                finished.append((key, [hyp]))
        return finished


def pad_rows(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def load_checkpoints(paths: Sequence[str | os.PathLike], device: str = "auto",
                     device_option: str = "--device") -> Translator:
    """Everything translation needs comes from the checkpoint file(s); several files make
    an ensemble, whose models must share the source and the target vocabulary (decoding
    defaults come from the first). `device_option` names the option `device` came from,
    for the error when it cannot be used."""
    dev = resolve_device(device, device_option)
    loaded = [load_model(p) for p in paths]
    first, (_, src_vocab, tgt_vocab, cfg, _) = paths[0], loaded[0]
    for path, (_, src, tgt, _, _) in zip(paths[1:], loaded[1:], strict=True):
        for side, mine, theirs in (("source", src, src_vocab), ("target", tgt, tgt_vocab)):
            if mine.model_proto != theirs.model_proto:
                raise CheckpointError(f"{path} and {first} have different {side} "
                                      f"vocabularies; the models of an ensemble must share "
                                      f"their tokenizers")
    models = [model.to(dev).eval() for model, *_ in loaded]
    precision, _ = resolve_precision("auto", dev)  # bf16 on CUDA; fp32 on a CPU
    return Translator(models, src_vocab, tgt_vocab, dev, precision, cfg,
                      [step for *_, step in loaded])


def load_model(path: str | os.PathLike
                ) -> tuple[Transformer, Vocab, Vocab, Config, int | None]:
    """A checkpoint's model, vocabularies, config and training step (None: averaged).
    The checkpoint is read memory-mapped: its training state is never copied in."""
    payload = load_checkpoint(path, mmap=True)
    try:
        cfg = config_from_dict(payload["config"], str(path))
        src_vocab = Vocab(payload["vocab"]["src"])
        tgt_vocab = Vocab(payload["vocab"]["tgt"])
        model = build_model(cfg.model, len(src_vocab), len(tgt_vocab))
        model.load_state_dict(payload["model"])
    except (KeyError, TypeError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"{path}: checkpoint is incomplete or does not match its "
                              f"config ({type(e).__name__}: {str(e).splitlines()[0][:100]})"
                              ) from None
    progress = payload.get("train", {}).get("progress", {})
    return model, src_vocab, tgt_vocab, cfg, progress.get("step")
