"""The public Python API (`mtkit`, `mtkit.api`): load once, translate as the CLI does,
results as `Translation`s, errors as mtkit's own."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import mtkit
from mtkit.documents.markup import tags

from conftest import cli

ANY = "give a list of texts (or any iterable of them, in order), "  # what is no such list


@pytest.fixture(scope="module")
def model(trained):
    return trained / "run" / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def translator(model):
    with mtkit.Translator.load(model, device="cpu") as t:
        yield t


def test_import_mtkit_names_the_api_and_stays_light():
    assert {"Translator", "Translation", "score", "Scores", "Error"} <= set(dir(mtkit))
    code = "import sys, mtkit; print('torch' in sys.modules, 'mtkit.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_api_translates_as_the_cli_does(translator, model, tmp_path):
    lines = ["A dog runs.", "", "Two men. A woman sings!", "A man in a blue shirt."]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    result = cli("translate", "-m", str(model), "-i", str(tmp_path / "in.txt"), "--scores")
    assert result.exit_code == 0, result.output
    got = translator.translate(lines)
    assert all(isinstance(t, mtkit.Translation) for t in got)
    expected = [line.split("\t") for line in result.stdout.splitlines()]
    assert [t.text for t in got] == [e[0] for e in expected]
    assert [f"{t.confidence:.4f}" for t in got] == [e[1] for e in expected]
    assert got[1].text == "" and got[1].source == ""
    assert [s.source for s in got[2].sentences] == ["Two men.", "A woman sings!"]
    streamed = list(translator.translate_iter(iter(lines), chunk=3))  # other batches
    assert [t.text for t in streamed] == [t.text for t in got]
    assert [t.confidence for t in streamed] == pytest.approx([t.confidence for t in got], abs=1e-4)


def test_results_carry_alternatives_alignments_and_pieces(translator):
    (t,) = translator.translate(["A man is riding a bike."], beam=4, n_best=3, alignments=True)
    assert len(t.alternatives) == 2 and t.score >= t.alternatives[0].score
    assert t.confidence <= 0 and t.tokens and "".join(t.tokens).replace("\u2581", " ").strip()
    words = (len(t.source.split()), len(t.text.split()))
    assert t.alignment and all(s < words[0] and w < words[1] for s, w in t.alignment)


def test_constraints_and_glossaries_reach_the_search(translator):
    (t,) = translator.translate(["A dog."], beam=4, constraints=[["Hund"]])
    assert "Hund" in t.text and t.constraints_met is True


@pytest.mark.parametrize(
    "call, says",
    [
        (lambda t: t.translate("A dog."), "give a list of texts"),
        (lambda t: t.translate(["A dog."], beam=0), "beam must be from 1"),
        (lambda t: t.translate(["A dog."], n_best=9, beam=2), "n_best 9 must not exceed"),
        (lambda t: t.translate(["A dog."], format="pdf"), "format must be one of"),
        (lambda t: t.translate([3]), "texts[0]: expected text"),
        (lambda t: t.translate(["\ud800"]), "lone surrogate"),
        (lambda t: t.translate(["a", "b"], constraints=[["x"]]), "one list per text"),
        (
            lambda t: t.translate(None),
            ANY + "got NoneType",
        ),
        (
            lambda t: t.translate({"a": 1}),
            ANY + "got dict",
        ),
        (
            lambda t: t.translate({"a", "b"}),
            ANY + "got set",
        ),
        (lambda t: t.translate(["a"], beam=2.5), "beam must be a whole number"),
        (lambda t: t.translate(["a"], n_best="2"), "n_best must be a whole number"),
        (lambda t: t.translate(["a"], glossary={"a": "b"}), "glossary: give a Glossary"),
        (lambda t: t.translate(["A man."], tgt_lang="xx"), "xx"),
        (lambda t: t.translate(["<p>A man.</p>"], format="html", tgt_lang="xx"), "xx"),
        (
            lambda t: t.translate(["A dog runs."], constraints=["Katze"]),
            "constraints[0]: expected a list of phrases, got Katze",
        ),
        (
            lambda t: t.translate(["A dog."], constraints="Katze"),
            "constraints: give one list of phrases per text, got str",
        ),
        (
            lambda t: t.translate(["<p>A dog <b>runs</b>.</p>"], format="html", n_best=2),
            "n_best is for text; format html writes a document",
        ),
        (lambda t: t.translate(["a"], ignore_tags="b"), "ignore_tags is for html or xml documents"),
        (
            lambda t: t.translate(["a"], format="xml", splitting_tags=["<p>"]),
            "splitting_tags: '<p>' is not a tag name",
        ),
        (
            lambda t: t.translate(["a"], format="xml", outline_detection="no"),
            "outline_detection must be true or false",
        ),
        (lambda t: t.translate(["a"], format="xml", its_rules=5), "its_rules must be the path"),
        (
            lambda t: t.translate(["A <b>dog</b> &amp; a cat"], format="srt", ignore_tags="b"),
            "ignore_tags is for html or xml documents, not srt",
        ),
        (lambda t: t.translate(["A dog & a cat."], format="xml"), "line 1, column 7"),
        (lambda t: t.translate(["a"], batch_tokens="5"), "batch_tokens must be a whole number"),
        (lambda t: t.translate(["a"], batch_tokens=-5), "batch_tokens must be from 1 to"),
        (lambda t: t.translate(["a"], split="no"), "split must be True or False, got 'no'"),
        (lambda t: t.translate(["a"], tgt_lang=5), "tgt_lang must be text, got 5"),
        (lambda t: t.translate(["a"], alignments=True, align_layer=99), "align_layer must be 0"),
        (lambda t: t.translate_iter(["a"], chunk=0), "chunk must be at least 1, got 0"),
        (lambda t: t.translate_iter(["a"], chunk=-1), "chunk must be at least 1, got -1"),
        (lambda t: t.translate_iter(["a"], chunk="2"), "chunk must be a whole number"),
        (
            lambda t: t.translate_iter(None),
            "texts: " + ANY + "got",
        ),
        (
            lambda t: t.translate_iter(5),
            "texts: " + ANY + "got int",
        ),
        (lambda t: t.translate_iter("A dog."), "texts: give a list of texts, not one text"),
        (lambda t: t.translate(["a"], beam=np.float64(2.0)), "beam must be a whole number"),
        (lambda t: t.translate(["a"], split=np.int64(1)), "split must be True or False"),
        (lambda t: t.translate(["a"], beam=np.bool_(True)), "beam must be a whole number"),
        (
            lambda t: t.options(bogus=2),
            "unknown option 'bogus'; the options are beam, lenpen, max_len_a, max_len_b, n_best,",
        ),
    ],
)
def test_mistakes_are_mtkit_errors_of_one_line(translator, call, says):
    """Each names the Python argument (never a CLI flag), at the call."""
    with pytest.raises(mtkit.Error) as e:
        call(translator)
    assert says in str(e.value) and "\n" not in str(e.value) and "--" not in str(e.value)


@pytest.mark.parametrize(
    "path, kw, says",
    [
        ([], {}, "path: give a model's path (a str or a Path) or a list of them, got []"),
        (None, {}, "path: give a model's path (a str or a Path) or a list of them, got None"),
        (123, {}, "path: give a model's path (a str or a Path) or a list of them, got 123"),
        (b"/x.pt", {}, "path: give a model's path (a str or a Path) or a list of them, got b'"),
        ("MODEL", {"workers": "2"}, "workers must be a whole number, got '2'"),
        ("MODEL", {"workers": 1.5}, "workers must be a whole number, got 1.5"),
        ("MODEL", {"workers": -1}, "workers must be 0 (auto) to 256, got -1"),
        ("MODEL", {"precision": "int9"}, "precision must be auto, fp32, bf16 or int8"),
    ],
)
def test_load_checks_its_arguments_by_their_python_names(model, path, kw, says):
    with pytest.raises(mtkit.Error) as e:
        mtkit.Translator.load(model if path == "MODEL" else path, **kw)
    assert str(e.value).startswith(says) and "--" not in str(e.value)


def test_numpy_scalars_are_the_numbers_they_hold(model, translator):
    """As a caller's array gives them: np.int64 a whole number, np.float32 a number,
    np.bool_ True or False; each translates as the Python number would."""
    texts = ["A dog runs.", "Two men. A woman sings!"]
    with mtkit.Translator.load(model, device="cpu", workers=np.int64(1)) as loaded:
        got = loaded.translate(
            texts,
            beam=np.int64(3),
            n_best=np.int32(2),
            lenpen=np.float32(1.0),
            batch_tokens=np.int64(1000),
            split=np.bool_(True),
        )
    want = translator.translate(texts, beam=3, n_best=2, lenpen=1.0, batch_tokens=1000, split=True)
    assert [(t.text, [a.text for a in t.alternatives]) for t in got] == [
        (t.text, [a.text for a in t.alternatives]) for t in want
    ]
    assert [t.text for t in translator.translate_iter(texts, chunk=np.int64(1))] == [
        t.text for t in want
    ]
    opts = translator.options(sampling=np.bool_(True), seed=np.int64(3), topk=np.int32(5))
    assert (opts.sampling, opts.seed, opts.topk) == (True, 3, 5)
    assert [type(x) for x in (opts.sampling, opts.seed, opts.topk)] == [bool, int, int]


def test_a_text_with_nothing_visible_is_empty(translator):
    """Only whitespace, zero-width and format characters (a byte-order mark, a soft
    hyphen, a word joiner): an empty translation, as for "", never one made up."""
    texts = ["\u200b", " \ufeff\u2060 ", "\u00ad", "\u200b\n\t"]
    got = translator.translate(texts)
    assert [(t.text, t.score, t.tokens) for t in got] == [("", 0.0, ())] * len(texts)
    assert translator.translate(["A\u200bdog."])[0].text != ""


def test_loading_what_is_no_model_is_one_error(tmp_path):
    bad = tmp_path / "x.pt"
    bad.write_text("not a checkpoint")
    with pytest.raises(mtkit.Error):
        mtkit.Translator.load(bad)
    with pytest.raises(mtkit.Error, match="device must be"):
        mtkit.Translator.load(bad, device="tpu")


def test_score_is_sacrebleus():
    s = mtkit.score(["Ein Mann fährt Rad ."], ["Ein Mann fährt Rad ."], metrics=["bleu", "chrf"])
    assert s.bleu == pytest.approx(100.0) and s.chrf == pytest.approx(100.0) and s.ter is None
    assert s.signatures["bleu"].startswith("nrefs:1")
    with pytest.raises(mtkit.Error):
        mtkit.score(["a"], ["a", "b"])
    one = mtkit.score(["Ein Mann fährt Rad ."], ["Ein Mann fährt Rad ."], metrics="bleu")
    assert one.bleu == pytest.approx(100.0) and one.chrf is None and one.ter is None


def test_score_takes_any_iterable_of_texts():
    """A generator (read once), a tuple; metrics any iterable of names, such as a set."""
    texts = ["Ein Mann fährt Rad .", "Zwei Hunde spielen ."]
    s = mtkit.score((t for t in texts), tuple(texts), metrics={"bleu"})
    assert s.bleu == pytest.approx(100.0) and s.chrf is None and s.ter is None
    assert mtkit.score(iter(texts), texts, metrics=iter(["chrf"])).chrf == pytest.approx(100.0)


@pytest.mark.parametrize(
    "args, says",
    [
        (([None], ["a"]), "hypotheses[0]: expected text, got NoneType"),
        (("Ein Hund", "Ein Hund"), "hypotheses: give a list of texts, not one text"),
        ((["a"], "a"), "references: give a list of texts, not one text"),
        ((["a"], ["a"], ["bleu", 3]), "metrics[1]: expected text, got int"),
        (
            (5, ["a"]),
            "hypotheses: " + ANY + "got int",
        ),
    ],
)
def test_score_refuses_what_is_not_texts(args, says):
    with pytest.raises(mtkit.Error, match=re.escape(says)):
        mtkit.score(*args)


def test_documents_in_one_call_are_translated_as_one_by_one(translator):
    pages = ["<p>A <b>dog</b> runs. Two men talk.</p>", "<ul><li>A girl.</li><li>A cat</li></ul>"]
    together = translator.translate(pages, format="html")
    alone = [translator.translate([p], format="html")[0] for p in pages]
    assert [t.text for t in together] == [t.text for t in alone]
    assert together[0].text.startswith("<p>") and together[0].text.count("<b>") == 1
    assert len(together[1].sentences) == 2 and together[1].confidence <= 0


def test_segments_are_fragments_and_the_markup_options_reach_them(translator):
    """The issue's segment, refused once (no root), and DeepL's options as keywords."""
    segment = "Select <parmname>Multiple Languages</parmname> and add the languages you want."
    (out,) = translator.translate([segment], format="xml")
    assert tags(out.text, "xml") == tags(segment, "xml")
    (kept,) = translator.translate([segment], format="xml", ignore_tags="parmname")
    assert "<parmname>Multiple Languages</parmname>" in kept.text
    (html_out,) = translator.translate([segment], format="html")
    assert len(html_out.sentences) == 1  # one sentence, not three
    (plain,) = translator.translate(["Select Multiple Languages and add the languages you want."])
    assert re.sub(r"<[^>]+>", "", html_out.text).split() == plain.text.split()


def test_the_stages_are_functions(work):
    config = mtkit.load_config(work / "exp.yaml", ["train.max_steps=24"])
    assert config.train.max_steps == 24
    result = mtkit.train(work / "exp.yaml", ["train.max_steps=24"])
    assert result.step == 24  # resumed from the copy's step 20
    again = mtkit.train(config, ["train.max_steps=26"])  # a Config, with overrides on it
    assert again.step == 26
    with pytest.raises(mtkit.Error, match="no such config file"):
        mtkit.train(work / "missing.yaml")
    with pytest.raises(mtkit.Error, match="train.max_stepz"):
        mtkit.load_config(work / "exp.yaml", ["train.max_stepz=3"])
