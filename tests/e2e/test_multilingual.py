"""One model for two directions (`mtkit.languages`): the copy task as two "languages",
copy (`cp`) and copy reversed (`rv`), chosen by the <2xx> tag each source line starts
with. Both are learned by one model and `translate --tgt-lang` picks which (serve's
target_lang, and an export to CTranslate2, likewise); a missing or unknown language is
one line. Validation and `mtkit run` score each direction on its own."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from mtkit.config import load_config
from mtkit.preprocess import preprocess
from mtkit.tokenizer import build_tokenizer
from mtkit.train import train

from conftest import cli, one_line_error

ROOT = Path(__file__).resolve().parents[2]
COPY = ROOT / "data" / "copy"


def reversed_copy(folder: Path, name: str) -> Path:
    """The copy task's `name` split with each target reversed, as a .gz file."""
    with gzip.open(COPY / f"{name}.tgt.gz", "rt") as f:
        lines = [" ".join(reversed(line.split())) for line in f.read().splitlines()]
    path = folder / f"{name}.rev.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def two_way(tmp_path_factory):
    return train_two_way(tmp_path_factory.mktemp("multilingual"))


@pytest.fixture(scope="module")
def two_way_target(tmp_path_factory):
    """The same, with the tag as the decoder's first token (`model.lang_tag: target`)."""
    return train_two_way(tmp_path_factory.mktemp("multilingual-target"), "target")


def train_two_way(folder: Path, lang_tag: str = "source"):
    splits = {}
    for split, name in (("train", "train"), ("valid", "valid"), ("test", "test")):
        src = str(COPY / f"{name}.src.gz")
        splits[split] = [{"src": src, "tgt": str(COPY / f"{name}.tgt.gz"), "tgt_lang": "cp"},
                         {"src": src, "tgt": str(reversed_copy(folder, name)), "tgt_lang": "rv"}]
    # 4,000 steps at lr 0.003 after 200 of warm-up: with 3,000 at 0.002 after 100, the
    # target-tag model copied 45 and reversed 24 of the 60 test lines under
    # ATEN_CPU_CAPABILITY=avx2 (training's last bits differ by CPU); now it copies all 60
    # and reverses 60 under default kernels, 54 under avx2
    overrides = [f"run_dir={folder / 'run'}", "train.max_tokens=2048", "train.lr=0.003",
                 "train.warmup_steps=200", "train.max_steps=4000", "train.valid_every=4000",
                 "train.log_every=4000",
                 "train.precision=fp32", "train.attention=sdpa", "tokenizer.vocab_size=34",
                 f"model.lang_tag={lang_tag}"]
    overrides += [f"data.{split}={corpora!r}".replace("'", '"') for split, corpora in
                  splits.items()]
    cfg = load_config(ROOT / "configs" / "copy.yaml", overrides)
    build_tokenizer(cfg)
    preprocess(cfg)
    train(cfg)
    with gzip.open(COPY / "test.src.gz", "rt") as f:
        sources = [x for x in f.read().splitlines() if 4 <= len(x.split()) <= 10][:60]
    return folder / "run" / "checkpoints" / "last.pt", sources


def test_validation_scores_each_direction_and_best_follows_their_mean(two_way):
    checkpoint, _ = two_way
    lines = (checkpoint.parents[1] / "metrics.jsonl").read_text().splitlines()
    valid = [r for r in map(json.loads, lines) if r.get("event") == "valid"][-1]
    each = valid["by_direction"]
    assert set(each) == {"src-cp", "src-rv"}
    assert each["src-cp"]["valid_bleu"] > each["src-rv"]["valid_bleu"] > 50  # copying: easier
    mean = (each["src-cp"]["valid_bleu"] + each["src-rv"]["valid_bleu"]) / 2
    assert valid["valid_bleu"] == pytest.approx(mean, abs=1e-3)
    assert valid["best_bleu"] == pytest.approx(mean, abs=1e-3)  # the only validation


def test_run_prints_a_table_of_the_test_directions(two_way):
    checkpoint, _ = two_way
    run = checkpoint.parents[1]
    manifest = json.loads((run / "data" / "train" / "manifest.json").read_text())
    assert manifest["directions"] == {"src-cp": {"pairs": manifest["pairs"] // 2, "share": 0.5},
                                      "src-rv": {"pairs": manifest["pairs"] // 2, "share": 0.5}}
    result = cli("run", "--config", run / "config.yaml")  # trained: translates and scores
    assert result.exit_code == 0, result.output
    header, cp, rv, mean = result.stdout.splitlines()[:4]
    assert header.split() == ["direction", "BLEU", "chrF", "TER"]
    assert cp.startswith("src-cp ") and rv.startswith("src-rv ") and mean.startswith("mean")
    scores = json.loads((run / "test.scores.json").read_text())["directions"]
    assert float(cp.split()[1]) == pytest.approx(scores["src-cp"]["bleu"]["score"], abs=0.01)
    assert scores["src-cp"]["bleu"]["score"] > 90
    assert scores["src-cp"]["bleu"]["score"] > scores["src-rv"]["bleu"]["score"]


def test_serve_takes_target_lang_and_info_lists_the_directions(two_way):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mtkit.decoding import SearchOptions
    from mtkit.engines.loader import load_engine
    from mtkit.serving.app import create_app
    from mtkit.serving.scheduler import Limits

    checkpoint, sources = two_way
    engine = load_engine(checkpoint, "cpu", precision="fp32")
    app = create_app(engine, SearchOptions.from_config(engine.config.decode), Limits(),
                     "last.pt")
    with TestClient(app) as api:
        info = api.get("/v1/info").json()
        assert info["directions"] == ["src-cp", "src-rv"]
        assert info["target_languages"] == ["cp", "rv"]
        line = sources[0]
        answer = api.post("/v1/translate", json={"text": [line, ""], "target_lang": "rv",
                                                 "alignments": True}).json()
        first, empty = answer["translations"]
        links = [tuple(map(int, x.split("-"))) for x in first["alignment"].split()]
        opts = replace(SearchOptions.from_config(engine.config.decode), alignments=True)
        best = engine.translate(["<2rv> " + line], opts)[0][0]  # the line as the model reads it
        assert first["text"] == engine.tgt_vocab.decode(best.tokens) and empty["text"] == ""
        tagged = best.alignment
        assert links == [(s - 1, t) for s, t in tagged if s > 0]  # the tag: not a user word
        assert links and all(0 <= s < len(line.split()) for s, _ in links)
        for body, says in (({"text": [line]}, "give target_lang with one of them"),
                           ({"text": [line], "target_lang": "fr"},
                            "target_lang fr: this model translates into cp, rv")):
            r = api.post("/v1/translate", json=body)
            assert r.status_code == 422 and says in r.json()["error"], r.json()
        assert 'id="target_lang"' in api.get("/").text


def test_an_export_keeps_the_tags(two_way, tmp_path):
    pytest.importorskip("ctranslate2")
    checkpoint, sources = two_way
    out = tmp_path / "ct2"
    result = cli("export", "-m", checkpoint, "--to", "ctranslate2", "-o", out)
    assert result.exit_code == 0, result.output
    text = "\n".join(sources[:20]) + "\n"
    native = cli("translate", "-m", checkpoint, "--tgt-lang", "rv", "--precision", "fp32",
                 input=text)
    exported = cli("translate", "-m", out, "--tgt-lang", "rv", input=text)
    assert exported.exit_code == 0, exported.output
    assert exported.stdout == native.stdout
    one_line_error(cli("translate", "-m", out, input=text),
                   "this model translates into cp, rv: give --tgt-lang")


def test_one_model_copies_or_reverses_as_the_tag_asks(two_way):
    checkpoint, sources = two_way
    # Reversing is the harder task (exact on 53-60 of the 60 lines across CPU kernels
    # when this fixture trained 3,000 steps); either way, not the other task's output.
    copied_or_reversed(checkpoint, sources, 0.75)


def test_a_multilingual_model_needs_a_language_it_knows(two_way):
    checkpoint, _ = two_way
    one_line_error(cli("translate", "-m", checkpoint, input="a b c\n"),
                   "this model translates into cp, rv: give --tgt-lang")
    one_line_error(cli("translate", "-m", checkpoint, "--tgt-lang", "de", input="a b c\n"),
                   "--tgt-lang de: this model translates into cp, rv")
    records = cli("translate", "-m", checkpoint, "--format", "jsonl", "--precision", "fp32",
                  input='{"src": "a b c", "tgt_lang": "rv"}\n{"src": "a b c"}\n')
    assert records.exit_code == 0, records.output
    first, second = records.stdout.splitlines()
    assert '"translation": "c b a"' in first and "give --tgt-lang" in second


def test_a_target_side_tag_is_forced_and_taken_off(two_way_target):
    """With `model.lang_tag: target` the tag starts each stored target, not the source;
    translate forces it as the output's start and takes it off again, and the tag still
    picks the task; validation and `mtkit run` score outputs without it."""
    from mtkit.data.shards import ShardDataset
    from mtkit.vocab import load_vocabs

    checkpoint, sources = two_way_target
    run = checkpoint.parents[1]
    vocab = load_vocabs(run, joint=True)[1]
    test = ShardDataset(run / "data" / "test")
    assert test.texts("tgt")[0].startswith("<2cp> ") and "<2" not in test.texts("src")[0]
    x, y = test[0]
    assert vocab.piece(int(y[1])) == "<2cp>" and "<2cp>" not in [vocab.piece(int(i)) for i in x]
    # Reversing with the tag on the target side: 42-59 of the 60 lines exact across CPU
    # kernels when this fixture trained 3,000 steps, 54-60 with 4,000; copying: all or nearly.
    outputs = copied_or_reversed(checkpoint, sources, 0.6)
    assert not any("<2" in o for lines in outputs.values() for o in lines)
    records = cli("translate", "-m", checkpoint, "--format", "jsonl", "--precision", "fp32",
                  "--beam", "4", "--alignments",
                  input=json.dumps({"src": sources[0], "tgt_lang": "rv"}) + "\n")
    assert records.exit_code == 0, records.output
    record = json.loads(records.stdout)
    assert record["translation"] == outputs["rv"][0]  # the tag forced, then taken off
    words = len(record["translation"].split())
    assert all(0 <= int(x.split("-")[1]) < words for x in record["alignment"].split())
    served = _served(checkpoint, {"text": sources[:4] + [""], "target_lang": "rv", "beam": 4})
    assert [t["text"] for t in served["translations"]] == outputs["rv"][:4] + [""]
    valid = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if r.get("event") == "valid"][-1]
    assert valid["by_direction"]["src-cp"]["valid_bleu"] > 90
    result = cli("run", "--config", run / "config.yaml")
    assert result.exit_code == 0, result.output
    scores = json.loads((run / "test.scores.json").read_text())["directions"]
    assert scores["src-cp"]["bleu"]["score"] > 90 and scores["src-rv"]["bleu"]["score"] > 50


def _served(checkpoint: Path, body: dict) -> dict:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mtkit.decoding import SearchOptions
    from mtkit.engines.loader import load_engine
    from mtkit.serving.app import create_app
    from mtkit.serving.scheduler import Limits

    engine = load_engine(checkpoint, "cpu", precision="fp32")  # as the CLI runs above
    app = create_app(engine, SearchOptions.from_config(engine.config.decode), Limits(), "m")
    with TestClient(app) as api:
        answer = api.post("/v1/translate", json=body)
        assert answer.status_code == 200, answer.json()
        return answer.json()


def test_an_export_forces_a_target_side_tag_too(two_way_target, tmp_path):
    pytest.importorskip("ctranslate2")
    checkpoint, sources = two_way_target
    out = tmp_path / "ct2"
    assert cli("export", "-m", checkpoint, "--to", "ctranslate2", "-o", out).exit_code == 0
    text = "\n".join(sources[:20]) + "\n"
    native = cli("translate", "-m", checkpoint, "--tgt-lang", "rv", "--precision", "fp32",
                 input=text)
    exported = cli("translate", "-m", out, "--tgt-lang", "rv", input=text)
    assert exported.exit_code == 0, exported.output
    assert exported.stdout == native.stdout and "<2" not in exported.stdout


def copied_or_reversed(checkpoint: Path, sources: list[str], reversed_share: float
                       ) -> dict[str, list[str]]:
    """`translate --tgt-lang` cp and rv of `sources`: at least 80% copied exactly, and
    `reversed_share` reversed exactly; the two tasks' outputs differ (but palindromes)."""
    text = "\n".join(sources) + "\n"
    outputs = {}
    for lang, expected, share in (
            ("cp", sources, 0.8),
            ("rv", [" ".join(reversed(s.split())) for s in sources], reversed_share)):
        result = cli("translate", "-m", checkpoint, "--tgt-lang", lang, "--beam", "4",
                     "--precision", "fp32", input=text)
        assert result.exit_code == 0, result.output
        outputs[lang] = result.stdout.splitlines()
        exact = sum(o == e for o, e in zip(outputs[lang], expected, strict=True))
        assert exact >= share * len(sources), (lang, exact)
    palindromes = sum(s.split() == s.split()[::-1] for s in sources)
    assert sum(a == b for a, b in zip(outputs["cp"], outputs["rv"])) <= palindromes + 3
    return outputs


@pytest.mark.parametrize("where", ["two_way", "two_way_target"])
def test_outputs_keep_to_the_target_languages_pieces(where, request, tmp_path):
    """Training saves each target language's pieces with the target vocabulary (cp and
    rv write the same ones), and both engines load them. Translating into a language
    keeps its outputs to its pieces and the line's own prefix, line by line in a batch
    of both languages and in input order, with the tag on either side and in both
    engines; --no-lang-vocab lifts it, and the server does not stream such lines (a
    stream mixes languages)."""
    from collections import Counter

    from mtkit.checkpoint import load_checkpoint
    from mtkit.decoding import SearchOptions
    from mtkit.engines.loader import load_engine
    from mtkit.languages import tagging, untagged
    from mtkit.serving.stream import open_stream

    checkpoint, sources = request.getfixturevalue(where)
    saved = load_checkpoint(checkpoint)["vocab"]["tgt_languages"]
    assert set(saved) == {"cp", "rv"} and saved["cp"] == saved["rv"]
    engine = load_engine(checkpoint, "cpu", precision="fp32")
    assert engine.tgt_vocab.languages == saved
    vocab, opts = engine.tgt_vocab, replace(SearchOptions.from_config(engine.config.decode),
                                            beam=4)
    into = ["cp", "rv"] * 12  # interleaved
    tags = [tagging(engine.config, lang) for lang in into]
    tag_ids = frozenset(i for i in range(len(vocab)) if vocab.piece(i).startswith("<2"))

    def outputs(engine, opts, prefixes=("",) * len(into)):
        hyps = engine.translate([t.source + s for t, s in zip(tags, sources, strict=False)],
                                opts, prefixes=[t.target + p for t, p in zip(tags, prefixes)])
        return [untagged(h, source=False, target=tag_ids)[0].tokens for h in hyps]

    free = outputs(engine, opts)
    banned = next(i for i, _ in Counter(i for out in free[::2] for i in out).most_common()
                  if vocab.encode([vocab.decode([i])])[0] == [i])  # a word of its own
    everything = list(range(len(vocab)))
    vocab.languages = {"cp": [i for i in everything if i != banned], "rv": everything}
    kept = outputs(engine, opts)
    assert not any(banned in out for out in kept[::2]) and kept[::2] != free[::2]
    assert kept[1::2] == free[1::2]  # reversing may use every piece
    word = vocab.decode([banned])
    forced = vocab.encode([word])[0]
    prefixed = outputs(engine, opts, [word] + [""] * (len(into) - 1))
    assert prefixed[0][:len(forced)] == forced and prefixed[2:] == kept[2:]  # its own only
    assert outputs(engine, replace(opts, lang_vocab=False)) == free
    assert open_stream(engine, replace(opts, beam=1)) is None
    assert open_stream(engine, replace(opts, beam=1, lang_vocab=False)) is not None
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    assert cli("export", "-m", checkpoint, "--to", "ctranslate2", "-o", out).exit_code == 0
    exported = load_engine(out, "cpu")
    assert exported.tgt_vocab.languages == saved
    exported.tgt_vocab.languages = vocab.languages
    theirs = outputs(exported, opts)
    assert not any(banned in out for out in theirs[::2]) and theirs[1::2] == kept[1::2]
    # Kept off its likeliest word, copying meets near-ties that CTranslate2's kernels and
    # PyTorch's can break apart in the last bits: most lines still agree exactly.
    assert sum(a == b for a, b in zip(theirs[::2], kept[::2])) >= 9, (theirs, kept)
