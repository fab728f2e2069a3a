"""`mtkit run`: every stage in order, skipping those whose outputs are complete.

tokenizer -> (distill) -> preprocess -> train -> (average) -> translate the test set -> eval.
With `distill.teacher`, a teacher named by its config is run first (its own `mtkit run`),
and the distillation is complete when RUN/distill/manifest.json comes from the same
teacher, settings and source corpus (data.train's files, by their SHA-256: pointed at
another corpus, the stage runs again); the shards must then come from that corpus. A
stage is otherwise complete when its output exists: RUN/spm.model, RUN/data/train/manifest.json,
a checkpoint that reached the training limits, RUN/test.hyp newer than the checkpoint
it came from. Rerunning after an interruption picks up where it stopped. Ctrl-C (or
SIGTERM) during training saves a checkpoint and stops the whole pipeline (`Interrupted`):
nothing is translated with an unfinished model. The run directory's lock is held
throughout, so the stages it calls cannot race with another process.
"""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Callable, Collection
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from mtkit.core.atomic import write_atomic
from mtkit.core.checkpoint import final_checkpoint, newer
from mtkit.core.config import Config, load_config
from mtkit.core.configcheck import ConfigError
from mtkit.core.device import release_freed_memory
from mtkit.core.errors import UserError
from mtkit.core.languages import direction, tag, tags, without_tag
from mtkit.core.rundir import run_lock
from mtkit.core.scoring import Score, score
from mtkit.core.textio import Request
from mtkit.core.vocab import load_vocabs, vocab_paths
from mtkit.data.alignments import align_shard, aligned
from mtkit.data.shards import ShardDataset
from mtkit.data.sources import DataError
from mtkit.engines.loader import load_engine
from mtkit.engines.ranks import Ranks
from mtkit.engines.session import Session
from mtkit.stages.distill import (
    DistillError,
    distill,
    distilled_manifest,
    is_distilled,
    joined_ranks,
    resolve_teacher,
    teacher_configs,
)
from mtkit.stages.preprocess import preprocess
from mtkit.stages.tokenizer import build_tokenizer
from mtkit.training.loop import TrainResult, train

log = logging.getLogger(__name__)


class Interrupted(UserError):
    """Training stopped on a signal; the pipeline stops after its checkpoint, and the
    CLI exits as the shell does for that signal (128 + its number)."""

    label = "interrupted: "

    def __init__(self, signal_name: str):
        super().__init__(f"stopped by {signal_name} after saving a checkpoint; rerun to go on")
        self.signal_name = signal_name

    @property
    def exit_code(self) -> int:
        return 128 + signal.Signals[self.signal_name].value


@dataclass(frozen=True)
class RunResult:
    checkpoint: Path
    hypotheses: Path
    scores: list[Score]  # over the whole test set
    training: TrainResult  # where training stopped, why, and in which precision
    # A multilingual test set's scores per direction ("en-de": [...]); {} for one direction
    by_direction: dict[str, list[Score]] = field(default_factory=dict)


def run_all(cfg: Config) -> RunResult:
    if not cfg.data.corpora("test"):  # before hours of training, not after them
        raise ConfigError(
            "data.test is not set: `mtkit run` ends by translating and "
            "scoring the test set; set data.test, or run the tokenizer, "
            "preprocess and train commands on their own"
        )
    with joined_ranks(cfg) as ranks:
        with run_lock(cfg.run_path, "run") if ranks.main else nullcontext():
            return _run_all(cfg, ranks)


def _run_all(cfg: Config, ranks: Ranks) -> RunResult:
    """The stages; under torchrun (`ranks`) every rank distils its shares
    (`mtkit.engines.ranks`) and trains (DDP), rank 0 alone runs the others (deciding
    which are due, for every rank) while the others wait."""
    run = cfg.run_path
    for teacher in teacher_configs(cfg):
        log.info("stage teacher: %s", teacher)
        run_all(load_config(teacher))
    if ranks.first_says(not vocab_paths(run, cfg.tokenizer.joint)[1].exists()):
        log.info("stage tokenizer")
        _on_rank_0(ranks, build_tokenizer, cfg)
    shards = run / "data"
    if cfg.distill.teacher and _distill_stage(cfg, ranks):
        if (shards / "train" / "manifest.json").exists():  # from another distillation
            log.info("the distilled corpus is new: preprocessing again")
            _on_rank_0(ranks, preprocess, cfg)
    due = not all((shards / split / "manifest.json").exists() for split in ("train", "test"))
    if ranks.first_says(due):
        log.info("stage preprocess")  # (data.test added since: its shards are still to do)
        _on_rank_0(ranks, preprocess, cfg)
    else:  # skipped: the shards must still come from the current tokenizer
        ShardDataset(run / "data" / "train").check_tokenizer(*load_vocabs(run, cfg.tokenizer.joint))
        due = cfg.train.guided_alignment and not aligned(run / "data" / "train")
        if ranks.first_says(due):
            log.info("stage align (train.guided_alignment)")
            _on_rank_0(ranks, align_shard, run / "data" / "train")
    log.info("stage train")
    result = train(cfg, resume=True)
    release_freed_memory()  # the trained model is gone: translation starts from less
    if result.interrupted_by:
        raise Interrupted(result.interrupted_by)
    checkpoint = final_checkpoint(cfg)
    test_dir = run / "data" / "test"
    if not (test_dir / "manifest.json").exists():
        raise DataError("data.test is not set: `mtkit run` ends by scoring the test set")
    test = ShardDataset(test_dir)
    sources, references, target_tags = _test_texts(cfg, test)
    groups = test.directions()
    hyp_path = run / "test.hyp"
    if ranks.first_says(not newer(hyp_path, checkpoint)):
        log.info("stage translate: %d test sentences with %s", len(sources), checkpoint.name)
        _on_rank_0(ranks, _translate_test, cfg, checkpoint, sources, target_tags, hyp_path)
    hypotheses = hyp_path.read_text("utf-8").split("\n")[:-1]
    scores = score(hypotheses, references, METRICS)
    by_direction = (
        {}
        if len(groups) < 2
        else {
            d: score([hypotheses[i] for i in ix], [references[i] for i in ix], METRICS)
            for d, ix in groups.items()
        }
    )
    report = _report(scores)
    if by_direction:
        report["directions"] = {d: _report(s) for d, s in by_direction.items()}
    report["checkpoint"] = str(checkpoint)
    if ranks.main:
        write_atomic(run / "test.scores.json", (json.dumps(report, indent=2) + "\n").encode())
    return RunResult(checkpoint, hyp_path, scores, result, by_direction)


def _on_rank_0(ranks: Ranks, stage: Callable[..., object], *args: object) -> None:
    """`stage(*args)` run by rank 0 alone (one process: by it), the other ranks waiting
    until it is done."""
    if ranks.main:
        stage(*args)
    ranks.barrier()


def _translate_test(
    cfg: Config,
    checkpoint: Path,
    sources: list[str],
    target_tags: list[str] | None,
    hyp_path: Path,
) -> None:
    """RUN/test.hyp: the test sources translated with the final checkpoint."""
    engine = load_engine(checkpoint, cfg.train.device)
    # the run's decode section (not the checkpoint's); the tags are the test set's
    session = Session.open(engine, decode=cfg.decode, target=False)
    found = session.translate(_test_requests(sources, target_tags))
    hypotheses = [nbest[0].text for nbest in found]
    write_atomic(hyp_path, "".join(h + "\n" for h in hypotheses).encode("utf-8"))


def _distill_stage(cfg: Config, ranks: Ranks) -> bool:
    """Distil unless RUN/distill holds this teacher's finished corpus of data.train (as it
    is now: `distill.corpus_identity`); whether the corpus
    differs from the one the shards were made from. A student already trained on another
    corpus is refused rather than resumed on this one. Under torchrun every rank
    translates its shares (`mtkit.stages.distill`)."""
    # hashes the teacher's files: once, on rank 0
    teacher = ranks.first_says(resolve_teacher(cfg) if ranks.main else None)
    if not ranks.first_says(ranks.main and is_distilled(cfg, teacher)):
        log.info("stage distill")
        distill(cfg, teacher)
    manifest = cfg.run_path / "data" / "train" / "manifest.json"
    if not manifest.exists():
        return False
    made_from = ShardDataset(manifest.parent).manifest.get("distilled")  # (damaged: one line)
    if made_from == distilled_manifest(cfg)["corpus_sha256"]:
        return False
    if (cfg.run_path / "checkpoints" / "last.pt").exists():
        raise DistillError(
            f"{cfg.run_path}: the student in checkpoints/ trained on another corpus than "
            f"the teacher's translations in distill/ (a new teacher, corpus or settings); move "
            f"checkpoints/ away to train a new student"
        )
    return True


METRICS = ["bleu", "chrf", "ter"]


def _test_texts(cfg: Config, test: ShardDataset) -> tuple[list[str], list[str], list[str] | None]:
    """The test sources and references, and each output's forced start: a multilingual
    model's target tag with `model.lang_tag: target` (then taken off the references),
    else None."""
    sources, references = test.texts("src"), test.texts("tgt")
    if cfg.model.lang_tag != "target" or not tags(cfg.data):
        return sources, references, None
    target_tags, first = [""] * len(sources), 0
    for corpus, report in zip(cfg.data.corpora("test"), test.manifest["corpora"], strict=True):
        end = first + report["written"]  # preprocess wrote the corpora one after another
        target_tags[first:end] = [f"{tag(direction(corpus, cfg.data)[1])} "] * (end - first)
        first = end
    return sources, [without_tag(r) for r in references], target_tags


def _test_requests(sources: list[str], target_tags: list[str] | None) -> list[Request]:
    """The test sources as `mtkit translate` reads them: a multilingual model's source tag
    (which the test shards keep at the line's start) apart from the text, so that a line
    of several sentences is split without it and each sentence gets it again; each
    output's forced start (`target_tags`) as its target tag."""
    requests = []
    for i, line in enumerate(sources):
        text = without_tag(line)
        requests.append(
            Request(
                text,
                tag=line[: len(line) - len(text)],
                target_tag=target_tags[i] if target_tags else "",
            )
        )
    return requests


def _report(scores: list[Score]) -> dict:
    return {s.metric: {"score": round(s.score, 2), "signature": s.signature} for s in scores}


def direction_table(by_direction: dict[str, list[Score]], trained: Collection[str]) -> str:
    """The test scores of each direction, a table; those not `trained` marked zero-shot,
    and the mean of the trained ones."""
    lines = ["direction            BLEU   chrF    TER"]
    for d, scores in by_direction.items():
        label = d if d in trained else f"{d} (zero-shot)"
        lines.append(f"{label:<18} " + " ".join(f"{x.score:6.2f}" for x in scores))
    rows = [[x.score for x in s] for d, s in by_direction.items() if d in trained]
    if rows:
        mean = [sum(col) / len(rows) for col in zip(*rows, strict=True)]
        lines.append(f"{'mean (trained)':<18} " + " ".join(f"{x:6.2f}" for x in mean))
    return "\n".join(lines)
