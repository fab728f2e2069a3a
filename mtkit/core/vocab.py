"""Token ids: the fixed special ids, the `Vocab` wrapper of a SentencePiece model, and
where a run keeps its models. Every layer that handles ids takes them from here."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import sentencepiece as spm

from mtkit.core.errors import UserError

PAD, UNK, BOS, EOS = 0, 1, 2, 3
TAG = re.compile(">>.*?<<")  # a Marian target-language tag at a line's start


class VocabError(UserError, ValueError):
    """A SentencePiece model that mtkit cannot use (one line)."""


class Vocab:
    """A SentencePiece model with mtkit's fixed special ids (pad 0, unk 1, bos 2, eos 3).

    With `pieces`, the ids are not SentencePiece's own but a table's: `pieces[i]` is the
    piece of id i (an imported model's vocabulary, `mtkit.interop.marian_import`, its
    special ids moved to mtkit's): SentencePiece only segments the text, and a piece
    missing from the
    table is unk.

    `languages` (a multilingual model's target vocabulary): for each language it
    translates into, the ids of the pieces its training text uses
    (`languages.output_vocabularies`); translation may keep its outputs to them."""

    def __init__(
        self,
        model_proto: bytes,
        pieces: Sequence[str] | None = None,
        languages: dict[str, list[int]] | None = None,
    ):
        self.model_proto = bytes(model_proto)
        self.languages = dict(languages or {})
        self._sp = spm.SentencePieceProcessor(model_proto=self.model_proto)
        self.pieces = None if pieces is None else list(pieces)
        if self.pieces is not None:
            self._ids = {p: i for i, p in enumerate(self.pieces)}
            return
        ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if ids != (PAD, UNK, BOS, EOS):
            raise VocabError(
                f"SentencePiece model has special ids {ids}, mtkit needs "
                f"pad=0 unk=1 bos=2 eos=3; retrain it with `mtkit tokenizer`"
            )

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        """RUN/spm.model, with its id table RUN/spm.pieces.json where it has one."""
        table = pieces_path(Path(path))
        pieces = json.loads(table.read_text(encoding="utf-8")) if table.is_file() else None
        return cls(Path(path).read_bytes(), pieces)

    def __len__(self) -> int:
        return self._sp.get_piece_size() if self.pieces is None else len(self.pieces)

    def encode(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Sentences -> subword ids, without bos/eos (the batch adds those)."""
        if self.pieces is None:
            return self._sp.encode(list(texts), out_type=int, num_threads=num_threads)
        # A table's leading target-language tag (OPUS-MT's ">>fra<<") is one piece, the
        # rest of the line is segmented without it, as Marian's tokenizer does.
        tags = [TAG.match(t) for t in texts]
        rest = [t[m.end() :] if m else t for t, m in zip(texts, tags, strict=True)]
        lines = self._sp.encode(rest, out_type=str, num_threads=num_threads)
        return [
            ([self._ids.get(m.group(0), UNK)] if m else []) + [self._ids.get(p, UNK) for p in line]
            for m, line in zip(tags, lines, strict=True)
        ]

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> detokenized text; special ids are dropped, decoding stops at eos."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i > EOS:
                out.append(i)
        if self.pieces is None:
            return self._sp.decode(out)
        # A table's pieces may come from another SentencePiece model (Marian shares one
        # table between two): a piece this model does not know keeps its word-start
        # marker, so it is turned into a space here, as Marian's own tokenizer does.
        text = self._sp.decode_pieces([self.pieces[i] for i in out])
        return text.replace("\u2581", " ").strip()

    def piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i)) if self.pieces is None else self.pieces[int(i)]

    def piece_id(self, piece: str) -> int:
        return self._sp.piece_to_id(piece) if self.pieces is None else self._ids.get(piece, UNK)

    def same(self, other: Vocab) -> bool:
        """The same segmentation and the same ids."""
        return (self.model_proto, self.pieces) == (other.model_proto, other.pieces)


def vocab_entry(src: Vocab, tgt: Vocab, languages: dict[str, list[int]] | None = None) -> dict:
    """A checkpoint's "vocab": each side's SentencePiece model, where its ids are a
    table's the table (`src_pieces`, `tgt_pieces`), and a multilingual model's target
    `languages` (`Vocab`; the target vocabulary's own where not given)."""
    entry: dict = {"src": src.model_proto, "tgt": tgt.model_proto}
    for side, vocab in (("src", src), ("tgt", tgt)):
        if vocab.pieces is not None:
            entry[f"{side}_pieces"] = vocab.pieces
    languages = tgt.languages if languages is None else languages
    if languages:
        entry["tgt_languages"] = {
            lang: [int(i) for i in ids] for lang, ids in sorted(languages.items())
        }
    return entry


def entry_vocabs(entry: dict) -> tuple[Vocab, Vocab]:
    """The source and target vocabularies of a checkpoint's "vocab" (`vocab_entry`)."""
    src = Vocab(entry["src"], entry.get("src_pieces"))
    same = entry["tgt"] == entry["src"] and entry.get("tgt_pieces") == entry.get("src_pieces")
    tgt = (
        Vocab(entry["tgt"], entry.get("tgt_pieces"))
        if not same or entry.get("tgt_languages")
        else src
    )
    tgt.languages = dict(entry.get("tgt_languages") or {})
    return src, tgt


def pieces_path(model_path: Path) -> Path:
    """Where a run keeps the id table of a SentencePiece model whose ids are a table's
    (`tokenizer.from` an imported model): spm.model -> spm.pieces.json."""
    return model_path.with_suffix(".pieces.json")


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
