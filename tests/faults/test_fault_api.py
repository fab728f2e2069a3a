"""Mistakes in what a Python caller passes: one `mtkit.Error` of one line that names the
argument, raised at the call, before anything runs (never a TypeError from inside, nor
an error deferred to a stream's first text)."""

from __future__ import annotations

import pytest

import mtkit


@pytest.fixture(scope="module")
def translator(trained):
    with mtkit.Translator.load(trained / "run" / "checkpoints" / "best.pt", device="cpu") as t:
        yield t


CONFIG = "config: give a Config (mtkit.load_config), its YAML's path (a str or a Path), or None"
OVERRIDES = "overrides: give a list of texts (or any iterable of them, in order), got"


@pytest.mark.parametrize(
    "call, says",
    [
        (lambda: mtkit.train(5), CONFIG + " (the defaults), got int"),
        (lambda: mtkit.train(b"exp.yaml"), CONFIG + " (the defaults), got bytes"),
        (lambda: mtkit.train(None, resume="yes"), "resume must be True or False, got 'yes'"),
        (lambda: mtkit.load_config(5), "path: give a config's YAML path (a str or a Path)"),
        (lambda: mtkit.load_config(None, [5]), "overrides[0]: expected text, got int"),
        (lambda: mtkit.preprocess(None, None), OVERRIDES + " NoneType"),
        (lambda: mtkit.run(None, [5]), "overrides[0]: expected text, got int"),
        (lambda: mtkit.run({"run_dir": "x"}), CONFIG + " (the defaults), got dict"),
        (
            lambda: mtkit.train_tokenizer(None, "train.lr=3e-4"),
            "overrides: give a list of texts, not one text",
        ),
        (
            lambda: mtkit.load_config(None, ["train.lr"]),
            "overrides 'train.lr': expected section.key=value",
        ),
        (
            lambda: mtkit.load_config(None, ["train.lrr=3"]),
            "overrides: train.lrr is not a key; did you mean train.lr?",
        ),
        (lambda: mtkit.score(["a"], ["a"], metrics=5), "metrics: give a list of texts"),
        (lambda: mtkit.score(b"a", ["a"]), "hypotheses: give a list of texts, not bytes"),
    ],
)
def test_the_stage_functions_check_their_arguments_at_the_call(call, says, monkeypatch):
    """Config and overrides are checked before any stage starts (a stage that started
    would fail the test: each is replaced by one that raises)."""
    from mtkit.stages import pipeline, preprocess, tokenizer
    from mtkit.training import loop

    def started(*args, **kwargs):
        raise AssertionError("a stage started")

    for module, name in (
        (loop, "train"),
        (pipeline, "run_all"),
        (preprocess, "preprocess"),
        (tokenizer, "build_tokenizer"),
    ):
        monkeypatch.setattr(module, name, started)
    with pytest.raises(mtkit.Error) as e:
        call()
    assert says in str(e.value) and "\n" not in str(e.value) and "--" not in str(e.value)


@pytest.mark.parametrize(
    "options, says",
    [
        ({"beam": 0}, "beam must be from 1 to 256, got 0"),
        ({"n_best": 3, "beam": 2}, "n_best 3 must not exceed"),
        ({"format": "pdf"}, "format must be one of"),
        ({"format": "html", "n_best": 2}, "n_best is for text"),
        ({"tgt_lang": "xx"}, "tgt_lang xx: this model translates en into de only"),
        ({"bogus": 1}, "unknown option 'bogus'; the options are chunk, beam, lenpen"),
        ({"glossary": {"a": "b"}}, "glossary: give a Glossary"),
    ],
)
def test_translate_iter_refuses_its_options_at_the_call(translator, options, says):
    """Before the stream's first text is read, not at the first `next()`."""
    read = []

    def texts():
        read.append(1)
        yield "A dog."

    with pytest.raises(mtkit.Error) as e:
        translator.translate_iter(texts(), **options)
    assert says in str(e.value) and "\n" not in str(e.value) and not read


def test_translate_iter_with_good_options_still_streams_as_translate(translator):
    texts = ["A dog runs.", "Two men talk.", "A girl."]
    want = [t.text for t in translator.translate(texts, beam=2)]
    assert [t.text for t in translator.translate_iter(iter(texts), chunk=2, beam=2)] == want


def test_translate_iter_takes_constraints_for_a_stream_of_one_chunk(translator):
    """Constraints are one list per text: the check at the call leaves them to the chunk
    they go with (checked at the call with no texts, one list was always one too many)."""
    want = [t.text for t in translator.translate(["A dog."], beam=4, constraints=[["Hund"]])]
    got = translator.translate_iter(["A dog."], beam=4, constraints=[["Hund"]])
    assert [t.text for t in got] == want


@pytest.mark.parametrize(
    "texts, says",
    [
        (b"A dog.", "texts: give a list of texts, not bytes (bytes are no text: decode them"),
        (bytearray(b"A dog."), "texts: give a list of texts, not bytes"),
        ([b"A dog."], "texts[0]: expected text, got bytes (bytes are no text: decode them"),
        (["A cat.", memoryview(b"x")], "texts[1]: expected text, got bytes"),
    ],
)
def test_bytes_are_refused_as_bytes_not_read_as_numbers(translator, texts, says):
    """Bytes iterate as numbers: "expected text, got int" said nothing of the mistake."""
    for call in (translator.translate, translator.translate_iter):
        with pytest.raises(mtkit.Error) as e:
            list(call(texts))
        assert says in str(e.value) and "got int" not in str(e.value)
