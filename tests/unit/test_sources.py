from __future__ import annotations

import gzip
import json

import pytest

from mtkit.config import CorpusConfig
from mtkit.data.sources import DataError, Pairs, clean_pairs, load_pairs

from conftest import write_lines

EN = ["A dog runs.", "Two men talk.", "A girl sings."]
DE = ["Ein Hund rennt.", "Zwei Männer reden.", "Ein Mädchen singt."]


def test_two_text_files_plain_and_gzip(tmp_path):
    src = write_lines(tmp_path / "a.en.gz", EN)
    tgt = write_lines(tmp_path / "a.de", DE)
    pairs = load_pairs(CorpusConfig(src=str(src), tgt=str(tgt)), "en", "de", tmp_path / "c")
    assert (pairs.src, pairs.tgt) == (EN, DE)


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
    assert pairs.src == ["x", "", "z"] and pairs.tgt == ["X", "Y", ""]


def test_tsv_with_header_and_a_tab_free_layout(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("src\ttgt\n" + "".join(f"{e}\t{d}\n" for e, d in zip(EN, DE)))
    pairs = load_pairs(CorpusConfig(path=str(path)), "en", "de", tmp_path / "c")
    assert (pairs.src, pairs.tgt) == (EN, DE)


def test_jsonl_with_named_columns_and_translation_dicts(tmp_path):
    cols = tmp_path / "cols.jsonl"
    cols.write_text("".join(json.dumps({"en": e, "de": d}) + "\n" for e, d in zip(EN, DE)))
    pairs = load_pairs(CorpusConfig(path=str(cols), src_col="en", tgt_col="de"), "en", "de",
                       tmp_path / "c")
    assert (pairs.src, pairs.tgt) == (EN, DE)
    hub_like = tmp_path / "tr.jsonl"
    hub_like.write_text("".join(json.dumps({"translation": {"en": e, "de": d}}) + "\n"
                                for e, d in zip(EN, DE)))
    pairs = load_pairs(CorpusConfig(path=str(hub_like)), "en", "de", tmp_path / "c")
    assert (pairs.src, pairs.tgt) == (EN, DE)
    with pytest.raises(DataError, match=r"translation column has keys \['de', 'en'\]"):
        load_pairs(CorpusConfig(path=str(hub_like)), "en", "fr", tmp_path / "c")


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"src": EN, "tgt": DE}), path)
    pairs = load_pairs(CorpusConfig(path=str(path)), "en", "de", tmp_path / "c")
    assert (pairs.src, pairs.tgt) == (EN, DE)


def test_hub_code_path_on_a_local_dataset_folder(tmp_path):
    folder = tmp_path / "wmt_like"
    folder.mkdir()
    rows = "".join(json.dumps({"translation": {"de": d, "en": e}}) + "\n" for e, d in zip(EN, DE))
    (folder / "validation.jsonl").write_text(rows)
    corpus = CorpusConfig(hub=str(folder), split="validation")
    pairs = load_pairs(corpus, "en", "de", tmp_path / "c")
    assert (pairs.src, pairs.tgt) == (EN, DE)


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
    with pytest.raises(DataError, match=r"bad.en.gz: cannot read") as e:
        load_pairs(CorpusConfig(src=str(bad_gz), tgt=str(good)), "en", "de", tmp_path / "c")
    assert "\n" not in str(e.value)
    latin = tmp_path / "latin.en"
    latin.write_bytes("Männer\nA\nB\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin.en: not valid UTF-8"):
        load_pairs(CorpusConfig(src=str(latin), tgt=str(good)), "en", "de", tmp_path / "c")
    with pytest.raises(DataError, match=r"unknown file type '.csv'"):
        load_pairs(CorpusConfig(path=str(good) + ".csv"), "en", "de")


def test_gzip_is_really_decompressed(tmp_path):
    path = tmp_path / "x.en.gz"
    with gzip.open(path, "wt") as f:
        f.write("Hallo\n")
    pairs = load_pairs(CorpusConfig(src=str(path), tgt=str(path)), "en", "de", tmp_path / "c")
    assert pairs.src == ["Hallo"]


def test_cleaning_strips_drops_empty_and_dedups_with_counts():
    pairs = Pairs([" a  b ", "", "c", "a b", "d"], ["x", "y", " ", "x", "z\tq"], "test")
    cleaned = clean_pairs(pairs, dedup=True)
    assert cleaned.src == ["a b", "d"] and cleaned.tgt == ["x", "z q"]
    assert cleaned.report == {"empty": 2, "duplicate": 1}
    kept = clean_pairs(pairs, dedup=False)
    assert kept.src == ["a b", "a b", "d"] and kept.report["duplicate"] == 0
