"""`mtkit translate` decoding outputs through the CLI: ensembles and word alignments,
on the tiny trained run of tests/conftest.py."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mtkit.cli import app

runner = CliRunner()
LINES = "A dog runs in the park.\n\nTwo men talk.\n"


def translate(*args, input: str = LINES) -> list[str]:
    result = runner.invoke(app, ["translate", *map(str, args)], input=input)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def links(text: str) -> list[tuple[int, int]]:
    return [tuple(map(int, pair.split("-"))) for pair in text.split()]


def test_alignments_follow_the_text_in_every_output_format(trained):
    best = trained / "run" / "checkpoints" / "best.pt"
    plain = translate("-m", best)
    rows = translate("-m", best, "--alignments")
    assert [r.split("\t")[0] for r in rows] == plain  # same translations, one tab more
    for row, source in zip(rows, LINES.splitlines()):
        text, alignment = row.split("\t")
        assert (alignment == "") == (source == "")
        for s, t in links(alignment):
            assert 0 <= s < len(source.split()) and 0 <= t < len(text.split())
        if text:  # every target word is linked
            assert {t for _, t in links(alignment)} == set(range(len(text.split())))
    scored = translate("-m", best, "--alignments", "--scores")  # the same batches again
    assert [r.split("\t")[::2] for r in scored] == [r.split("\t") for r in rows]
    nbest = translate("-m", best, "--alignments", "--nbest", "2", "--beam", "2")
    assert len(nbest) == 6 and all(len(r.split(" ||| ")) == 4 for r in nbest)
    assert nbest[0].split(" ||| ")[3] == rows[0].split("\t")[1]
    records = [
        json.loads(r)
        for r in translate(
            "-m",
            best,
            "--format",
            "jsonl",
            "--alignments",
            "--nbest",
            "2",
            "--beam",
            "2",
            input='{"src": "A dog runs in the park.", "id": 7}\n',
        )
    ]
    assert records[0]["alignment"] == rows[0].split("\t")[1] and records[0]["id"] == 7
    assert [e["alignment"] for e in records[0]["nbest"]][0] == records[0]["alignment"]
    other_layer = translate("-m", best, "--alignments", "--align-layer", "0")
    assert [r.split("\t")[0] for r in other_layer] == plain


def test_an_ensemble_runs_each_model_and_one_model_twice_changes_nothing(trained):
    checkpoints = trained / "run" / "checkpoints"
    best, early = checkpoints / "best.pt", checkpoints / "step_10.pt"
    single = translate("-m", best, "--scores")
    twice = translate("-m", best, "-m", best, "--scores")
    assert [r.split("\t")[0] for r in twice] == [r.split("\t")[0] for r in single]
    pair = translate("-m", best, "-m", early, "--scores", "--alignments")
    assert len(pair) == 3 and pair[1] == "\t0.0000\t"
    assert pair != translate("-m", early, "--scores", "--alignments")


def test_a_translate_call_opens_one_session_and_translates_through_it(trained, monkeypatch):
    """The CLI is an adapter: its options are checked once, by the session it opens
    (`Session.open`), and every line goes through that session's `translate_requests`."""
    from mtkit.engines import session as session_module

    opened, requests = [], []
    real_open, real_requests = (
        session_module.Session.open.__func__,
        session_module.translate_requests,
    )

    def counted_open(cls, *args, **kwargs):
        opened.append(kwargs.get("spell"))
        return real_open(cls, *args, **kwargs)

    def counted_requests(translator, rows, *args, **kwargs):
        requests.append(len(rows))
        return real_requests(translator, rows, *args, **kwargs)

    monkeypatch.setattr(session_module.Session, "open", classmethod(counted_open))
    monkeypatch.setattr(session_module, "translate_requests", counted_requests)
    best = trained / "run" / "checkpoints" / "best.pt"
    out = translate("-m", best, "--beam", "2")
    assert len(out) == 3 and out[1] == "" and out[0] and out[2]
    assert len(opened) == 1 and sum(requests) == 3
    result = runner.invoke(app, ["translate", "-m", str(best), "--beam", "0"], input=LINES)
    assert result.exit_code == 2 and "--beam" in result.stderr and len(opened) == 2
