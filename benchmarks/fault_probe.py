"""Probe the real `mtkit` command with bad input and faults, as a hostile new user would.

Each case runs `python -m mtkit ...` as its own process on a fresh copy of a small trained
run and checks what the README promises: the exit code (2 for a user error or fault, 130
for Ctrl-C), one line on stderr without a traceback, and every file the user had still
byte-identical afterwards (outside RUN/.lock and the datasets cache).

    python benchmarks/fault_probe.py            # about 4 minutes on 2 cores
    python benchmarks/fault_probe.py --only disk   # the cases whose name has "disk"

Read-only and full-disk cases need `mount` (root); they are skipped elsewhere.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "multi30k"


@dataclass
class Case:
    name: str
    args: list[str]
    code: int = 2
    stdin: bytes = b""
    setup: object = None  # function(work: Path) -> None, run before the snapshot
    interrupt_when: object = None  # function(work) -> bool: send `interrupt_with` once true
    interrupt_with: int = signal.SIGINT
    needs_mount: bool = False
    changes: list[str] = field(default_factory=list)  # files the command may replace
    # function(work, stdout) -> str | None: a broken promise the byte snapshot cannot
    # see (a FIFO replaced by a file, a file named "-", a one-word translation)
    check: object = None
    env: dict = field(default_factory=dict)  # set for the command (over this process's)
    says: str = ""  # what stderr must hold (a plural, a range)


def lines(name: str, n: int) -> list[str]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


def mtkit(*args, cwd: Path, stdin: bytes = b"", timeout: float = 300, env: dict | None = None):
    return subprocess.run(
        [sys.executable, "-m", "mtkit", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )


def prepare(folder: Path) -> None:
    """A 2,000-pair corpus slice, a tiny config and a run trained for 20 steps."""
    for split, name, n in (
        ("train", "train", 2000),
        ("valid", "val", 100),
        ("test", "test2016", 100),
    ):
        for lang in ("en", "de"):
            (folder / f"{split}.{lang}").write_text("\n".join(lines(f"{name}.{lang}.gz", n)) + "\n")
    config = {
        "run_dir": "run",
        "data": {s: {"src": f"{s}.en", "tgt": f"{s}.de"} for s in ("train", "valid", "test")},
        "tokenizer": {"vocab_size": 500},
        "model": {
            "encoder_layers": 1,
            "decoder_layers": 1,
            "d_model": 16,
            "heads": 2,
            "ffn_dim": 32,
            "dropout": 0.0,
        },
        "train": {
            "max_tokens": 512,
            "warmup_steps": 10,
            "lr": 0.005,
            "max_steps": 20,
            "valid_every": 10,
            "device": "cpu",
            "precision": "fp32",
        },
    }
    config["data"]["workers"] = 1
    (folder / "exp.yaml").write_text(yaml.safe_dump(config))
    for stage in ("tokenizer", "preprocess", "train"):
        done = mtkit(stage, "-c", "exp.yaml", cwd=folder)
        assert done.returncode == 0, done.stderr.decode()
    (folder / "in.txt").write_text("A dog runs in the park.\nTwo men talk.\n")
    (folder / "out.txt").write_text("an earlier translation the user keeps\n")


def edit(path: str, fn):
    def setup(work: Path) -> None:
        p = work / path
        p.write_bytes(fn(p.read_bytes()))

    return setup


def flip(data: bytes) -> bytes:
    b = bytearray(data)
    b[len(b) // 2] ^= 0x10
    return bytes(b)


def flip_weight(work: Path) -> None:
    path = work / "run/checkpoints/best.pt"
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size // 2] ^= 4
    path.write_bytes(bytes(data))


def nan_checkpoint(work: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from mtkit.core.checkpoint import load_checkpoint, save_checkpoint

    payload = load_checkpoint(work / "run/checkpoints/best.pt")
    next(iter(payload["model"].values())).view(-1)[0] = float("nan")
    save_checkpoint(payload, work / "nan.pt")


def export(work: Path, damage=None) -> None:
    """RUN's best checkpoint exported to work/ct2; `damage(folder)` then breaks it."""
    done = mtkit("export", "-m", CKPT, "-o", "ct2", cwd=work)
    assert done.returncode == 0, done.stderr.decode()
    if damage:
        damage(work / "ct2")


def fifo_with_reader(work: Path) -> None:
    """work/pipe, a FIFO that a background `cat` reads (and ends with)."""
    os.mkfifo(work / "pipe")
    subprocess.Popen(["cat", str(work / "pipe")], stdout=subprocess.DEVNULL)


def fifo_writing(text: str):
    """A setup: work/pipe, a FIFO that a background process writes `text` into."""

    def setup(work: Path) -> None:
        os.mkfifo(work / "pipe")
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
                str(work / "pipe"),
                text,
            ]
        )

    return setup


def no_temporary(work: Path, stdout: bytes) -> str | None:
    left = [p.name for p in work.iterdir() if p.name.startswith(".") and ".tmp" in p.name]
    return f"temporary files left: {left}" if left else None


def still_fifo(work: Path, stdout: bytes) -> str | None:
    return None if stat.S_ISFIFO(os.stat(work / "pipe").st_mode) else "pipe is a file now"


def still_null(work: Path, stdout: bytes) -> str | None:
    return None if stat.S_ISCHR(os.stat(os.devnull).st_mode) else "/dev/null is a file now"


def on_stdout(work: Path, stdout: bytes) -> str | None:
    if (work / "-").exists():
        return "wrote a file named -"
    return None if len(stdout.splitlines()) == 2 else "not one stdout line per input line"


def on_stdout_lines(n: int):
    """A check: n non-empty lines on stdout."""

    def check(work: Path, stdout: bytes) -> str | None:
        rows = stdout.splitlines()
        return None if len(rows) == n and all(rows) else f"stdout: {stdout[:200]!r}"

    return check


def many_words(work: Path, stdout: bytes) -> str | None:
    rows = stdout.decode("utf-8", "replace").splitlines()
    return (
        None
        if len(rows) == 2 and all(len(r.split()) > 1 for r in rows)
        else f"outputs cut short: {[r[:30] for r in rows]}"
    )


def config_in_run_dir(work: Path) -> None:
    """work/self.yaml, a commented config whose run directory is work itself."""
    config = yaml.safe_load((work / "exp.yaml").read_text())
    config["run_dir"] = "."
    (work / "self.yaml").write_text("# my experiment, with my comments\n" + yaml.safe_dump(config))


def mount(work: Path, name: str, opts: str) -> None:
    (work / name).mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(work / name)], check=True)


def error_records(n: int):
    """A check: stdout is n jsonl records, the odd ones errors, the even ones translated
    (a bad line between good ones is its own error record, and the stream goes on)."""

    def check(work: Path, stdout: bytes) -> str | None:
        try:
            records = [json.loads(x) for x in stdout.splitlines()]
        except ValueError:
            return "stdout is not jsonl"
        if len(records) != n:
            return f"{len(records)} records for {n} lines"
        if any(("error" in r) != (k % 2 == 1) for k, r in enumerate(records)):
            return f"not an error record for each bad line: {stdout[:200]!r}"
        return None

    return check


CKPT = "run/checkpoints/best.pt"
CASES = [
    # outputs never clobber inputs
    Case("translate -o = -i", ["translate", "-m", CKPT, "-i", "in.txt", "-o", "in.txt"]),
    Case(
        "translate -o hard link to -i",
        ["translate", "-m", CKPT, "-i", "in.txt", "-o", "h.txt"],
        setup=lambda w: os.link(w / "in.txt", w / "h.txt"),
    ),
    Case(
        "translate -o symlink to -i",
        ["translate", "-m", CKPT, "-i", "in.txt", "-o", "s.txt"],
        setup=lambda w: os.symlink(w / "in.txt", w / "s.txt"),
    ),
    Case("translate -o = -m", ["translate", "-m", CKPT, "-o", CKPT], stdin=b"A dog.\n"),
    Case(
        "translate -o another checkpoint",
        ["translate", "-m", CKPT, "-o", "run/checkpoints/last.pt"],
        stdin=b"A dog.\n",
        code=0,
        changes=["run/checkpoints/last.pt"],
    ),
    Case("translate -o a folder", ["translate", "-m", CKPT, "-o", "run"], stdin=b"A dog.\n"),
    Case("average -o = an input", ["average", CKPT, "run/checkpoints/step_10.pt", "-o", CKPT]),
    Case(
        "Ctrl-C in translate -o",
        ["translate", "-m", CKPT, "-o", "out.txt"],
        code=130,
        stdin=b"A dog.\n" * 200000,
        interrupt_when=lambda w: any(p.name.startswith(".out.txt.") for p in w.iterdir()),
    ),
    # options
    *[
        Case(f"translate {' '.join(o)}", ["translate", "-m", CKPT, *o], stdin=b"A dog.\n")
        for o in (
            ["--beam", "0"],
            ["--nbest", "9"],
            ["--beam", "2", "--nbest", "3"],
            ["--lenpen", "-1"],
            ["--lenpen", "nan"],
            ["--max-len-a", "-1"],
            ["--max-len-b", "-1"],
            ["--batch-tokens", "0"],
            ["--format", "xml"],
            ["--device", "tpu"],
            ["--bogus"],
            ["--beam", "two"],
        )
    ],
    Case("average --last 0", ["average", "run/checkpoints", "--last", "0", "-o", "a.pt"]),
    Case("translate without -m", ["translate"]),
    # checkpoints
    Case("missing checkpoint", ["translate", "-m", "none.pt"], stdin=b"A dog.\n"),
    Case("text file as checkpoint", ["translate", "-m", "in.txt"], stdin=b"A dog.\n"),
    Case("folder as checkpoint", ["translate", "-m", "run"], stdin=b"A dog.\n"),
    Case(
        "random bytes as checkpoint",
        ["translate", "-m", "r.pt"],
        stdin=b"A dog.\n",
        setup=lambda w: (w / "r.pt").write_bytes(random.Random(1).randbytes(5000)),
    ),
    Case(
        "truncated checkpoint",
        ["translate", "-m", CKPT],
        stdin=b"A dog.\n",
        setup=edit(CKPT, lambda d: d[: len(d) // 2]),
    ),
    Case(
        "flipped bit in a weight", ["translate", "-m", CKPT], stdin=b"A dog.\n", setup=flip_weight
    ),
    Case("NaN weights", ["translate", "-m", "nan.pt"], stdin=b"A dog.\n", setup=nan_checkpoint),
    Case("eval -m junk", ["eval", "-m", "in.txt", "--src", "in.txt", "--ref", "in.txt"]),
    Case("explain -m junk", ["explain", "params", "-m", "in.txt"]),
    Case("explain attention empty --src", ["explain", "attention", "-m", CKPT, "--src", "  "]),
    # text input
    Case(
        "50 MB line on stdin",
        ["translate", "-m", CKPT, "--beam", "1"],
        code=0,
        stdin=b"a" * (50 << 20),
    ),
    Case(
        "invalid UTF-8, BOM, empty lines",
        ["translate", "-m", CKPT],
        code=0,
        stdin=b"\xef\xbb\xbfA dog.\n\n\xff\xfe x\n",
    ),
    Case("translate -i missing", ["translate", "-m", CKPT, "-i", "nope.txt"]),
    Case(
        "eval on empty files",
        ["eval", "--hyp", "e.txt", "--ref", "e.txt"],
        setup=lambda w: (w / "e.txt").write_text(""),
    ),
    Case("eval line counts differ", ["eval", "--hyp", "in.txt", "--ref", "test.de"]),
    Case(
        "eval unknown metric", ["eval", "--hyp", "in.txt", "--ref", "in.txt", "--metrics", "meteor"]
    ),
    # config
    Case("missing config", ["tokenizer", "-c", "none.yaml"]),
    Case("config is a folder", ["tokenizer", "-c", "run"]),
    Case(
        "invalid YAML",
        ["tokenizer", "-c", "bad.yaml"],
        setup=lambda w: (w / "bad.yaml").write_text("data: [\n"),
    ),
    *[
        Case(f"--set {s}", ["train", "-c", "exp.yaml", "--set", s])
        for s in (
            "model.dmodel=8",
            "train.lr=.nan",
            "train.max_time=.inf",
            "train.seed=-1",
            "model.max_positions=100",
            "model.heads=3",
            "train.device=cuda",
        )
    ],
    # data
    Case(
        "mismatched line counts", ["tokenizer", "-c", "exp.yaml", "--set", "data.train.tgt=in.txt"]
    ),
    Case("missing corpus", ["preprocess", "-c", "exp.yaml", "--set", "data.valid.src=no.en"]),
    Case(
        "invalid UTF-8 corpus",
        ["preprocess", "-c", "exp.yaml", "--set", "data.valid.src=bad.en"],
        setup=lambda w: (w / "bad.en").write_bytes(
            (w / "valid.en").read_bytes()[:-40] + b"\xff\xfe\n" * 13
        ),
    ),
    Case(
        "truncated .gz corpus",
        [
            "tokenizer",
            "-c",
            "exp.yaml",
            "--set",
            "data.train.src=t.gz",
            "--set",
            "data.train.tgt=t.gz",
        ],
        setup=lambda w: (w / "t.gz").write_bytes(
            gzip.compress((w / "train.en").read_bytes())[:3000]
        ),
    ),
    Case(
        "TSV row with an extra field",
        [
            "tokenizer",
            "-c",
            "exp.yaml",
            "--set",
            "data.train.src=",
            "--set",
            "data.train.tgt=",
            "--set",
            "data.train.path=x.tsv",
        ],
        setup=lambda w: (w / "x.tsv").write_text("src\ttgt\na\tb\tc\nd\te\n"),
    ),
    Case(
        "empty corpus",
        [
            "tokenizer",
            "-c",
            "exp.yaml",
            "--set",
            "data.train.src=e.txt",
            "--set",
            "data.train.tgt=e.txt",
        ],
        setup=lambda w: (w / "e.txt").write_text("\n\n"),
    ),
    Case(
        "hub dataset without network",
        [
            "tokenizer",
            "-c",
            "exp.yaml",
            "--set",
            "data.train.src=",
            "--set",
            "data.train.tgt=",
            "--set",
            "data.train.hub=wmt14",
            "--set",
            "data.train.hub_config=de-en",
        ],
    ),
    # shards and stages
    Case(
        "truncated tgt.bin",
        ["train", "-c", "exp.yaml"],
        setup=edit("run/data/train/tgt.bin", lambda d: d[: len(d) // 2]),
    ),
    Case(
        "truncated src.idx",
        ["train", "-c", "exp.yaml"],
        setup=edit("run/data/train/src.idx", lambda d: d[: len(d) // 2]),
    ),
    Case(
        "flipped byte in src.bin",
        ["train", "-c", "exp.yaml"],
        setup=edit("run/data/train/src.bin", flip),
    ),
    Case(
        "garbage manifest",
        ["train", "-c", "exp.yaml"],
        setup=edit("run/data/train/manifest.json", lambda d: b"{garbage"),
    ),
    Case(
        "preprocess --verify on a flipped byte",
        ["preprocess", "-c", "exp.yaml", "--verify"],
        setup=edit("run/data/valid/tgt.bin", flip),
    ),
    Case(
        "tokenizer retrained after preprocess",
        ["train", "-c", "exp.yaml"],
        setup=lambda w: mtkit(
            "tokenizer", "-c", "exp.yaml", "--set", "tokenizer.vocab_size=300", cwd=w
        ),
    ),
    Case(
        "shards made again under a trained run",
        ["train", "-c", "exp.yaml", "--set", "data.max_len=30"],
        setup=lambda w: mtkit("preprocess", "-c", "exp.yaml", "--set", "data.max_len=30", cwd=w),
    ),
    Case(
        "read-only run dir",
        ["train", "-c", "exp.yaml", "--set", "run_dir=ro"],
        needs_mount=True,
        setup=lambda w: mount(w, "ro", "ro,size=1m"),
    ),
    # The tokenizer streams its corpus now and writes little but spm.model (~240 KB with
    # its normalization table): a 64k disk is full before the model is written.
    Case(
        "disk full",
        ["tokenizer", "-c", "exp.yaml", "--set", "run_dir=full/run"],
        needs_mount=True,
        setup=lambda w: mount(w, "full", "size=64k"),
    ),
    Case(
        "Ctrl-C in mtkit run",
        ["run", "-c", "exp.yaml", "--set", "train.max_steps=100000", "--set", "train.save_every=5"],
        code=130,
        interrupt_when=lambda w: (w / "run/checkpoints/step_40.pt").exists(),
        changes=["run/checkpoints/*", "run/metrics.jsonl", "run/config.yaml"],
    ),
    # data loss (issue 21): export --force replaces only a previous export
    Case(
        "dataloss: export --force -o RUN/checkpoints",
        ["export", "-m", CKPT, "-o", "run/checkpoints", "--force"],
    ),
    Case("dataloss: export --force -o RUN", ["export", "-m", CKPT, "-o", "run", "--force"]),
    Case(
        "dataloss: export --force -o RUN, checkpoint elsewhere",
        ["export", "-m", "b.pt", "-o", "run", "--force"],
        setup=lambda w: shutil.copy(w / CKPT, w / "b.pt"),
    ),
    Case("dataloss: export --force -o .", ["export", "-m", CKPT, "-o", ".", "--force"]),
    Case(
        "dataloss: export --force -o a folder of the user's",
        ["export", "-m", CKPT, "-o", "mine", "--force"],
        setup=lambda w: ((w / "mine").mkdir(), (w / "mine/notes.txt").write_text("mine\n")),
    ),
    Case(
        "dataloss: export --force over an export with a file added",
        ["export", "-m", CKPT, "-o", "ct2", "--force"],
        setup=lambda w: export(w, lambda d: (d / "notes.txt").write_text("mine\n")),
    ),
    Case(
        "dataloss: export --force over an export",
        ["export", "-m", CKPT, "-o", "ct2", "--force"],
        code=0,
        setup=export,
        changes=["ct2/*"],
    ),
    # no output is a file the run reads
    *[
        Case(
            f"dataloss: translate -m DIR -o DIR/{name}",
            ["translate", "-m", "ct2", "-i", "in.txt", "-o", f"ct2/{name}"],
            setup=export,
        )
        for name in ("model.bin", "mtkit.json", "source.spm", "shared_vocabulary.json")
    ],
    Case(
        "dataloss: translate -o = --prefix-file",
        ["translate", "-m", CKPT, "-i", "in.txt", "--prefix-file", "in.txt", "-o", "in.txt"],
    ),
    # devices, FIFOs and - are written in place
    Case(
        "dataloss: translate -o /dev/null",
        ["translate", "-m", CKPT, "-i", "in.txt", "-o", os.devnull],
        code=0,
        check=still_null,
    ),
    Case(
        "dataloss: average -o /dev/null",
        ["average", CKPT, "run/checkpoints/step_10.pt", "-o", os.devnull],
        code=0,
        check=still_null,
    ),
    Case(
        "dataloss: translate -o a FIFO",
        ["translate", "-m", CKPT, "-i", "in.txt", "-o", "pipe"],
        code=0,
        setup=fifo_with_reader,
        check=still_fifo,
    ),
    Case(
        "dataloss: translate -i - -o -",
        ["translate", "-m", CKPT, "-i", "-", "-o", "-"],
        code=0,
        stdin=b"A dog.\nTwo men.\n",
        check=on_stdout,
    ),
    Case(
        "dataloss: translate -o /dev/stdout",
        ["translate", "-m", CKPT, "-i", "in.txt", "-o", "/dev/stdout"],
        code=0,
        check=on_stdout,
    ),
    # a config in its own run directory is kept
    *[
        Case(
            f"dataloss: {stage} -c a config in its own run dir",
            [stage, "-c", "self.yaml"],
            code=0,
            setup=config_in_run_dir,
        )
        for stage in ("tokenizer", "run")
    ],
    # exported folders are checked
    Case(
        "dataloss: translate an export with a truncated model.bin",
        ["translate", "-m", "ct2", "-i", "in.txt"],
        setup=lambda w: export(
            w, lambda d: (d / "model.bin").write_bytes((d / "model.bin").read_bytes()[:1000])
        ),
    ),
    Case(
        "dataloss: translate an export with a flipped bit in model.bin",
        ["translate", "-m", "ct2", "-i", "in.txt"],
        setup=lambda w: export(
            w, lambda d: (d / "model.bin").write_bytes(flip((d / "model.bin").read_bytes()))
        ),
    ),
    Case(
        "dataloss: translate an export without its vocabulary",
        ["translate", "-m", "ct2", "-i", "in.txt"],
        setup=lambda w: export(w, lambda d: (d / "shared_vocabulary.json").unlink()),
    ),
    Case(
        "dataloss: serve an export with a truncated model.bin",
        ["serve", "-m", "ct2"],
        setup=lambda w: export(
            w, lambda d: (d / "model.bin").write_bytes((d / "model.bin").read_bytes()[:1000])
        ),
    ),
    # every split the config names is verified
    Case(
        "dataloss: preprocess --verify without RUN/data/valid",
        ["preprocess", "-c", "exp.yaml", "--verify"],
        setup=lambda w: shutil.rmtree(w / "run/data/valid"),
    ),
    # huge length limits are the model's positions
    *[
        Case(
            f"dataloss: translate -m {model} {option} {value}",
            ["translate", "-m", model, "-i", "in.txt", "--beam", "1", option, value],
            code=0,
            check=many_words,
            setup=export if model == "ct2" else None,
        )
        for model in (CKPT, "ct2")
        for option, value in (("--max-len-a", "1e20"), ("--max-len-b", "9223372036854775807"))
    ],
    # every fault is one line (or one JSON error record), never a traceback
    *[
        Case(
            f"oneline: translate -m {model} --format jsonl, {what}",
            ["translate", "-m", model, "--format", "jsonl"],
            stdin=b"".join(b'{"src": "A dog."}\n' + bad + b"\n" for _ in range(2))
            + b'{"src": "A dog."}\n',
            code=0,
            check=error_records(5),
            setup=export if model == "ct2" else None,
        )
        for model in (CKPT, "ct2")
        for what, bad in (
            ("a lone surrogate", b'{"src": "a \\ud800"}'),
            ("a lone surrogate in the prefix", b'{"src": "a", "prefix": "\\udfff"}'),
            ("nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000),
            ("an id of 5,000 digits", b'{"src": "a", "id": ' + b"9" * 5000 + b"}"),
            ("an id of 100 bits", b'{"src": "a", "id": ' + b"9" * 30 + b"}"),
            ("an object as id", b'{"src": "a", "id": {"x": [1, {"y": 2}]}}'),
            ("an id nested 900 deep", b'{"src": "a", "id": ' + b"[" * 900 + b"]" * 900 + b"}"),
            ("a lone surrogate in the id", b'{"src": "a", "id": "\\ud800"}'),
            ("a lone surrogate as a key", b'{"\\ud800": "a"}'),
        )
    ],
    *[
        Case(f"oneline: serve {option} {value}", ["serve", "-m", CKPT, option, value])
        for option, value in (
            ("--max-wait-ms", "inf"),
            ("--max-wait-ms", "nan"),
            ("--max-wait-ms", "1e300"),
            ("--port", "99999"),
            ("--port", "-1"),
            ("--port", "0"),
            ("--max-lines", "0"),
        )
    ],
    *[
        Case(
            f"oneline: explain {' '.join(args)} -m an exported folder",
            ["explain", args[0], "-m", "ct2", *args[1:]],
            setup=export,
        )
        for args in (["params"], ["shapes"], ["attention", "--src", "A dog."])
    ],
    *[
        Case(
            f"oneline: translate -m {model} {' '.join(o)}",
            ["translate", "-m", model, "-i", "in.txt", *o],
            code=0 if o[0] == "--sampling" else 2,
            check=on_stdout_lines(2) if o[0] == "--sampling" else None,
            setup=export if model == "ct2" else None,
        )
        for model in (CKPT, "ct2")
        for o in (
            ["--beam", "1" + "0" * 20],
            ["--beam", "257"],
            ["--beam", "1e20"],
            ["--nbest", "1" + "0" * 20],
            ["--batch-tokens", "1" + "0" * 30],
            ["--lenpen", "1e300"],
            ["--lenpen", "inf"],
            ["--no-repeat-ngram", "1" + "0" * 20],
            *(
                [
                    ["--sampling", "--topp", "1e-38"],
                    ["--sampling", "--topp", "1e-45"],
                    ["--sampling", "--temperature", "1e-30"],
                    ["--sampling", "--temperature", "1e-300"],
                    ["--sampling", "--temperature", "1e300"],
                    ["--sampling", "--beam", "4", "--temperature", "1e-300", "--topp", "1e-38"],
                ]
                if model == CKPT
                else []
            ),
        )
    ],
    *[
        Case(f"oneline: serve {' '.join(o)}", ["serve", "-m", CKPT, *o])
        for o in (
            ["--beam", "1" + "0" * 20],
            ["--lenpen", "1e300"],
            ["--sampling", "--temperature", "nan"],
            ["--sampling", "--topp", "0"],
        )
    ],
    Case("oneline: serve --api-key ''", ["serve", "-m", CKPT, "--api-key", ""]),
    Case("oneline: serve --api-key ' '", ["serve", "-m", CKPT, "--api-key", " "]),
    Case("oneline: serve with MTKIT_API_KEY=", ["serve", "-m", CKPT], env={"MTKIT_API_KEY": ""}),
    # one line, one checkpoint, one layer
    Case(
        "oneline: eval a hypothesis of 1 line",
        ["eval", "--hyp", "one.txt", "--ref", "in.txt"],
        setup=lambda w: (w / "one.txt").write_text("A dog.\n"),
        says="one.txt has 1 line,",
    ),
    Case(
        "oneline: translate --prefix-file of 1 line",
        ["translate", "-m", CKPT, "-i", "in.txt", "--prefix-file", "one.txt"],
        setup=lambda w: (w / "one.txt").write_text("Ein\n"),
        says="one.txt has 1 line,",
    ),
    Case(
        "oneline: translate --align-layer 3 with 1 decoder layer",
        ["translate", "-m", CKPT, "-i", "in.txt", "--alignments", "--align-layer", "3"],
        says="must be 0 (the model has 1 decoder layer), got 3",
    ),
    Case(
        "oneline: average 1 checkpoint",
        ["average", CKPT, "-o", "avg.pt"],
        code=0,
        says="averaged 1 checkpoint into avg.pt",
    ),
    # signals and pipes
    Case(
        "signal: SIGTERM in translate -o",
        ["translate", "-m", CKPT, "-o", "out.txt"],
        code=143,
        stdin=b"A dog.\n" * 200000,
        interrupt_with=signal.SIGTERM,
        interrupt_when=lambda w: any(p.name.startswith(".out.txt.") for p in w.iterdir()),
        check=no_temporary,
    ),
    Case(
        "pipe: eval --ref a FIFO",
        ["eval", "--hyp", "in.txt", "--ref", "pipe"],
        code=0,
        setup=fifo_writing("A dog runs in the park.\nTwo men talk.\n"),
    ),
    Case(
        "pipe: translate --prefix-file a FIFO",
        ["translate", "-m", CKPT, "-i", "in.txt", "--prefix-file", "pipe"],
        code=0,
        setup=fifo_writing("Ein\n\n"),
    ),
    Case(
        "pipe: preprocess with a corpus that is a FIFO",
        ["preprocess", "-c", "exp.yaml", "--set", "data.train.src=pipe"],
        setup=lambda w: os.mkfifo(w / "pipe"),
        says="is a pipe or a device, not a file",
    ),
]


def snapshot(work: Path, allowed: list[str]) -> dict[str, bytes]:
    skip = {"run/.lock"}
    for pattern in allowed:
        skip |= {str(p.relative_to(work)) for p in work.glob(pattern)}
    return {
        str(p.relative_to(work)): p.read_bytes()
        for p in sorted(work.rglob("*"))
        if p.is_file()
        and not p.is_symlink()
        and "cache" not in p.relative_to(work).parts
        and str(p.relative_to(work)) not in skip
    }


def run_case(case: Case, base: Path, scratch: Path) -> dict:
    work = scratch / "work"
    shutil.copytree(base, work, symlinks=True)
    try:
        if case.setup:
            case.setup(work)
        before = snapshot(work, case.changes)
        if case.interrupt_when:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mtkit", *case.args],
                cwd=work,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            proc.stdin.write(case.stdin)
            proc.stdin.flush()
            deadline = time.time() + 120
            while not case.interrupt_when(work) and proc.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            proc.send_signal(case.interrupt_with)
            _, err = proc.communicate(timeout=120)
            code, out = proc.returncode, b""
        else:
            done = mtkit(*case.args, cwd=work, stdin=case.stdin, env=case.env)
            code, err, out = done.returncode, done.stderr, done.stdout
        after = snapshot(work, case.changes)
        broken = case.check(work, out) if case.check else None
    finally:
        for p in (work / "ro", work / "full"):
            if p.is_dir():
                subprocess.run(["umount", str(p)], check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    text = err.decode("utf-8", "replace").strip()
    quiet_ok = case.code == 0 or len(text.splitlines()) == 1
    if case.interrupt_when:  # training logs before it stops: judge the last line
        quiet_ok = (
            text.splitlines()[-1].startswith(("interrupted", "terminated")) if text else False
        )
    if case.says and case.says not in text:
        broken = f"stderr does not say {case.says!r}"
    lost = sorted(k for k in before if after.get(k) != before[k]) + ([broken] if broken else [])
    return {
        "case": case.name,
        "code": code,
        "expected": case.code,
        "traceback": "Traceback" in text,
        "one_line": quiet_ok,
        "lost": lost,
        "message": text.splitlines()[-1][:110] if text else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    parser.add_argument("--only", default="", help="Run the cases whose name contains this.")
    args = parser.parse_args()
    can_mount = (
        os.geteuid() == 0
        and subprocess.run(["mount", "--version"], capture_output=True).returncode == 0
    )
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        prepare(base)
        results = []
        for case in CASES:
            if args.only not in case.name:
                continue
            if case.needs_mount and not can_mount:
                print(f"skip  {case.name} (needs mount)")
                continue
            r = run_case(case, base, Path(tmp))
            ok = (
                r["code"] == r["expected"]
                and not r["traceback"]
                and r["one_line"]
                and not r["lost"]
            )
            r["ok"] = ok
            results.append(r)
            print(
                f"{'ok  ' if ok else 'FAIL'}  {r['code']:>3}  {case.name:<40} {r['message']}"
                + (f"  LOST {r['lost']}" if r["lost"] else ""),
                flush=True,
            )
    bad = [r for r in results if not r["ok"]]
    print(
        f"\n{len(results)} cases: {len(results) - len(bad)} as promised, "
        f"{sum(r['traceback'] for r in results)} tracebacks, "
        f"{sum(bool(r['lost']) for r in results)} with files lost or changed, "
        f"{sum(r['code'] != r['expected'] for r in results)} with another exit code"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
