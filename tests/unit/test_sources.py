from __future__ import annotations

import gzip
import io
import json

import numpy as np
import pytest

from mtkit.core.config import CorpusConfig, DataConfig
from mtkit.data.sources import (
    DataError,
    SeenHashes,
    clean,
    count_lines,
    line_count,
    open_corpus,
    open_split,
    pair_hashes,
)

from conftest import write_lines


def load_pairs(corpus: CorpusConfig, src_lang: str, tgt_lang: str, cache=None, size=2):
    """All of a corpus's pairs, read through its chunks (of `size` pairs)."""
    opened = open_corpus(corpus, src_lang, tgt_lang, cache)
    src, tgt = [], []
    for s, t in opened.chunks(size):
        assert len(s) == len(t) <= size
        src += s
        tgt += t
    assert len(src) == opened.size
    return src, tgt


EN = ["A dog runs.", "Two men talk.", "A girl sings."]
DE = ["Ein Hund rennt.", "Zwei Männer reden.", "Ein Mädchen singt."]


def test_two_text_files_plain_and_gzip(tmp_path):
    src = write_lines(tmp_path / "a.en.gz", EN)
    tgt = write_lines(tmp_path / "a.de", DE)
    pairs = load_pairs(CorpusConfig(src=str(src), tgt=str(tgt)), "en", "de", tmp_path / "c")
    assert pairs == (EN, DE)


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    src = write_lines(tmp_path / "a.en", EN)
    tgt = write_lines(tmp_path / "a.de", DE[:2])
    with pytest.raises(DataError) as e:
        load_pairs(CorpusConfig(src=str(src), tgt=str(tgt)), "en", "de", tmp_path / "c")
    assert str(e.value) == f"line counts differ: {src} has 3 lines, {tgt} has 2"


def test_empty_lines_keep_alignment(tmp_path):
    src = write_lines(tmp_path / "a.en", ["x", "", "z"])
    tgt = write_lines(tmp_path / "a.de", ["X", "Y", ""])
    pairs = load_pairs(CorpusConfig(src=str(src), tgt=str(tgt)), "en", "de", tmp_path / "c")
    assert pairs == (["x", "", "z"], ["X", "Y", ""])


def test_tsv_with_header_and_a_tab_free_layout(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("src\ttgt\n" + "".join(f"{e}\t{d}\n" for e, d in zip(EN, DE)))
    pairs = load_pairs(CorpusConfig(path=str(path)), "en", "de", tmp_path / "c")
    assert pairs == (EN, DE)


def test_jsonl_with_named_columns_and_translation_dicts(tmp_path):
    cols = tmp_path / "cols.jsonl"
    cols.write_text("".join(json.dumps({"en": e, "de": d}) + "\n" for e, d in zip(EN, DE)))
    pairs = load_pairs(
        CorpusConfig(path=str(cols), src_col="en", tgt_col="de"), "en", "de", tmp_path / "c"
    )
    assert pairs == (EN, DE)
    hub_like = tmp_path / "tr.jsonl"
    hub_like.write_text(
        "".join(json.dumps({"translation": {"en": e, "de": d}}) + "\n" for e, d in zip(EN, DE))
    )
    pairs = load_pairs(CorpusConfig(path=str(hub_like)), "en", "de", tmp_path / "c")
    assert pairs == (EN, DE)
    with pytest.raises(DataError, match=r"translation column has keys \['de', 'en'\]"):
        load_pairs(CorpusConfig(path=str(hub_like)), "en", "fr", tmp_path / "c")


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"src": EN, "tgt": DE}), path)
    pairs = load_pairs(CorpusConfig(path=str(path)), "en", "de", tmp_path / "c")
    assert pairs == (EN, DE)


def test_hub_code_path_on_a_local_dataset_folder(tmp_path):
    folder = tmp_path / "wmt_like"
    folder.mkdir()
    rows = "".join(json.dumps({"translation": {"de": d, "en": e}}) + "\n" for e, d in zip(EN, DE))
    (folder / "validation.jsonl").write_text(rows)
    corpus = CorpusConfig(hub=str(folder), split="validation")
    pairs = load_pairs(corpus, "en", "de", tmp_path / "c")
    assert pairs == (EN, DE)


def test_missing_columns_are_named(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"a": "x", "b": "y"}) + "\n")
    with pytest.raises(DataError, match=r"no columns 'src' and 'tgt' .*it has \['a', 'b'\]"):
        load_pairs(CorpusConfig(path=str(path)), "en", "de", tmp_path / "c")


def test_missing_file_unreadable_gzip_and_invalid_utf8_are_one_line_errors(tmp_path):
    good = write_lines(tmp_path / "good.de", DE)
    with pytest.raises(DataError, match=r"nope.en: no such file"):
        load_pairs(CorpusConfig(src=str(tmp_path / "nope.en"), tgt=str(good)), "en", "de")
    bad_gz = tmp_path / "bad.en.gz"
    bad_gz.write_bytes(b"\x1f\x8b\x08\x00garbage that is not deflate")
    with pytest.raises(
        DataError,
        match=r"bad.en.gz: corrupt or truncated gzip data at "
        r"line 1 ",
    ) as e:
        load_pairs(CorpusConfig(src=str(bad_gz), tgt=str(good)), "en", "de", tmp_path / "c")
    assert "\n" not in str(e.value)
    latin = tmp_path / "latin.en"
    latin.write_bytes("Männer\nA\nB\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin.en: line 1 is not valid UTF-8 \(byte 1"):
        load_pairs(CorpusConfig(src=str(latin), tgt=str(good)), "en", "de", tmp_path / "c")
    with pytest.raises(DataError, match=r"unknown file type '.csv'"):
        load_pairs(CorpusConfig(path=str(good) + ".csv"), "en", "de")


def test_gzip_is_really_decompressed(tmp_path):
    path = tmp_path / "x.en.gz"
    with gzip.open(path, "wt") as f:
        f.write("Hallo\n")
    pairs = load_pairs(CorpusConfig(src=str(path), tgt=str(path)), "en", "de", tmp_path / "c")
    assert pairs[0] == ["Hallo"]


def test_cleaning_strips_and_marks_pairs_with_an_empty_side():
    src, tgt, keep = clean([" a  b ", "", "c", "a b", "d"], ["x", "y", " ", "x", "z\tq"])
    assert src == ["a b", "", "c", "a b", "d"] and tgt == ["x", "y", "", "x", "z q"]
    assert keep.tolist() == [True, False, False, True, True]


def test_dedup_by_hash_equals_exact_dedup_across_chunks():
    rng = np.random.default_rng(0)
    src = [f"s{i}" for i in rng.integers(0, 300, 2000)]
    tgt = [f"t{int(x[1:]) % 250}" for x in src]  # some sources share a target
    exact, seen_pairs = [], set()
    for pair in zip(src, tgt):
        exact.append(pair not in seen_pairs)
        seen_pairs.add(pair)
    seen = SeenHashes()
    by_hash = np.concatenate(
        [
            seen.first_seen(pair_hashes(src[i : i + 137], tgt[i : i + 137]))
            for i in range(0, len(src), 137)
        ]
    )
    assert by_hash.tolist() == exact and len(seen) == len(seen_pairs) < 300
    assert pair_hashes(["a"], ["b c"])[0] != pair_hashes(["a b"], ["c"])[0]
    assert pair_hashes(["a"], ["b"]).dtype == np.uint64


def test_a_damaged_gzip_is_one_line_naming_the_file_and_the_line(tmp_path):
    path = write_lines(
        tmp_path / "big.en.gz", [f"line {i} " + "x" * (i % 50) for i in range(20000)]
    )
    data = path.read_bytes()
    cut = tmp_path / "cut.en.gz"
    cut.write_bytes(data[: len(data) // 2])  # a download or copy that stopped half-way
    with pytest.raises(
        DataError,
        match=r"cut.en.gz: corrupt or truncated gzip data at "
        r"line \d+ \(Compressed file ended",
    ) as e:
        open_corpus(CorpusConfig(src=str(cut), tgt=str(cut)), "en", "de")
    line = int(str(e.value).split("at line ")[1].split()[0])
    assert 5000 < line < 15000
    with gzip.open(cut, "rt") as f:  # the lines before it are whole; that one is cut
        before = [next(f) for _ in range(line - 1)]
    assert before[-1] == f"line {line - 2} " + "x" * ((line - 2) % 50) + "\n"
    damaged = bytearray(data)
    damaged[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
    (tmp_path / "bad.en.gz").write_bytes(bytes(damaged))
    with pytest.raises(DataError, match=r"bad.en.gz: corrupt or truncated gzip data at line"):
        open_corpus(CorpusConfig(src=str(tmp_path / "bad.en.gz"), tgt=str(path)), "en", "de")


def test_a_split_of_several_corpora_opens_each_with_its_weight(tmp_path):
    a = write_lines(tmp_path / "a.en", EN), write_lines(tmp_path / "a.de", DE)
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"src": "x", "tgt": "y"}) + "\n")
    cfg = DataConfig(
        train=(CorpusConfig(src=str(a[0]), tgt=str(a[1])), CorpusConfig(path=str(b), weight=3))
    )
    corpora = open_split(cfg, "train", tmp_path / "c")
    assert [(c.size, c.weight) for c in corpora] == [(3, 1), (1, 3)]
    assert open_split(cfg, "valid") == []


def test_one_line_counter_counts_a_last_line_without_its_newline(tmp_path):
    across_blocks = b"ab\n" * 400_000 + b"c"  # 1.2 MB: more than one block read
    for data, lines in (
        (b"", 0),
        (b"a\n", 1),
        (b"a\nb", 2),
        (b"\n\n", 2),
        (across_blocks, 400_001),
    ):
        assert line_count(io.BytesIO(data)) == lines
    plain, packed = tmp_path / "a.txt", tmp_path / "a.txt.gz"
    plain.write_bytes(b"one\ntwo\nthree")
    packed.write_bytes(gzip.compress(b"one\ntwo\nthree"))
    assert count_lines(str(plain)) == count_lines(str(packed)) == 3
