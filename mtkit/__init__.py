"""mtkit: train and run Transformer translation models, from the command line or Python.

The public names (`mtkit.api`): `Translator` (load a model once; translate texts, streams
and documents), `Translation` (what every translation returns), `score` (BLEU, chrF and
TER) and `Scores`, and `Error`, the base of every error mtkit raises for its caller's
input. They load on first use, so that `import mtkit` (and the CLI's start) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = [
    "Error",
    "Scores",
    "Translation",
    "Translator",
    "load_config",
    "preprocess",
    "run",
    "score",
    "train",
    "train_tokenizer",
]

if TYPE_CHECKING:
    from mtkit.api import (
        Error,
        Scores,
        Translator,
        load_config,
        preprocess,
        run,
        score,
        train,
        train_tokenizer,
    )
    from mtkit.core.translation import Translation


def __getattr__(name: str):
    if name == "Translation":
        from mtkit.core.translation import Translation

        return Translation
    if name in __all__:
        from mtkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'mtkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
