"""Probe the real `mtkit` command with bad input and faults, as a hostile new user would.

Each case runs `python -m mtkit ...` as its own process on a fresh copy of a small trained
run and checks what the README promises: the exit code (2 for a user error or fault, 130
for Ctrl-C), one line on stderr without a traceback, and every file the user had still
byte-identical afterwards (outside RUN/.lock and the datasets cache).

    python benchmarks/fault_probe.py            # about 4 minutes on 2 cores
    python benchmarks/fault_probe.py --only disk   # the cases whose name has "disk"
    python benchmarks/fault_probe.py --only 51/    # issue 51's surfaces (51/1: signals)

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
    # issue 51's surfaces:
    group: bool = False  # a new session; the signal goes to its whole group (os.killpg)
    poll: float = 0.05  # seconds between looks at `interrupt_when`
    nothing_new: bool = False  # no path may appear under work (nothing written)
    max_s: float = 0  # the command must end within this many seconds (0: no limit)
    not_says: str = ""  # what stderr must not hold (a temporary's name, an option never given)
    logs: bool = False  # stderr may hold log lines (a server, a training): no one-line rule
    # function(work, stdout, stderr) -> str | None, after the command (a resume, records)
    after: object = None
    # function(work) -> (code, stderr, problem): the command run another way (a server)
    driver: object = None


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


# --- issue 51: signals to the group, terminology, multilingual, import and export ----------
# Shared inputs built once per probe run (a Hugging Face Marian folder and its import, a
# model into the codes cp and deu), then copied into each case's work folder.
BASES: dict = {}
LINES51 = ["A dog runs in the park.", "", "Two men talk on a bench.", "A girl in red."]
NEEDS_BEAM = (
    "constraints: searching for them needs a beam of 2 or more (--beam 1): the beam "
    "is shared among hypotheses that have met different numbers of constraint tokens"
)
NEEDS_SEARCH = "constraints: searching for them needs beam search, not --sampling"
NEEDS_CKPT = (
    "constraints: searching for them needs a checkpoint (-m FILE.pt), not an "
    "exported CTranslate2 folder"
)


def built(name: str, build) -> Path:
    folder = BASES["root"] / name
    if not folder.exists():
        partial = BASES["root"] / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        build(partial)
        partial.rename(folder)
    return folder


def build_marian(folder: Path) -> None:
    """An original Hugging Face Marian folder (tests/hfmarian.py), its import and the
    import's two exports (each marked by mtkit.json)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from hfmarian import marian_folder

    marian_folder(folder / "marian")
    for args in (
        ["import", "marian", "-o", "imported.pt"],
        ["export", "-m", "imported.pt", "--to", "huggingface", "-o", "hf"],
        ["export", "-m", "imported.pt", "--to", "ctranslate2", "-o", "ct2m"],
    ):
        done = mtkit(*args, cwd=folder)
        assert done.returncode == 0, done.stderr.decode()


def build_multi(folder: Path) -> None:
    """A tiny model into `deu` (German) and `cp` (the English copied): codes py3langid
    does not know; multi.pt, and 6 lines of source and reference for eval."""
    base = BASES["base"]
    data = {}
    for split in ("train", "valid", "test"):
        src, tgt = str(base / f"{split}.en"), str(base / f"{split}.de")
        data[split] = [
            {"src": src, "tgt": tgt, "tgt_lang": "deu"},
            {"src": src, "tgt": src, "tgt_lang": "cp"},
        ]
    config = yaml.safe_load((base / "exp.yaml").read_text())
    config["data"] = {**data, "workers": 1}
    config["run_dir"] = str(folder / "run")
    (folder / "multi.yaml").write_text(yaml.safe_dump(config))
    for stage in ("tokenizer", "preprocess", "train"):
        done = mtkit(stage, "-c", "multi.yaml", cwd=folder)
        assert done.returncode == 0, done.stderr.decode()
    shutil.copy(folder / "run/checkpoints/best.pt", folder / "multi.pt")
    shutil.rmtree(folder / "run")
    for side in ("en", "de"):
        (folder / f"six.{side}").write_text(
            "".join((base / f"test.{side}").read_text().splitlines(True)[:6])
        )


def use(name: str, *items: str):
    """A setup: copy these files or folders of a shared input into work."""

    def setup(work: Path) -> None:
        folder = built(name, build_marian if name == "marian" else build_multi)
        for item in items:
            (shutil.copytree if (folder / item).is_dir() else shutil.copy)(
                folder / item, work / item
            )

    return setup


def then(*setups):
    def setup(work: Path) -> None:
        for s in setups:
            s(work)

    return setup


def jsonl51(*items) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in items)


def records_are(*expected, file: str = "", err_lacks: str = ""):
    """An `after`: the records (stdout, or `file`) one per input line, each "ok" (a
    translation) or the exact error, or a dict the record must contain."""

    def after(work: Path, stdout: bytes, stderr: str) -> str | None:
        raw = (work / file).read_bytes() if file else stdout
        if file and not (work / file).exists():
            return f"{file} not written"
        try:
            got = [json.loads(x) for x in raw.splitlines()]
        except ValueError:
            return "not jsonl"
        if len(got) != len(expected):
            return f"{len(got)} records for {len(expected)} lines"
        for k, (r, want) in enumerate(zip(got, expected)):
            if want == "ok" and ("translation" not in r or "error" in r):
                return f"record {k} not translated: {str(r)[:120]}"
            if isinstance(want, str) and want != "ok" and r.get("error") != want:
                return f"record {k}: {str(r)[:200]}"
            if isinstance(want, dict) and any(r.get(a) != b for a, b in want.items()):
                return f"record {k}: {str(r)[:200]}"
        if err_lacks and err_lacks in stderr:
            return f"stderr says {err_lacks!r}"
        return None

    return after


def no_stdout(work: Path, stdout: bytes) -> str | None:
    return None if not stdout else f"output before the error: {stdout[:100]!r}"


# 1. a stop signal to the whole process group of `mtkit train` / `mtkit run`

SIG_MODEL = [
    "--set",
    "model.d_model=128",
    "--set",
    "model.ffn_dim=512",
    "--set",
    "model.heads=4",
    "--set",
    "model.encoder_layers=2",
    "--set",
    "model.decoder_layers=2",
    "--set",
    "train.max_steps=12",
    "--set",
    "train.valid_every=6",
    "--set",
    "train.log_every=1",
    "--set",
    "train.max_tokens=1024",
    "--set",
    "run_dir=sig",
]


def signal_run(work: Path) -> None:
    """work/sig: the run's tokenizer and shards, no checkpoint: a model 8 times wider
    (steps long enough to be hit) trains there from step 0."""
    shutil.copytree(
        work / "run",
        work / "sig",
        ignore=shutil.ignore_patterns(
            "checkpoints", "metrics.jsonl", "config.yaml", "test.hyp", ".lock"
        ),
    )


def metrics(work: Path) -> list[dict]:
    path = work / "sig/metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for row in path.read_text().splitlines():
        try:
            out.append(json.loads(row))
        except ValueError:
            pass
    return out


def at_step(n: int):
    return lambda w: any(r.get("event") == "train" and r.get("step", 0) >= n for r in metrics(w))


def saving(w: Path) -> bool:
    folder = w / "sig/checkpoints"
    return folder.is_dir() and any(
        p.name.startswith(".") and p.name.endswith(".tmp") for p in folder.iterdir()
    )


def stopped_and_resumed(
    stage: str, sig: str, args: list[str], least: int = 0, exact: int | None = None
):
    """An `after`: the trainer said once that it got `sig`, printed no DataLoader worker's
    death, saved a checkpoint at the step it reached (none at step 0), and the same
    command then resumes and exits 0."""

    def after(work: Path, stdout: bytes, stderr: str) -> str | None:
        sys.path.insert(0, str(ROOT))
        from mtkit.core.checkpoint import load_checkpoint

        if "DataLoader worker" in stderr or stderr.count(f"{sig} received") > 1:
            return f"stderr: {stderr[-300:]!r}"
        ends = [r for r in metrics(work) if r.get("event") == "end"]
        reached = ends[-1]["step"] if ends else 0
        if ends and ends[-1].get("reason") != f"signal {sig}":
            return f"stopped for {ends[-1].get('reason')}"
        last = work / "sig/checkpoints/last.pt"
        if reached == 0:
            if last.exists():
                return "a checkpoint at step 0"
        else:
            if not last.exists():
                return f"no checkpoint at step {reached}"
            saved = load_checkpoint(last)["train"]["progress"]["step"]
            if saved != reached:
                return f"stopped at step {reached}, saved step {saved}"
            if f"stopped at step {reached} (signal {sig})" not in stderr and stage == "train":
                return "stderr does not say where it stopped"
        if reached < least or (exact is not None and reached != exact):
            return f"stopped at step {reached}, expected {exact if exact is not None else least}"
        if stage == "run" and (work / "sig/test.hyp").exists():
            return "went on to translate the test set"
        resumed = mtkit(stage, *args, cwd=work)
        if resumed.returncode != 0:
            return f"resume exited {resumed.returncode}: {resumed.stderr.decode()[-200:]}"
        if ("resuming from" in resumed.stderr.decode()) != (reached > 0):
            return "resumed from the wrong place"
        return None

    return after


def signal_case(stage: str, moment: str, workers: int, sig=signal.SIGTERM) -> Case:
    args = ["-c", "exp.yaml", *SIG_MODEL, "--set", f"data.loader_workers={workers}"]
    when, least, exact, poll = {
        "set-up (the run's lock)": (lambda w: (w / "sig/.lock").exists(), 0, 0, 0.005),
        "set-up (metrics.jsonl opened)": (
            lambda w: (w / "sig/metrics.jsonl").exists(),
            0,
            0,
            0.005,
        ),
        "mid-epoch": (at_step(3), 3, None, 0.02),
        "the first validation": (at_step(6), 6, 6, 0.01),
        "a checkpoint save": (saving, 6, 6, 0.002),
    }[moment]
    code = 128 + sig
    return Case(
        f"51/1 {sig.name} to the group of {stage} at {moment}, loader_workers {workers}",
        [stage, *args],
        code=code,
        group=True,
        interrupt_with=sig,
        interrupt_when=when,
        poll=poll,
        setup=signal_run,
        logs=True,
        changes=["sig/*", "sig/*/*", "sig/*/*/*"],
        after=stopped_and_resumed(stage, sig.name, args, least, exact),
        **(
            {
                "says": "interrupted: stopped by "
                + sig.name
                + " after saving a checkpoint; rerun to go on"
            }
            if stage == "run"
            else {}
        ),
    )


# 7. Ctrl-C (or SIGTERM) to the group of preprocess with data.workers 2


def big_corpus(work: Path) -> None:
    """200,000 pairs (enough for the worker processes, and seconds of encoding) and a
    run directory with only the tokenizer."""
    for side in ("en", "de"):
        (work / f"big.{side}").write_text((work / f"train.{side}").read_text() * 100)
    (work / "pp").mkdir()
    for p in (work / "run").iterdir():
        if p.is_file() and p.name.startswith("spm"):
            shutil.copy(p, work / "pp" / p.name)


def encoding(work: Path) -> bool:
    """True 0.3 s after preprocessing made its temporary data folder."""
    started = BASES.setdefault("pp_seen", {})
    if any(p.name.startswith(".data") for p in (work / "pp").iterdir()):
        started.setdefault(str(work), time.monotonic())
        return time.monotonic() - started[str(work)] > 0.3
    return False


def nothing_half_written(work: Path, stdout: bytes, stderr: str) -> str | None:
    BASES.get("pp_seen", {}).clear()
    if "KeyboardInterrupt" in stderr:
        return "a KeyboardInterrupt traceback"
    left = sorted(
        p.name
        for p in (work / "pp").iterdir()
        if not p.name.startswith("spm") and p.name != ".lock"
    )
    return f"left in pp/: {left}" if left else None


PP = [
    "-c",
    "exp.yaml",
    "--set",
    "run_dir=pp",
    "--set",
    "data.workers=2",
    "--set",
    "data.train.src=big.en",
    "--set",
    "data.train.tgt=big.de",
]

# 5/6. broken Hugging Face Marian folders

BROKEN_MARIAN = [
    ({"max_position_embeddings": 1}, "max_position_embeddings=1: must be an integer in [8,"),
    (
        {"encoder_attention_heads": 3, "decoder_attention_heads": 3},
        "encoder_attention_heads=3: must divide d_model (32)",
    ),
    (
        {"encoder_attention_heads": 0, "decoder_attention_heads": 0},
        "encoder_attention_heads=0: must be an integer in [1, 32]",
    ),
    ({"encoder_layers": 0}, "encoder_layers=0: must be an integer in [1, 64]"),
    ({"encoder_layers": -1}, "encoder_layers=-1: must be an integer in [1, 64]"),
    ({"decoder_layers": 200_000}, "decoder_layers=200000: must be an integer in [1, 64]"),
    ({"encoder_layers": 3}, "encoder_layers=3: the weights hold layers 0..1 (2)"),
    ({"dropout": float("nan")}, "dropout=nan: must be a finite number in [0.0, 0.9]"),
    ({"attention_dropout": -0.5}, "attention_dropout=-0.5: must be a number in [0.0, 0.9]"),
    ({"activation_function": ["swish"]}, "activation_function=['swish']: must be a string"),
    ({"d_model": 32.0}, "d_model=32.0: must be an integer"),
    ({"d_model": "32"}, "d_model='32': must be an integer"),
    ({"d_model": 0}, "d_model=0: must be an integer in [1, inf]"),
    ({"d_model": 64, "encoder_attention_heads": 4}, "d_model=64: the weights' shared.weight"),
    ({"eos_token_id": True}, "eos_token_id=True: must be an integer"),
    ({"eos_token_id": 1}, "must be three different pieces"),
    ({"scale_embedding": None}, "scale_embedding=None: must be true or false"),
    ({"activation_function": "x" * 10_000}, "activation_function='xxxx"),
]


def marian_edit(changes: dict):
    def setup(work: Path) -> None:
        path = work / "marian/config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return setup


def marian_file(name: str, data) -> object:
    def setup(work: Path) -> None:
        (work / "marian" / name).write_bytes(data(work) if callable(data) else data)

    return setup


def bigger_vocab(work: Path) -> bytes:
    table = json.loads((work / "marian/vocab.json").read_text())
    return json.dumps({**table, **{f"extra{i}": len(table) + i for i in range(50)}}).encode()


def extra_weights(work: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(work / "marian/model.safetensors")
    extra = {"model.encoder.layernorm_embedding.weight": weights["model.shared.weight"][0].clone()}
    save_file({**weights, **extra}, work / "marian/model.safetensors")


def short_line(n: int):
    def after(work: Path, stdout: bytes, stderr: str) -> str | None:
        longest = max(map(len, stderr.splitlines()), default=0)
        return None if longest < n else f"a line of {longest} chars"

    return after


IMPORT = dict(nothing_new=True, max_s=30, setup=use("marian", "marian"))


def import_case(name: str, setup, says: str, args=("-o", "out.pt")) -> Case:
    return Case(
        f"51/5 import {name}",
        ["import", "marian", *args],
        says=says,
        **{**IMPORT, "setup": then(use("marian", "marian"), setup)},
        after=short_line(400),
    )


# 3. export --force onto folders mtkit did not write


def remove(rel: str):
    return lambda w: (w / rel).unlink()


def write(rel: str, text: str):
    def setup(w: Path) -> None:
        (w / rel).parent.mkdir(parents=True, exist_ok=True)
        (w / rel).write_text(text)

    return setup


def manifest_format(folder: str, fmt: str):
    def after(work: Path, stdout: bytes, stderr: str) -> str | None:
        got = json.loads((work / folder / "mtkit.json").read_text()).get("format")
        return None if got == fmt else f"mtkit.json says {got}"

    return after


def export_refused(name, to, folder, says, setup):
    return Case(
        f"51/3 export --to {to} --force onto {name}",
        ["export", "-m", "imported.pt", "--to", to, "-o", folder, "--force"],
        says=says,
        nothing_new=True,
        setup=then(use("marian", "imported.pt"), setup),
    )


# 10/11/12. a real server with a glossary; a multilingual one


def serve_glossary(work: Path):
    from serverkit import LocalServer

    (work / "g.tsv").write_text("dog\tHund\n")
    want = {
        "error": "this server's glossary (serve --glossary) needs a beam of 2 or more "
        "(beam 1): the beam is shared among hypotheses that have met different numbers "
        "of constraint tokens",
        "field": "beam",
    }
    problems, statuses = [], []
    server = LocalServer(work / CKPT, "--glossary", work / "g.tsv")
    try:
        for text in ([LINES51[0]], [LINES51[2]], [LINES51[0], LINES51[3]]):
            status, body = server.request("POST", "/v1/translate", {"text": text, "beam": 1})
            statuses.append(status)
            if (status, body) != (422, want):
                problems.append(f"greedy {text[0][:10]}: {status} {str(body)[:150]}")
        status, body = server.request(
            "POST", "/v1/translate", {"text": [LINES51[0]], "sampling": True}
        )
        statuses.append(status)
        if status not in (200, 422):
            problems.append(f"sampling: {status} {str(body)[:150]}")
        status, body = server.request(
            "POST", "/v1/translate", {"text": [LINES51[0], ""], "constraints": [[], ["Hund"]]}
        )
        statuses.append(status)
        if status != 200 or body["translations"][1] != {
            "text": "",
            "score": 0.0,
            "constraints_met": False,
        }:
            problems.append(f"blank line: {status} {str(body)[:200]}")
        status, body = server.request(
            "POST", "/v1/translate", {"text": [LINES51[0]], "constraints": [["Hund " * 100_000]]}
        )
        statuses.append(status)
        if status != 422 or len(json.dumps(body)) > 500:
            problems.append(f"over-long constraint: {status}, {len(json.dumps(body))} chars")
    finally:
        code, err = server.stop()
    if 500 in statuses:
        problems.append("HTTP 500")
    return code, err, "; ".join(problems) or None


def serve_multi(work: Path):
    from serverkit import LocalServer

    problems, statuses = [], []
    server = LocalServer(work / "multi.pt")
    try:
        status, info = server.get("/v1/info")
        if info.get("target_languages") != ["cp", "deu"]:
            problems.append(f"/v1/info: {info}")
        for constraint in ("<2cp>", "Hund <2deu>"):
            status, body = server.request(
                "POST",
                "/v1/translate",
                {"text": [LINES51[0]], "target_lang": "deu", "constraints": [[constraint]]},
            )
            statuses.append(status)
            if status != 422 or body.get("error") != (
                f"constraints.0: the constraint {constraint!r} cannot be searched for: it "
                "holds a language tag or another control piece, which is no text"
            ):
                problems.append(f"{constraint}: {status} {str(body)[:200]}")
        for lang in ("xx", "c p", ""):
            status, body = server.request(
                "POST", "/v1/translate", {"text": [LINES51[0]], "target_lang": lang}
            )
            statuses.append(status)
            if status != 422:
                problems.append(f"target_lang {lang!r}: {status} {str(body)[:150]}")
    finally:
        code, err = server.stop()
    if 500 in statuses:
        problems.append("HTTP 500")
    return code, err, "; ".join(problems) or None


def eval_report(work: Path, stdout: bytes, stderr: str) -> str | None:
    try:
        report = json.loads(stdout)
    except ValueError:
        return f"stdout: {stdout[:100]!r}"
    off = report.get("off_target", {})
    ok = "bleu" in report and off.get("lang") == "de" and off.get("among") == ["de", "en"]
    return None if ok and off.get("lines") == 6 else f"report: {str(report)[:200]}"


def config_with(name: str, edit_fn):
    def setup(work: Path) -> None:
        config = yaml.safe_load((work / "exp.yaml").read_text())
        edit_fn(config)
        (work / name).write_text(yaml.safe_dump(config))

    return setup


def two_corpora(config: dict) -> None:
    train = config["data"]["train"]
    config["data"]["train"] = [{**train, "tgt_lang": "de"}, {**train, "tgt_lang": "c p"}]


def without_test(run_dir: str):
    def edit_fn(config: dict) -> None:
        del config["data"]["test"]
        config["run_dir"] = run_dir

    return edit_fn


MULTI = ["translate", "-m", "multi.pt", "--format", "jsonl"]
EVAL_MULTI = ["eval", "-m", "multi.pt", "--src", "six.en", "--ref", "six.de"]
TWO = jsonl51({"src": LINES51[0]}, {"src": LINES51[2]})
CONSTRAINED = jsonl51(
    {"src": LINES51[0]},
    {"src": LINES51[2], "constraints": ["Männer"]},
    {"src": LINES51[3], "id": 3},
)
LONG = "Hund " * 120_000  # 600 KB

CASES += [
    # 1. stop signals to the whole group: exit 130/143, a checkpoint at the step reached
    *[
        signal_case("train", moment, workers)
        for moment, workers in (
            ("set-up (the run's lock)", 1),
            ("set-up (metrics.jsonl opened)", 1),
            ("mid-epoch", 1),
            ("mid-epoch", 2),
            ("the first validation", 1),
            ("the first validation", 2),
            ("a checkpoint save", 1),
            ("a checkpoint save", 2),
        )
    ],
    signal_case("train", "mid-epoch", 2, signal.SIGINT),
    signal_case("train", "the first validation", 1, signal.SIGINT),
    signal_case("train", "set-up (metrics.jsonl opened)", 2, signal.SIGINT),
    signal_case("run", "mid-epoch", 1),
    signal_case("run", "mid-epoch", 2, signal.SIGINT),
    # 7. a stop signal to the group of preprocess (and run) with data.workers 2
    *[
        Case(
            f"51/7 {sig.name} to the group of {stage} with data.workers 2, encoding",
            [stage, *PP],
            code=128 + sig,
            group=True,
            interrupt_with=sig,
            interrupt_when=encoding,
            setup=big_corpus,
            logs=True,
            after=nothing_half_written,
            says="interrupted" if sig == signal.SIGINT else "terminated",
            changes=["pp/*"],
        )
        for stage, sig in (
            ("preprocess", signal.SIGINT),
            ("preprocess", signal.SIGTERM),
        )
    ],
    # 2. a record with constraints the engine or options cannot search: one error record
    *[
        Case(
            f"51/2 jsonl constraints with {' '.join(o)}{' -o' if out else ''}",
            ["translate", "-m", CKPT, "--format", "jsonl", *o, *(["-o", "o.jsonl"] if out else [])],
            code=0,
            stdin=CONSTRAINED,
            not_says="--constraints",
            after=records_are("ok", {"line": 1, "error": e}, {"id": 3}, file=out),
        )
        for o, e in (
            (["--beam", "1"], NEEDS_BEAM),
            (["--sampling"], NEEDS_SEARCH),
            (["--sampling", "--beam", "4"], NEEDS_SEARCH),
        )
        for out in ("", "o.jsonl")
    ],
    *[
        Case(
            f"51/2 jsonl constraints on a CTranslate2 export{' -o' if out else ''}",
            ["translate", "-m", "ct2", "--format", "jsonl", *(["-o", "o.jsonl"] if out else [])],
            code=0,
            stdin=CONSTRAINED,
            setup=export,
            not_says="--constraints",
            after=records_are("ok", NEEDS_CKPT, "ok", file=out),
        )
        for out in ("", "o.jsonl")
    ],
    Case(
        "51/2 jsonl 300 lines, one with constraints under --beam 1, -o",
        ["translate", "-m", CKPT, "--format", "jsonl", "--beam", "1", "-o", "o.jsonl"],
        code=0,
        stdin=jsonl51(
            *[{"src": LINES51[0]}] * 150,
            {"src": "a", "constraints": ["b"]},
            *[{"src": LINES51[2]}] * 149,
        ),
        after=records_are(*["ok"] * 150, NEEDS_BEAM, *["ok"] * 149, file="o.jsonl"),
    ),
    Case(
        "51/2 jsonl --glossary with --beam 1: one line before any output",
        [
            "translate",
            "-m",
            CKPT,
            "--format",
            "jsonl",
            "--beam",
            "1",
            "-o",
            "o.jsonl",
            "--glossary",
            "g.tsv",
        ],
        stdin=TWO,
        setup=write("g.tsv", "dog\tHund\n"),
        nothing_new=True,
        says="--glossary needs a beam of 2 or more (--beam 1)",
    ),
    # 3. export --force: only over a previous export (its mtkit.json)
    export_refused(
        "an original Hugging Face Marian folder",
        "huggingface",
        "marian",
        "is not an mtkit export (no mtkit.json",
        use("marian", "marian"),
    ),
    export_refused(
        "an original Hugging Face Marian folder",
        "ctranslate2",
        "marian",
        "is not an mtkit export (no mtkit.json",
        use("marian", "marian"),
    ),
    export_refused(
        "a folder of the user's with a config.json",
        "huggingface",
        "mine",
        "is not an mtkit export",
        write("mine/config.json", "{}\n"),
    ),
    export_refused(
        "an HF export with a file added",
        "huggingface",
        "hf",
        "holds notes.txt, which an export does not",
        then(use("marian", "hf"), write("hf/notes.txt", "mine\n")),
    ),
    export_refused(
        "a CTranslate2 export with a folder added",
        "ctranslate2",
        "ct2m",
        "holds sub",
        then(use("marian", "ct2m"), write("ct2m/sub/x", "mine\n")),
    ),
    export_refused(
        "an HF export without its mtkit.json",
        "huggingface",
        "hf",
        "is not an mtkit export",
        then(use("marian", "hf"), remove("hf/mtkit.json")),
    ),
    export_refused(
        "an HF export whose mtkit.json is another's",
        "ctranslate2",
        "hf",
        "is not an mtkit export",
        then(
            use("marian", "hf"), write("hf/mtkit.json", '{"format": "someone-else", "files": {}}')
        ),
    ),
    *[
        Case(
            f"51/3 export --to {to} --force onto a previous {kind} export (allowed)",
            ["export", "-m", "imported.pt", "--to", to, "-o", folder, "--force"],
            code=0,
            setup=use("marian", "imported.pt", folder),
            changes=[f"{folder}/*"],
            after=manifest_format(folder, fmt),
        )
        for to, kind, folder, fmt in (
            ("huggingface", "HF", "hf", "mtkit-hf-1"),
            ("ctranslate2", "CTranslate2", "ct2m", "mtkit-ct2-1"),
            ("huggingface", "CTranslate2", "ct2m", "mtkit-hf-1"),
            ("ctranslate2", "HF", "hf", "mtkit-ct2-1"),
        )
    ],
    # 4. an invalid --tgt-lang with jsonl: one line, exit 2, before any output
    *[
        Case(
            f"51/4 jsonl --tgt-lang {lang!r} on {what}{' -o' if out else ''}",
            [
                "translate",
                "-m",
                model,
                "--format",
                "jsonl",
                "--tgt-lang",
                lang,
                *(["-o", "o.jsonl"] if out else []),
            ],
            stdin=TWO,
            says=says,
            check=no_stdout,
            nothing_new=True,
            setup=use("multi", "multi.pt"),
        )
        for model, what, lang, says, out in (
            (
                "multi.pt",
                "a multilingual model",
                "xx",
                "error: --tgt-lang xx: this model translates into cp, deu",
                False,
            ),
            (
                "multi.pt",
                "a multilingual model",
                "xx",
                "error: --tgt-lang xx: this model translates into cp, deu",
                True,
            ),
            ("multi.pt", "a multilingual model", "c p", "is not a language code", False),
            ("multi.pt", "a multilingual model", "", "is not a language code", False),
            (
                CKPT,
                "a bilingual model",
                "xx",
                "error: --tgt-lang xx: this model translates en into de only",
                True,
            ),
        )
    ],
    Case(
        "51/4 text --tgt-lang xx on a multilingual model",
        ["translate", "-m", "multi.pt", "--tgt-lang", "xx"],
        stdin=b"A dog.\n",
        says="this model translates into cp, deu",
        check=no_stdout,
        setup=use("multi", "multi.pt"),
    ),
    Case(
        "51/4 jsonl records naming their own language",
        MULTI,
        code=0,
        stdin=jsonl51(
            {"src": LINES51[0]},
            {"src": LINES51[0], "tgt_lang": "cp"},
            {"src": LINES51[0], "tgt_lang": "xx"},
        ),
        setup=use("multi", "multi.pt"),
        after=records_are(
            'this model translates into cp, deu: give --tgt-lang or "tgt_lang" with one of them',
            "ok",
            "tgt_lang xx: this model translates into cp, deu",
        ),
    ),
    Case(
        "51/4 jsonl a constraint that is a language tag",
        [*MULTI, "--tgt-lang", "deu"],
        code=0,
        stdin=jsonl51(
            {"src": LINES51[0], "constraints": ["<2cp>"]},
            {"src": LINES51[0], "constraints": [["Hund <2deu>"]]},
            {"src": LINES51[0], "constraints": ["Hund"]},
        ),
        setup=use("multi", "multi.pt"),
        after=records_are(
            *[
                f"constraints: the constraint {p!r} cannot be searched for: it "
                "holds a language tag or another control piece, which is no text"
                for p in ("<2cp>", "Hund <2deu>")
            ],
            "ok",
        ),
    ),
    # 5/6. mtkit import of broken or foreign folders: exit 2, one line, nothing written, fast
    *[
        import_case(f"{str(changes)[:50]}", marian_edit(changes), says)
        for changes, says in BROKEN_MARIAN
    ],
    import_case(
        "an empty target.spm",
        marian_file("target.spm", b""),
        "target.spm: not a SentencePiece model (empty",
    ),
    import_case(
        "random bytes as source.spm",
        marian_file("source.spm", random.Random(5).randbytes(4096)),
        "source.spm: not a SentencePiece model (4096 bytes",
    ),
    import_case(
        "a vocab.json larger than the embeddings",
        marian_file("vocab.json", bigger_vocab),
        "vocab.json: 393 pieces, but the source embedding (shared.weight) has 343 rows",
    ),
    import_case(
        "weights the config does not use",
        extra_weights,
        "encoder.layernorm_embedding.weight, which the config does not use",
    ),
    import_case(
        "a config.json that is not JSON", marian_file("config.json", b"{garbage"), "config.json"
    ),
    import_case("-o -", lambda w: None, "-o -: the import writes a checkpoint", ("-o", "-")),
    import_case("-o an existing folder", lambda w: (w / "d").mkdir(), "is a folder", ("-o", "d")),
    *[
        Case(
            f"51/5 import a mistyped local path {path}",
            ["import", path, "-o", "out.pt"],
            says=f"{path}: no such folder",
            nothing_new=True,
            max_s=30,
            setup=lambda w: (w / "models").mkdir(),
        )
        for path in ("models/opus-mt-en-de", "./opus-mt", "../a/b")
    ],
    Case(
        "51/5 import a file, not a folder",
        ["import", "in.txt", "-o", "out.pt"],
        says="a file, not a model folder",
        nothing_new=True,
        max_s=30,
    ),
    # 8. a language code that is no one piece, at config load
    *[
        Case(
            f"51/8 {stage} with {key}={value!r}",
            [stage, "-c", "exp.yaml", "--set", f"{key}={value}"],
            says=f"{key}: {value!r} is not a language code",
            nothing_new=True,
        )
        for stage, key, value in (
            ("tokenizer", "data.tgt_lang", "c p"),
            ("run", "data.train.src_lang", "c p"),
            ("preprocess", "data.tgt_lang", "fr>"),
            ("tokenizer", "data.tgt_lang", "français"),
            ("train", "data.valid.tgt_lang", "c p"),
        )
    ],
    Case(
        "51/8 a corpus list whose second tgt_lang is 'c p'",
        ["preprocess", "-c", "two.yaml"],
        setup=config_with("two.yaml", two_corpora),
        nothing_new=True,
        says="data.train.1.tgt_lang: 'c p' is not a language code",
    ),
    Case(
        "51/8 tgt_lang of 36 letters",
        ["tokenizer", "-c", "exp.yaml", "--set", "data.tgt_lang=" + "x" * 36],
        says="data.tgt_lang: 'xxxxxxxxxx",
        nothing_new=True,
    ),
    Case(
        "51/8 tgt_lang: no (YAML false)",
        ["tokenizer", "-c", "no.yaml"],
        setup=config_with("no.yaml", lambda c: c["data"].update(tgt_lang=False)),
        says="data.tgt_lang must be a string, got False: quote it",
        nothing_new=True,
    ),
    # 9. eval -m of a model whose codes are no ISO 639-1 codes
    Case(
        "51/9 eval -m multilingual --tgt-lang deu --lang de --among en,de",
        [
            *EVAL_MULTI,
            "--tgt-lang",
            "deu",
            "--lang",
            "de",
            "--among",
            "en,de",
            "--json",
            "--metrics",
            "bleu",
        ],
        code=0,
        setup=use("multi", "multi.pt", "six.en", "six.de"),
        after=eval_report,
    ),
    *[
        Case(
            f"51/9 eval -m multilingual {' '.join(o)}",
            [*EVAL_MULTI, *o],
            says=says,
            check=no_stdout,
            max_s=60,
            setup=use("multi", "multi.pt", "six.en", "six.de"),
        )
        for o, says in (
            (
                ["--lang", "de"],
                "error: --lang de: this model translates into cp, deu; give "
                "--tgt-lang for the model's code",
            ),
            (["--tgt-lang", "deu", "--lang", "de"], "py3langid does not know cp, deu"),
            (["--lang", "deu"], "error: --lang deu: py3langid does not know it"),
            (
                ["--tgt-lang", "xx", "--lang", "de", "--among", "en,de"],
                "error: --tgt-lang xx: this model translates into cp, deu",
            ),
            (
                ["--tgt-lang", "deu", "--lang", "fr", "--among", "en,de"],
                "error: --lang fr is not among en, de",
            ),
        )
    ],
    # 10. serve --glossary: a greedy request is 422 naming the glossary, never 500
    Case(
        "51/10 serve --glossary: greedy requests, a blank line, an over-long constraint",
        ["serve"],
        code=0,
        driver=serve_glossary,
        logs=True,
    ),
    Case(
        "51/10 serve a multilingual model: tags as constraints, bad target_lang",
        ["serve"],
        code=0,
        driver=serve_multi,
        logs=True,
        setup=use("multi", "multi.pt"),
    ),
    # 11. a blank line with a required phrase: constraints_met false
    Case(
        "51/11 jsonl blank and spaces-only lines with constraints",
        ["translate", "-m", CKPT, "--format", "jsonl"],
        code=0,
        stdin=jsonl51(
            {"src": "", "constraints": ["Hund"]},
            {"src": LINES51[0]},
            {"src": "  ", "constraints": ["Hund"]},
        ),
        says='line 3 (record "line": 2): the source is empty, and so is its translation',
        after=records_are(
            {"line": 0, "source": "", "translation": "", "score": 0.0, "constraints_met": False},
            "ok",
            {"constraints_met": False},
        ),
    ),
    Case(
        "51/11 text --constraints with the phrase on a blank line",
        ["translate", "-m", CKPT, "-i", "four.en", "--constraints", "c.tsv"],
        code=0,
        setup=then(write("four.en", "\n".join(LINES51) + "\n"), write("c.tsv", "\nMänner\n\n\n")),
        says="line 2: the source is empty, and so is its translation",
        after=lambda w, out, err: None if out.decode().split("\n")[1] == "" else "line 2 filled",
    ),
    # 12. the smaller ones
    Case(
        "51/12 jsonl an over-long constraint is not echoed whole",
        ["translate", "-m", CKPT, "--format", "jsonl"],
        code=0,
        stdin=jsonl51({"src": LINES51[0], "constraints": [LONG]}, {"src": LINES51[2]}),
        after=lambda w, out, err: (
            None
            if len(out.splitlines()[0]) < 400
            and b"Hund Hund" in out.splitlines()[0]
            and b"translation" in out.splitlines()[1]
            else f"records: {out[:200]!r}... ({len(out)} bytes)"
        ),
    ),
    Case(
        "51/12 text --constraints an over-long phrase",
        ["translate", "-m", CKPT, "-i", "in.txt", "--constraints", "c.tsv"],
        setup=write("c.tsv", LONG + "\n\n"),
        says="line 1: the constraint 'Hund Hund",
        after=short_line(300),
    ),
    Case(
        "51/12 mtkit run without data.test, fresh run dir",
        ["run", "-c", "nt.yaml"],
        setup=config_with("nt.yaml", without_test("nt")),
        nothing_new=True,
        max_s=60,
        says="config error: data.test is not set: `mtkit run` ends by translating",
    ),
    Case(
        "51/12 mtkit run without data.test, trained run dir",
        ["run", "-c", "nt.yaml", "--set", "train.max_steps=1000"],
        setup=config_with("nt.yaml", without_test("run")),
        nothing_new=True,
        max_s=60,
        says="config error: data.test is not set",
    ),
    *[
        Case(
            f"51/12 eval {' '.join(repr(x) if not x or ',' in x or ' ' in x else x for x in o)}",
            ["eval", "--hyp", "in.txt", "--ref", "in.txt", *o],
            says=says,
            check=no_stdout,
        )
        for o, says in (
            (["--lang", ""], "error: --lang is empty: give a language code"),
            (["--lang", " "], "error: --lang is empty: give a language code"),
            (["--lang", "de", "--among", ","], "error: --among ',' has no language codes"),
            (["--lang", "de", "--among", " , "], "has no language codes"),
            (["--among", "en,de"], "error: --among is for --lang: give --lang too"),
            (["--tgt-lang", "de"], "error: --tgt-lang is the language -m translates"),
            (["--lang", "c p"], "error: --lang c p: py3langid does not know it"),
        )
    ],
    Case(
        "51/12 import -o a name of 250 bytes (allowed)",
        ["import", "marian", "-o", "m" * 250],
        code=0,
        setup=use("marian", "marian"),
    ),
    Case(
        "51/12 translate -o a name of 256 bytes",
        ["translate", "-m", CKPT, "-i", "in.txt", "-o", "x" * 256],
        says="x" * 256,
        not_says=".tmp",
        nothing_new=True,
    ),
    Case(
        "51/12 import -o under a file",
        ["import", "marian", "-o", "in.txt/out.pt"],
        setup=use("marian", "marian"),
        says="in.txt/out.pt",
        not_says=".tmp",
        nothing_new=True,
    ),
    Case(
        "51/12 import -o a full disk",
        ["import", "marian", "-o", "full/out.pt"],
        needs_mount=True,
        setup=then(use("marian", "marian"), lambda w: mount(w, "full", "size=16k")),
        says="full/out.pt",
        not_says=".tmp",
    ),
    Case(
        "51/12 export --to huggingface -o a read-only folder",
        ["export", "-m", "imported.pt", "--to", "huggingface", "-o", "ro/hf"],
        needs_mount=True,
        setup=then(use("marian", "imported.pt"), lambda w: mount(w, "ro", "ro,size=1m")),
        says="ro/hf",
        not_says=".partial",
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


def paths(work: Path) -> set[str]:
    """Every path under work (folders too), outside RUN/.lock and caches."""
    return {
        str(p.relative_to(work))
        for p in work.rglob("*")
        if "cache" not in p.relative_to(work).parts and p.name != ".lock"
    }


def foreground() -> None:
    """In the child before exec: Ctrl-C as a foreground command gets it, whatever this
    process ignores (a job started with `&` inherits SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_case(case: Case, base: Path, scratch: Path) -> dict:
    work = scratch / "work"
    shutil.copytree(base, work, symlinks=True)
    problem = None
    try:
        if case.setup:
            case.setup(work)
        before = snapshot(work, case.changes)
        names = paths(work)
        started = time.monotonic()
        if case.driver:
            code, err, problem = case.driver(work)
            err, out = err.encode(), b""
        elif case.interrupt_when:
            with open(scratch / "stderr", "w+b") as log:  # a file: a full pipe blocks nobody
                proc = subprocess.Popen(
                    [sys.executable, "-m", "mtkit", *case.args],
                    cwd=work,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    start_new_session=case.group,
                    preexec_fn=foreground,
                )
                proc.stdin.write(case.stdin)
                proc.stdin.flush()
                deadline = time.time() + 180
                while (
                    not case.interrupt_when(work) and proc.poll() is None and time.time() < deadline
                ):
                    time.sleep(case.poll)
                if proc.poll() is not None:
                    problem = "the command ended before the signal"
                try:
                    if case.group:  # from outside, to the whole group, as kill -- -PGID
                        os.killpg(proc.pid, case.interrupt_with)
                    else:
                        proc.send_signal(case.interrupt_with)
                except ProcessLookupError:
                    pass
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
                try:
                    proc.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    problem = "did not end within 300 s of the signal"
                    os.killpg(proc.pid, signal.SIGKILL) if case.group else proc.kill()
                    proc.wait()
                log.seek(0)
                code, out, err = proc.returncode, b"", log.read()
        else:
            done = mtkit(*case.args, cwd=work, stdin=case.stdin, env=case.env)
            code, err, out = done.returncode, done.stderr, done.stdout
        wall = time.monotonic() - started
        after = snapshot(work, case.changes)
        new = sorted(paths(work) - names) if case.nothing_new else []
        broken = case.check(work, out) if case.check else None
        if case.after and not broken:
            broken = case.after(work, out, err.decode("utf-8", "replace"))
    finally:
        for p in (work / "ro", work / "full"):
            if p.is_dir():
                subprocess.run(["umount", str(p)], check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    text = err.decode("utf-8", "replace").strip()
    quiet_ok = case.code == 0 or case.logs or len(text.splitlines()) == 1
    if case.interrupt_when:  # training logs before it stops: judge the last line
        quiet_ok = (
            text.splitlines()[-1].startswith(("interrupted", "terminated", "stopped at"))
            if text
            else False
        )
    if case.says and case.says not in text:
        broken = f"stderr does not say {case.says!r}"
    if case.not_says and case.not_says in text:
        broken = f"stderr says {case.not_says!r}"
    if case.max_s and wall > case.max_s:
        broken = f"took {wall:.0f} s, over {case.max_s:.0f}"
    if new:
        broken = f"wrote {new[:4]}"
    broken = problem or broken
    lost = sorted(k for k in before if after.get(k) != before[k]) + ([broken] if broken else [])
    return {
        "case": case.name,
        "code": code,
        "expected": case.code,
        "traceback": "Traceback" in text,
        "one_line": quiet_ok,
        "lost": lost,
        "message": text.splitlines()[-1][:110] if text else "",
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    parser.add_argument("--only", default="", help="Run the cases whose name contains this.")
    parser.add_argument("--skip", default=None, help="Skip the cases whose name contains this.")
    args = parser.parse_args()
    can_mount = (
        os.geteuid() == 0
        and subprocess.run(["mount", "--version"], capture_output=True).returncode == 0
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        prepare(base)
        BASES["root"], BASES["base"] = Path(tmp) / "bases", base
        results = []
        for case in CASES:
            if args.only not in case.name or (args.skip and args.skip in case.name):
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
        f"{sum(r['code'] != r['expected'] for r in results)} with another exit code; "
        f"{time.monotonic() - started:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
