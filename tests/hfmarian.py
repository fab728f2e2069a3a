"""Tiny random Marian (OPUS-MT) models in the Hugging Face layout, built with
`transformers` for the import tests, and `transformers`' own translations of them with
mtkit's search. Nothing is downloaded."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import sentencepiece as spm
import torch
import transformers

DATA = Path(__file__).resolve().parents[1] / "data" / "multi30k"
LIMIT = 20  # output tokens before the forced eos, on both sides


def lines(name: str, n: int) -> list[str]:
    with gzip.open(DATA / f"{name}.gz", "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


def sentencepiece(folder: Path, side: str, corpus: str) -> list[str]:
    """A SentencePiece model as OPUS-MT ships them (unk 0, eos 1, no bos or pad), trained
    on 400 lines; returns its ordinary pieces."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines(corpus, 400)),
        model_prefix=str(folder / side),
        vocab_size=200,
        model_type="unigram",
        character_coverage=1.0,
        bos_id=-1,
        eos_id=1,
        unk_id=0,
        pad_id=-1,
        minloglevel=2,
    )
    (folder / f"{side}.model").rename(folder / f"{side}.spm")
    sp = spm.SentencePieceProcessor(model_file=str(folder / f"{side}.spm"))
    return [
        sp.id_to_piece(i)
        for i in range(sp.get_piece_size())
        if not (sp.is_control(i) or sp.is_unknown(i))
    ]


def table(pieces: list[str]) -> dict[str, int]:
    """A vocab.json: </s> 0, <unk> 1, the pieces, <pad> last (OPUS-MT's order)."""
    out = {"</s>": 0, "<unk>": 1}
    for p in pieces:
        out.setdefault(p, len(out))
    out["<pad>"] = len(out)
    return out


def marian_folder(
    folder: Path, activation: str = "swish", shared: bool = True, seed: int = 0
) -> Path:
    """A tiny random Marian model in the Hugging Face layout, with peaked distributions
    (weights x 8, a random logits bias) so that outputs depend on every weight."""
    folder.mkdir(parents=True)
    src, tgt = (
        sentencepiece(folder, "source", "train.en"),
        sentencepiece(folder, "target", "train.de"),
    )
    src_table = table(src + tgt) if shared else table(src)
    (folder / "vocab.json").write_text(json.dumps(src_table, ensure_ascii=False))
    sizes = {"vocab_size": len(src_table)}
    if not shared:
        tgt_table = table(tgt)
        (folder / "target_vocab.json").write_text(json.dumps(tgt_table, ensure_ascii=False))
        sizes["decoder_vocab_size"] = len(tgt_table)
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "de", "separate_vocabs": not shared})
    )
    pad = len(src_table) - 1 if shared else len(tgt_table) - 1
    cfg = transformers.MarianConfig(
        **sizes,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=256,
        activation_function=activation,
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        share_encoder_decoder_embeddings=shared,
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 0.5)
        for p in model.parameters():
            p.mul_(8.0)
    model.save_pretrained(folder)
    return folder


def generate(folder: Path, sources: list[str], beam: int) -> list[str]:
    """`transformers`' translations with mtkit's search: plain log-probability (length
    penalty 0), pad never chosen, eos not first, at most LIMIT tokens then eos, and a
    sentence done once no open beam can beat its best (early_stopping=False)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = transformers.MarianTokenizer.from_pretrained(folder)
        model = transformers.MarianMTModel.from_pretrained(folder).eval()
        pad = model.config.pad_token_id
        with torch.no_grad():
            out = model.generate(
                **tok(sources, return_tensors="pt", padding=True),
                num_beams=beam,
                do_sample=False,
                early_stopping=False,
                max_new_tokens=LIMIT + 1,
                min_new_tokens=1,
                bad_words_ids=[[pad]],
                forced_eos_token_id=0,
                **({"length_penalty": 0.0} if beam > 1 else {}),
            )
        return tok.batch_decode(out, skip_special_tokens=True)
