"""A TMX translation memory read as a corpus, against the same pairs as two text files:
pairs/s and peak memory.

    python benchmarks/tmx_stream.py [--units 1000000] [--small 100000] [--gzip]
                                    [--preprocess N] [--keep DIR]

Builds, in a temporary folder (or DIR), a TMX file of `--units` units and the same pairs
as two text files: the embedded Multi30k training pairs, again and again, each with a
numbered suffix (" 17" on both sides) so no two units are equal; each unit as CAT tools
write it (a tuid, an en-US and a de-DE tuv, one line per element). The same for `--small`
units, to compare peak memory (flat: the same at both sizes).

Each reading runs in a process of its own (peak RSS from wait4): `open_corpus` (which
counts the pairs) and every chunk read, alone ("read"), and with each chunk cleaned as
preprocess's encoder cleans it ("read+clean", the reading path of `mtkit preprocess` and
`mtkit tokenizer` up to the encoding). Beside them, lxml's iterparse over the same TMX
with no work per unit ("parse floor"): the speed no TMX reader built on it passes.
`--gzip` reads the TMX as .tmx.gz too. `--preprocess N` also runs `mtkit preprocess`
(data.workers 2) on the first N pairs both ways, after one `mtkit tokenizer` on the text
files whose model both runs use: wall seconds, pairs/s, peak RSS (wait4's: the largest of
the command's processes) and whether both wrote the same shards. Prints a
table and one JSON line. Goals: TMX at least 50% of the text files' pairs/s; peak RSS at
`--units` within 10% (or 20 MB) of `--small`'s.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / "data" / "multi30k"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def build(folder: Path, units: int, gz: bool) -> dict[str, Path]:
    """`units` pairs as one TMX file (and its .gz) and as two text files."""
    with gzip.open(DATA / "train.en.gz", "rt", encoding="utf-8") as f:
        en = f.read().splitlines()
    with gzip.open(DATA / "train.de.gz", "rt", encoding="utf-8") as f:
        de = f.read().splitlines()
    paths = {
        "tmx": folder / f"tm{units}.tmx",
        "en": folder / f"tm{units}.en",
        "de": folder / f"tm{units}.de",
    }
    with (
        open(paths["tmx"], "w", encoding="utf-8") as tmx,
        open(paths["en"], "w", encoding="utf-8") as src,
        open(paths["de"], "w", encoding="utf-8") as tgt,
    ):
        tmx.write(
            '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE tmx SYSTEM "tmx14.dtd">\n'
            '<tmx version="1.4">\n  <header creationtool="tmx_stream" creationtoolversion="1" '
            'segtype="sentence" o-tmf="x" adminlang="en" srclang="en-US" '
            'datatype="plaintext"/>\n  <body>\n'
        )
        for i in range(units):
            e, d = f"{en[i % len(en)]} {i}", f"{de[i % len(de)]} {i}"
            tmx.write(
                f'    <tu tuid="{i}">\n'
                f'      <tuv xml:lang="en-US"><seg>{html.escape(e, quote=False)}</seg></tuv>\n'
                f'      <tuv xml:lang="de-DE"><seg>{html.escape(d, quote=False)}</seg></tuv>\n'
                f"    </tu>\n"
            )
            src.write(e + "\n")
            tgt.write(d + "\n")
        tmx.write("  </body>\n</tmx>\n")
    if gz:
        paths["tmx.gz"] = folder / f"tm{units}.tmx.gz"
        with open(paths["tmx"], "rb") as f, gzip.open(paths["tmx.gz"], "wb", 6) as out:
            shutil.copyfileobj(f, out, 1 << 20)
    return paths


def read(kind: str, paths: list[str], clean_too: bool) -> dict:
    """In the child process: open the corpus and read every chunk (cleaned, with
    `clean_too`); or, for kind "floor", lxml's iterparse alone."""
    from mtkit.core.config import CorpusConfig
    from mtkit.data.sources import clean, open_corpus

    start = time.perf_counter()
    if kind == "floor":
        from lxml import etree

        pairs = 0
        for _, tu in etree.iterparse(
            paths[0], events=("end",), tag="tu", resolve_entities=False, load_dtd=False
        ):
            pairs += 1
            tu.clear()
            while tu.getprevious() is not None:
                del tu.getparent()[0]
        return {"pairs": pairs, "seconds": time.perf_counter() - start, "open_seconds": 0.0}
    corpus = (
        CorpusConfig(src=paths[0], tgt=paths[1]) if kind == "text" else CorpusConfig(path=paths[0])
    )
    opened = open_corpus(corpus, "en", "de")
    counted = time.perf_counter()
    pairs = 0
    for src, tgt in opened.chunks():
        if clean_too:
            clean(src, tgt)
        pairs += len(src)
    assert pairs == opened.size, (pairs, opened.size)
    end = time.perf_counter()
    return {"pairs": pairs, "seconds": end - start, "open_seconds": counted - start}


def measure(kind: str, paths: list[Path], clean_too: bool) -> dict:
    """One reading in a fresh process: its figures and its peak RSS in MB."""
    argv = [sys.executable, __file__, "--child", kind, *map(str, paths)]
    if clean_too:
        argv.append("--clean")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    out, err = proc.stdout.read(), proc.stderr.read()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{kind}: {err.decode(errors='replace').strip()[-800:]}")
    result = json.loads(out)
    result["peak_rss_mb"] = usage.ru_maxrss // 1024
    result["pairs_per_s"] = round(result["pairs"] / result["seconds"])
    result["seconds"] = round(result["seconds"], 2)
    result["open_seconds"] = round(result["open_seconds"], 2)
    return result


def run_mtkit(*args: str) -> tuple[float, int]:
    """`mtkit ARGS` in a process of its own: wall seconds and peak RSS in MB."""
    argv = [sys.executable, "-m", "mtkit", "-q", *args]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        err = proc.stderr.read().decode(errors="replace")
        raise SystemExit(f"mtkit {' '.join(args)}: {err.strip()[-800:]}")
    return wall, usage.ru_maxrss // 1024


def preprocess_both(folder: Path, paths: dict[str, Path]) -> dict:
    """`mtkit preprocess` on the text files and on the TMX, with one tokenizer."""
    import yaml

    configs = {}
    for kind, train in (
        ("text", {"src": str(paths["en"]), "tgt": str(paths["de"])}),
        ("tmx", {"path": str(paths["tmx"])}),
    ):
        configs[kind] = folder / f"{kind}.yaml"
        config = {
            "run_dir": str(folder / f"run_{kind}"),
            "data": {"train": train, "workers": 2},
            "tokenizer": {"vocab_size": 8000, "input_sentence_size": 200_000},
        }
        configs[kind].write_text(yaml.safe_dump(config))
    tokenizer_seconds, _ = run_mtkit("tokenizer", "-c", str(configs["text"]))
    (folder / "run_tmx").mkdir(exist_ok=True)
    for name in ("spm.model", "spm.vocab"):
        shutil.copy(folder / "run_text" / name, folder / "run_tmx" / name)
    out: dict = {"tokenizer_seconds": round(tokenizer_seconds, 1)}
    shards = {}
    for kind in ("text", "tmx"):
        wall, peak = run_mtkit("preprocess", "-c", str(configs[kind]))
        train = folder / f"run_{kind}" / "data" / "train"
        manifest = json.loads((train / "manifest.json").read_text())
        read = sum(c["read"] for c in manifest["corpora"])
        out[kind] = {
            "pairs_read": read,
            "seconds": round(wall, 2),
            "pairs_per_s": round(read / wall),
            "peak_rss_mb": peak,
        }
        shards[kind] = [
            hashlib.sha256((train / name).read_bytes()).hexdigest()
            for name in ("src.bin", "tgt.bin", "src.idx", "tgt.idx")
        ]
    out["same_shards"] = shards["text"] == shards["tmx"]
    out["tmx_over_text"] = round(out["tmx"]["pairs_per_s"] / out["text"]["pairs_per_s"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--gzip", action="store_true", help="read the TMX as .tmx.gz too")
    ap.add_argument(
        "--preprocess", type=int, default=0, help="mtkit preprocess on N pairs both ways (0: no)"
    )
    ap.add_argument("--keep", type=Path, default=None, help="build the files here, keep them")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--clean", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(read(args.child[0], args.child[1:], args.clean)))
        return

    folder = args.keep or Path(tempfile.mkdtemp(prefix="tmx_stream."))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        start = time.perf_counter()
        big = build(folder, args.units, args.gzip)
        small = build(folder, args.small, False)
        built = time.perf_counter() - start
        sizes = {name: round(path.stat().st_size / 1e6, 1) for name, path in big.items()}
        rows = {}
        for n, paths in ((args.units, big), (args.small, small)):
            for clean_too in (False, True) if n == args.units else (False,):
                how = "read+clean" if clean_too else "read"
                rows[f"text {how} {n}"] = measure("text", [paths["en"], paths["de"]], clean_too)
                rows[f"tmx {how} {n}"] = measure("tmx", [paths["tmx"]], clean_too)
        if args.gzip:
            rows[f"tmx.gz read {args.units}"] = measure("tmx", [big["tmx.gz"]], False)
        rows[f"parse floor {args.units}"] = measure("floor", [big["tmx"]], False)
        stage = None
        if args.preprocess:
            stage = preprocess_both(folder, build(folder, args.preprocess, False))
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)

    n = args.units
    ratio = {
        how: round(
            rows[f"tmx {how} {n}"]["pairs_per_s"] / rows[f"text {how} {n}"]["pairs_per_s"], 3
        )
        for how in ("read", "read+clean")
    }
    growth = rows[f"tmx read {n}"]["peak_rss_mb"] - rows[f"tmx read {args.small}"]["peak_rss_mb"]
    print(f"{'reading':<28} {'pairs':>9} {'s':>7} {'open s':>7} {'pairs/s':>9} {'peak MB':>8}")
    for name, r in rows.items():
        print(
            f"{name:<28} {r['pairs']:>9} {r['seconds']:>7} {r['open_seconds']:>7} "
            f"{r['pairs_per_s']:>9} {r['peak_rss_mb']:>8}"
        )
    print(
        f"TMX / text pairs/s: {ratio['read']} (read), {ratio['read+clean']} (read+clean); "
        f"TMX peak RSS {args.small} -> {n} units: {growth:+d} MB"
    )
    if stage:
        print(
            f"mtkit preprocess, {args.preprocess} pairs: text {stage['text']['pairs_per_s']} "
            f"pairs/s ({stage['text']['peak_rss_mb']} MB), TMX {stage['tmx']['pairs_per_s']} "
            f"pairs/s ({stage['tmx']['peak_rss_mb']} MB): {stage['tmx_over_text']}; "
            f"same shards: {stage['same_shards']}"
        )
    print(
        json.dumps(
            {
                "cpu": cpu_name(),
                "cores": os.cpu_count(),
                "units": n,
                "small": args.small,
                "build_seconds": round(built, 1),
                "file_mb": sizes,
                "rows": rows,
                "tmx_over_text": ratio,
                "tmx_rss_growth_mb": growth,
                "preprocess": stage,
            }
        )
    )


if __name__ == "__main__":
    main()
