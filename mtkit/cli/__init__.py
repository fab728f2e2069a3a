"""The `mtkit` command line: parse options, load the config, call one library function.

`app` (and what every command shares) is in `mtkit.cli.app`; the commands are in
`stages` (tokenizer, preprocess, train, run), `translating` (translate, eval, serve),
`tools` (average, export) and `explaining` (explain), added to `app` in that order.
"""

from mtkit.cli import stages, translating, tools, explaining  # noqa: F401, I001  (in help order)
from mtkit.cli.app import app, main

__all__ = ["app", "main"]
