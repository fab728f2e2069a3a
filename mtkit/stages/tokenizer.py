"""The `mtkit tokenizer` stage: sample and clean training pairs, train SentencePiece with
mtkit's fixed special ids (`mtkit.core.vocab`), write RUN/spm.model."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from mtkit.core.atomic import remove_leftovers, write_atomic
from mtkit.core.config import Config, TokenizerConfig, save_config
from mtkit.core.errors import UserError, plural
from mtkit.core.languages import tags
from mtkit.core.rundir import run_lock
from mtkit.core.vocab import BOS, EOS, PAD, UNK, Vocab, entry_vocabs, pieces_path, vocab_paths
from mtkit.data.sources import Corpus, DataError, clean, open_split

log = logging.getLogger(__name__)


class TokenizerError(UserError, ValueError):
    """The corpus cannot give the requested vocabulary (one line)."""


def train_sentencepiece(
    sentences: Iterable[str], cfg: TokenizerConfig, symbols: Sequence[str] = ()
) -> bytes:
    """Train one SentencePiece model on `sentences` (all of them: `sample_pairs` chooses
    them); returns the serialized model. `symbols` (a multilingual run's `<2xx>` tags)
    are user-defined pieces: never split, with the ids right after the fixed specials."""
    lines = [s for s in sentences if s]
    if not lines:
        raise TokenizerError("no text to train the tokenizer on")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            model_type=cfg.model_type,
            vocab_size=cfg.vocab_size,
            character_coverage=cfg.character_coverage,
            pad_id=PAD,
            unk_id=UNK,
            bos_id=BOS,
            eos_id=EOS,
            **({"user_defined_symbols": list(symbols)} if symbols else {}),
            max_sentence_length=1 << 16,
            num_threads=2,
            minloglevel=2,
        )
    except RuntimeError as e:
        # e.g. "Vocabulary size too high (8000). Please set it to a value <= 1234."
        reason = str(e).strip().splitlines()[-1]
        raise TokenizerError(
            f"tokenizer.vocab_size={cfg.vocab_size} cannot be trained on "
            f"{plural(len(lines), 'sentence')}: {reason}"
        ) from None
    return model.getvalue()


def sample_pairs(corpora: Sequence[Corpus], pairs: int, seed: int) -> tuple[list[str], list[str]]:
    """A seeded uniform sample of `pairs` pairs (0: all) over the corpora taken as one
    stream, cleaned; pairs with an empty side are left out. Only the sampled pairs are
    kept in memory, and the sample is the same whatever the chunk size."""
    total = sum(c.size for c in corpora)
    if pairs and pairs < total:
        chosen = np.sort(np.random.default_rng(seed).choice(total, pairs, replace=False))
    else:
        chosen = np.arange(total)
    src: list[str] = []
    tgt: list[str] = []
    start = 0  # index of the chunk's first pair in the whole stream
    for corpus in corpora:
        for chunk_src, chunk_tgt in corpus.chunks():
            end = start + len(chunk_src)
            lo, hi = np.searchsorted(chosen, [start, end])
            picked = (chosen[lo:hi] - start).tolist()
            s, t, keep = clean([chunk_src[i] for i in picked], [chunk_tgt[i] for i in picked])
            src += [x for x, k in zip(s, keep, strict=True) if k]
            tgt += [x for x, k in zip(t, keep, strict=True) if k]
            start = end
    return src, tgt


def write_vocab_files(model_proto: bytes, model_path: Path) -> None:
    """Write `x.model` and the human-readable `x.vocab` (piece<TAB>score) atomically."""
    sp = spm.SentencePieceProcessor(model_proto=model_proto)
    rows = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(len(sp)))
    write_atomic(model_path.with_suffix(".vocab"), rows.encode("utf-8"))
    write_atomic(model_path, model_proto)


def train_tokenizer(
    src: Sequence[str],
    tgt: Sequence[str],
    cfg: TokenizerConfig,
    run_dir: Path,
    tags: Sequence[str] = (),
    side: str = "source",
) -> list[Path]:
    """Train the joint model (or one per side) and write it into the run directory; the
    model of the `side` that reads a multilingual run's `tags` has them as pieces of
    their own."""
    src_path, tgt_path = vocab_paths(run_dir, cfg.joint)
    if cfg.joint:
        jobs = [(src_path, list(src) + list(tgt), tags)]
    else:
        jobs = [
            (src_path, list(src), tags if side == "source" else ()),
            (tgt_path, list(tgt), tags if side == "target" else ()),
        ]
    protos = [(path, train_sentencepiece(text, cfg, symbols)) for path, text, symbols in jobs]
    for path, proto in protos:  # write only once every model trained
        write_vocab_files(proto, path)
        log.info("wrote %s (%d pieces)", path, len(Vocab(proto)))
    return [path for path, _ in protos]


def build_tokenizer(cfg: Config) -> list[Path]:
    """The `mtkit tokenizer` stage: sample and clean training pairs (streamed, so the
    corpus never sits whole in memory), train, write RUN/spm.model (or spm.src/spm.tgt)
    and RUN/config.yaml. A joint model samples `input_sentence_size` sentences as half
    as many pairs; separate models take that many pairs, one side each."""
    if cfg.tokenizer.from_:
        return copy_tokenizers(cfg)
    if not cfg.data.corpora("train"):
        raise DataError("data.train is not set")
    run = cfg.run_path
    with run_lock(run, "tokenizer"):
        remove_leftovers(run, ("spm*", "config.yaml"))
        corpora = open_split(cfg.data, "train", run / "cache", cfg.model.lang_tag)
        tc = cfg.tokenizer
        size = tc.input_sentence_size
        src, tgt = sample_pairs(corpora, max(size // 2, 1) if size and tc.joint else size, tc.seed)
        if not src:
            raise DataError(
                f"{' and '.join(c.origin for c in corpora)}: no pairs left after cleaning"
            )
        log.debug(
            "training the tokenizer on %d sampled pairs of %d",
            len(src),
            sum(c.size for c in corpora),
        )
        paths = train_tokenizer(src, tgt, tc, run, tags(cfg.data), cfg.model.lang_tag)
        save_config(cfg, run / "config.yaml")
    return paths


def copy_tokenizers(cfg: Config) -> list[Path]:
    """`tokenizer.from: CKPT` (or a run directory: its checkpoints share one tokenizer,
    last.pt's is read): the checkpoint's SentencePiece models, and their id tables
    where its ids are a table's (an imported model), written where the run keeps its own
    (RUN/spm.model, or spm.src/spm.tgt, with spm.*.pieces.json), and RUN/config.yaml."""
    from mtkit.core.checkpoint import load_checkpoint

    source = cfg.tokenizer.from_
    if Path(source).is_dir():
        source = str(Path(source) / "checkpoints" / "last.pt")
    src, tgt = entry_vocabs(load_checkpoint(source, mmap=True)["vocab"])
    joint = src.same(tgt)
    if joint != cfg.tokenizer.joint:
        has = "one tokenizer" if joint else "a source and a target tokenizer"
        raise TokenizerError(
            f"tokenizer.from: {source} has {has}; set tokenizer.joint: {str(joint).lower()}"
        )
    run = cfg.run_path
    with run_lock(run, "tokenizer"):
        remove_leftovers(run, ("spm*", "config.yaml"))
        paths = dict(zip(vocab_paths(run, joint), (src, tgt), strict=True))
        for path, vocab in paths.items():
            if vocab.pieces is not None:
                write_atomic(
                    pieces_path(path), json.dumps(vocab.pieces, ensure_ascii=False).encode("utf-8")
                )
            write_vocab_files(vocab.model_proto, path)
            log.info("wrote %s (%d pieces) from %s", path, len(vocab), source)
        save_config(cfg, run / "config.yaml")
    return list(paths)
