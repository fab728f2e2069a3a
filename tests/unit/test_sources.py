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


# --- TMX translation memories ----------------------------------------------------------


def toolkit_tmx(path, pairs, src_lang="en-US", tgt_lang="de-DE"):
    """A TMX file written by translate-toolkit, one unit per pair."""
    from translate.storage.tmx import tmxfile

    store = tmxfile(sourcelanguage=src_lang, targetlanguage=tgt_lang)
    for src, tgt in pairs:
        store.addtranslation(src, src_lang, tgt, tgt_lang)
    data = bytes(store)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def tmx(path, units: str, prolog: str = "", header: str = '<header srclang="en"/>'):
    """A hand-written TMX file: `units` are the body's XML."""
    path.write_text(
        f'<?xml version="1.0" encoding="UTF-8"?>\n{prolog}<tmx version="1.4">{header}'
        f"<body>\n{units}\n</body></tmx>\n",
        encoding="utf-8",
    )
    return path


def tu(**sides: str) -> str:
    """A unit of one tuv per language: tu(en="a", de="b") (`_` in a name is `-`)."""
    return (
        "<tu>"
        + "".join(
            f'<tuv xml:lang="{lang.replace("_", "-")}"><seg>{seg}</seg></tuv>'
            for lang, seg in sides.items()
        )
        + "</tu>"
    )


TRICKY = [
    ('A dog & a <cat> say "hi".', "Ein Hund & eine <Katze> sagen „hi“."),
    ("Two men talk.", "Zwei Männer reden."),
    ("  spaced  out ", " ß ünd ø "),
    ("tab\there", "emoji 🐕"),
]


def test_tmx_written_by_translate_toolkit_reads_as_the_toolkit_reads_it(tmp_path):
    from translate.storage.tmx import tmxfile

    path = toolkit_tmx(tmp_path / "tm.tmx", TRICKY)
    with open(path, "rb") as f:
        theirs = [(u.source, u.target) for u in tmxfile(f).units]
    assert theirs == TRICKY  # what the toolkit wrote, its own reader gives back
    pairs = load_pairs(CorpusConfig(path=str(path)), "en", "de")
    assert list(zip(*pairs)) == theirs
    packed = toolkit_tmx(tmp_path / "tm.tmx.gz", TRICKY)
    assert load_pairs(CorpusConfig(path=str(packed)), "en", "de") == pairs
    # the codes in any case, with _ for -: the same tuvs; a language the file lacks: one line
    assert load_pairs(CorpusConfig(path=str(path)), "EN-us", "de_de") == pairs
    with pytest.raises(
        DataError,
        match=r"no unit has a text in 'fr' \(data.tgt_lang\); its "
        r"languages: en-US, de-DE",
    ):
        load_pairs(CorpusConfig(path=str(path)), "en", "fr")


def test_tmx_inline_codes_are_taken_out_with_their_native_code_and_hi_keeps_its_text(tmp_path):
    seg_en = (
        'Click <bpt i="1" x="1">&lt;b&gt;</bpt>here<ept i="1">&lt;/b&gt;</ept> '
        'now<ph x="2">&lt;img alt="<sub>a picture</sub>"/&gt;</ph>.'
        '<it pos="begin">&lt;i&gt;</it>Done<ut>{\\b}</ut>'
    )
    seg_de = 'Klicke <hi type="x-bold">hier <ph>{1}</ph>jetzt</hi>.'
    path = tmx(tmp_path / "tm.tmx", tu(en=seg_en, de=seg_de))
    assert load_pairs(CorpusConfig(path=str(path)), "en", "de") == (
        ["Click here now.Done"],
        ["Klicke hier jetzt."],
    )
    kept = load_pairs(CorpusConfig(path=str(path), tmx_inline="keep"), "en", "de")
    assert kept == ([seg_en], [seg_de])  # as the file writes them


def test_tmx_units_missing_a_side_are_empty_pairs_that_cleaning_drops(tmp_path):
    path = tmx(
        tmp_path / "tm.tmx",
        "\n".join(
            [
                tu(en="one", de="eins"),
                tu(en="only English"),
                "<tu><tuv xml:lang='de'><seg>nur Deutsch</seg></tuv></tu>",
                tu(en="empty German", de=""),
                "<tu><tuv xml:lang='de'/><tuv xml:lang='en'><seg>no seg</seg></tuv></tu>",
                "<tu/>",
                tu(en="two", de="zwei"),
            ]
        ),
    )
    src, tgt = load_pairs(CorpusConfig(path=str(path)), "en", "de")
    assert src == ["one", "only English", "", "empty German", "no seg", "", "two"]
    assert tgt == ["eins", "", "nur Deutsch", "", "", "", "zwei"]
    assert clean(src, tgt)[2].tolist() == [True, False, False, False, False, False, True]


def test_tmx_languages_by_region_case_and_tmx_1_1_lang_exact_before_region(tmp_path):
    units = [
        tu(en_US="us", DE_de="de-DE"),  # regions, in any case
        '<tu><tuv lang="EN"><seg>1.1</seg></tuv><tuv lang="de"><seg>eins</seg></tuv></tu>',
        tu(en_GB="gb", en="exact", fr="fr", de_AT="at", de_CH="ch"),  # three and more
        tu(fr="nur fr", de="de"),
        tu(english="not en", de="x"),  # "english" is not a region of "en"
        '<tu><tuv xml:lang="en" lang="fr"><seg>xml:lang first</seg></tuv>'
        '<tuv xml:lang="de"><prop type="x">p</prop><note>n</note>'
        "<seg>after a note</seg></tuv></tu>",
    ]
    path = tmx(tmp_path / "tm.tmx", "\n".join(units))
    src, tgt = load_pairs(CorpusConfig(path=str(path)), "en", "de")
    assert src == ["us", "1.1", "exact", "", "", "xml:lang first"]
    assert tgt == ["de-DE", "eins", "at", "de", "x", "after a note"]
    # fr-en from the same file: the other tuvs of the three-language unit
    src, tgt = load_pairs(CorpusConfig(path=str(path)), "fr", "en-gb")
    assert src == ["", "", "fr", "nur fr", "", ""] and tgt == ["", "", "gb", "", "", ""]


def test_tmx_entities_are_never_fetched_nor_expanded(tmp_path):
    import http.server
    import threading

    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    asked = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'<!ENTITY remote "REMOTE">')

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    prolog = (
        f'<!DOCTYPE tmx SYSTEM "{url}/tmx14.dtd" [\n'
        f'  <!ENTITY file SYSTEM "file://{secret}">\n'
        f'  <!ENTITY web SYSTEM "{url}/entity">\n'
        f'  <!ENTITY % dtd SYSTEM "{url}/param.dtd"> %dtd;\n'
        '  <!ENTITY lol "lol">\n'
        '  <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">\n'
        '  <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">\n'
        "]>\n"
    )
    units = tu(en="a &file; b &web; c &lol3; &remote; d", de="&amp; &lt;&gt; &#233;&#x10348;")
    path = tmx(tmp_path / "tm.tmx", units, prolog)
    try:
        pairs = load_pairs(CorpusConfig(path=str(path)), "en", "de")
    finally:
        server.shutdown()
    assert pairs == (["a  b  c   d"], ["& <> é𐍈"])  # XML's own entities and characters only
    assert asked == []


def test_tmx_malformed_or_damaged_is_one_line_naming_the_file_and_the_line(tmp_path):
    path = tmx(
        tmp_path / "bad.tmx", tu(en="a", de="b") + "\n" + "<tu><tuv xml:lang='en'><seg>x</tuv></tu>"
    )
    with pytest.raises(DataError) as e:
        load_pairs(CorpusConfig(path=str(path)), "en", "de")
    assert str(e.value).startswith(f"{path}: malformed XML at line 4: Opening and ending tag ")
    assert "\n" not in str(e.value)
    entity = tmx(tmp_path / "undeclared.tmx", tu(en="a", de="b") + "\n" + tu(en="&nbsp;", de="c"))
    with pytest.raises(DataError) as e:
        load_pairs(CorpusConfig(path=str(entity)), "en", "de")
    assert str(e.value) == f"{entity}: malformed XML at line 4: Entity 'nbsp' not defined"
    not_tmx = tmp_path / "x.tmx"
    not_tmx.write_text("<xliff><file/></xliff>")
    with pytest.raises(DataError, match=r"x.tmx: not a TMX file \(its root element is <xliff>"):
        open_corpus(CorpusConfig(path=str(not_tmx)), "en", "de")
    deep = tmx(tmp_path / "deep.tmx", tu(en="<hi>" * 300 + "x" + "</hi>" * 300, de="y"))
    with pytest.raises(
        DataError, match=r"deep.tmx: malformed XML at line 3: Excessive depth in document: 256"
    ):
        load_pairs(CorpusConfig(path=str(deep)), "en", "de")  # libxml2's bound holds
    empty = tmp_path / "empty.tmx"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=r"empty.tmx: malformed XML at line 1"):
        open_corpus(CorpusConfig(path=str(empty)), "en", "de")
    with pytest.raises(DataError, match=r"nope.tmx: no such file"):
        open_corpus(CorpusConfig(path=str(tmp_path / "nope.tmx")), "en", "de")
    big = toolkit_tmx(tmp_path / "big.tmx.gz", [(f"s {i}", f"t {i}") for i in range(3000)])
    cut = tmp_path / "cut.tmx.gz"
    cut.write_bytes(big.read_bytes()[: big.stat().st_size // 2])
    with pytest.raises(DataError) as e:
        load_pairs(CorpusConfig(path=str(cut)), "en", "de", size=1000)
    assert str(e.value).startswith(f"{cut}: corrupt or truncated gzip data after line ")
    assert "Compressed file ended" in str(e.value) and "\n" not in str(e.value)


def test_tmx_count_from_the_bytes_is_exact_or_left_to_the_parser(tmp_path):
    from mtkit.data.sources import TmxReader, _quick_unit_count

    def counts(path):
        with open(path, "rb") as f:
            quick = _quick_unit_count(f)
        parsed = sum(1 for _ in TmxReader(str(path), "en", "de").units())
        return quick, parsed, open_corpus(CorpusConfig(path=str(path)), "en", "de").size

    units = "\n".join([tu(en="a", de="b"), "<tu\ttuid='2'/>", '<tu\nsrclang="en"></tu>'])
    plain = tmx(tmp_path / "plain.tmx", units, '<!DOCTYPE tmx SYSTEM "tmx14.dtd">\n')
    assert counts(plain) == (3, 3, 3)
    hidden = [  # a "<tu" that is no unit: the bytes cannot tell, lxml counts
        ("comment.tmx", units + "<!-- <tu> <tu/> -->", 3),
        ("cdata.tmx", units + tu(en="<![CDATA[<tu > x]]>", de="y"), 4),
        ("pi.tmx", units + "<?tu <tu ?>", 3),
    ]
    for name, body, n in hidden:
        assert counts(tmx(tmp_path / name, body)) == (None, n, n)
    cdata = load_pairs(CorpusConfig(path=str(tmp_path / "cdata.tmx")), "en", "de")
    assert cdata == (["a", "", "", "<tu > x"], ["b", "", "", "y"])
    subset = tmx(tmp_path / "subset.tmx", units, '<!DOCTYPE tmx [<!ENTITY x "<tu>">]>\n')
    assert counts(subset) == (None, 3, 3)
    utf16 = tmp_path / "utf16.tmx"
    utf16.write_bytes(plain.read_text().replace("UTF-8", "UTF-16").encode("utf-16"))
    assert counts(utf16) == (None, 3, 3)
    assert load_pairs(CorpusConfig(path=str(utf16)), "en", "de") == (["a", "", ""], ["b", "", ""])


def test_tmx_reading_keeps_only_the_unit_at_hand(tmp_path):
    from mtkit.data.sources import TmxReader

    path = toolkit_tmx(tmp_path / "tm.tmx", [(f"s {i}", f"t {i}") for i in range(50)])
    seen = 0
    for unit in TmxReader(str(path), "en", "de").units():
        before = list(unit.itersiblings(preceding=True))
        assert len(before) == (1 if seen else 0)  # the previous unit at most, ...
        assert all(len(x) == 0 and not x.attrib for x in before)  # ... cleared
        assert len(unit) == 2  # the unit at hand whole
        seen += 1
    assert seen == 50
