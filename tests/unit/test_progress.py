"""Progress bars and progress log lines (`mtkit.core.progress`)."""

from __future__ import annotations

from mtkit.core.config import config_from_dict
from mtkit.core.progress import ProgressLog
from mtkit.training.resume import Progress


def test_progress_is_a_live_bar_on_a_terminal_and_lines_elsewhere(caplog, capsys):
    import io
    import logging

    from rich.console import Console

    from mtkit.core.progress import ProgressView

    caplog.set_level(logging.INFO, logger="mtkit.core.progress")
    tc = config_from_dict({"train": {"max_steps": 20, "log_every": 5}}).train
    record = {"loss": 2.5, "lr": 1e-3, "tokens_per_s": 1234.0}
    screen = io.StringIO()
    progress = Progress()
    view = ProgressView(tc, progress, console=Console(file=screen, force_terminal=True, width=140))
    for step in range(1, 11):
        progress.step = step
        view.update(progress, record if step % 5 == 0 else None)
    view.close()
    shown = screen.getvalue()
    assert "step 10/20" in shown and "loss 2.500 | lr 1.00e-03 | 1,234 tok/s" in shown
    assert "ETA" in shown and "\x1b[" in shown  # drawn with terminal control codes
    assert capsys.readouterr().err == ""

    view = ProgressView(tc, progress, console=Console(file=io.StringIO(), force_terminal=False))
    view.update(progress)
    view.update(progress, record)
    view.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "train | step 10/20 | epoch 1 | loss 2.500 | lr 1.00e-03 | 1,234 tok/s | ETA 0:00:00"
    ]


def test_progress_is_logged_with_the_share_done_and_the_time_left(caplog, monkeypatch):
    clock = iter([0.0, 5.0, 12.0, 14.0, 30.0])
    monkeypatch.setattr("mtkit.core.progress.time.perf_counter", lambda: next(clock))
    progress = ProgressLog(total=1000, every=10.0)  # starts at 0 s
    with caplog.at_level("INFO", logger="mtkit.core.progress"):
        for pairs in (100, 200, 100, 400):  # at 5, 12, 14 and 30 s
            progress.advance(pairs)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "preprocess: 300 of 1,000 pairs (30%), 25 pairs/s, ~28 s left",
        "preprocess: 800 of 1,000 pairs (80%), 27 pairs/s, ~8 s left",
    ]


def test_progress_bar_only_for_long_files_on_a_terminal(tmp_path):
    import io

    from rich.console import Console

    from mtkit.core.progress import progress_bar

    long, short = tmp_path / "long.txt", tmp_path / "short.txt"
    long.write_text("a line\n" * 400)
    short.write_text("a line\n" * 100)
    screen = io.StringIO()
    with progress_bar(long, Console(file=screen, force_terminal=True, width=120)) as done:
        for _ in range(4):
            done(100)
    assert "400/400" in screen.getvalue() and "sentences/s" in screen.getvalue()
    for path, terminal in ((short, True), (long, False), (None, True)):
        console = Console(file=io.StringIO(), force_terminal=terminal)
        with progress_bar(path, console) as done:
            assert done is None
