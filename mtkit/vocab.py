"""Token ids: the fixed special ids, the `Vocab` wrapper of a SentencePiece model, and
where a run keeps its models. Every layer that handles ids takes them from here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import sentencepiece as spm

from mtkit.errors import UserError

PAD, UNK, BOS, EOS = 0, 1, 2, 3


class VocabError(UserError, ValueError):
    """A SentencePiece model that mtkit cannot use (one line)."""


class Vocab:
    """A SentencePiece model with mtkit's fixed special ids (pad 0, unk 1, bos 2, eos 3)."""

    def __init__(self, model_proto: bytes):
        self.model_proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self.model_proto)
        ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if ids != (PAD, UNK, BOS, EOS):
            raise VocabError(f"SentencePiece model has special ids {ids}, mtkit needs "
                             f"pad=0 unk=1 bos=2 eos=3; retrain it with `mtkit tokenizer`")

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        return cls(Path(path).read_bytes())

    def __len__(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Sentences -> subword ids, without bos/eos (the batch adds those)."""
        return self._sp.encode(list(texts), out_type=int, num_threads=num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> detokenized text; special ids are dropped, decoding stops at eos."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i > EOS:
                out.append(i)
        return self._sp.decode(out)

    def piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    def piece_id(self, piece: str) -> int:
        return self._sp.piece_to_id(piece)


def vocab_paths(run_dir: Path, joint: bool) -> tuple[Path, Path]:
    """Where the source and target models live: one file when joint, two otherwise."""
    if joint:
        return run_dir / "spm.model", run_dir / "spm.model"
    return run_dir / "spm.src.model", run_dir / "spm.tgt.model"


def load_vocabs(run_dir: Path, joint: bool) -> tuple[Vocab, Vocab]:
    """The source and target vocabularies of a run (the same object when joint)."""
    src_path, tgt_path = vocab_paths(run_dir, joint)
    for p in {src_path, tgt_path}:
        if not p.exists():
            raise FileNotFoundError(f"{p} not found; run `mtkit tokenizer` first")
    src = Vocab.load(src_path)
    return src, (src if joint else Vocab.load(tgt_path))
