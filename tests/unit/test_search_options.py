"""Decoding options (`mtkit.core.search_options`): one table, one builder, one check."""

from __future__ import annotations

import pytest

from mtkit.core.search_options import SearchOptions


def test_nbest_larger_than_beam_is_rejected_naming_where_the_beam_came_from():
    from mtkit.core.config import DecodeConfig
    from mtkit.core.errors import OptionError

    with pytest.raises(
        OptionError,
        match=r"--nbest 6 must not exceed the checkpoint's beam "
        r"size 5",
    ):
        SearchOptions.from_config(DecodeConfig(), nbest=6)
    with pytest.raises(OptionError, match=r"--nbest 3 must not exceed --beam 2"):
        SearchOptions.from_config(DecodeConfig(), nbest=3, beam=2)


def test_the_config_decode_section_takes_its_defaults_and_ranges_from_the_options():
    from dataclasses import fields

    from mtkit.core.config import ConfigError, DecodeConfig, config_from_dict
    from mtkit.core.search_options import OPTIONS

    for f in fields(DecodeConfig):
        not_the_searchs = ("precision", "cuda_graphs", "compile", "workers", "split")
        if f.name not in not_the_searchs:
            assert getattr(DecodeConfig(), f.name) == OPTIONS[f.name].default
    with pytest.raises(ConfigError, match=r"decode.beam must be in \[1, 256\], got 257"):
        config_from_dict({"decode": {"beam": 257}})
    with pytest.raises(ConfigError, match=r"decode.batch_tokens must be in \[1, "):
        config_from_dict({"decode": {"batch_tokens": 0}})
    with pytest.raises(ConfigError, match=r"decode.workers must be in \[0, 256\], got 257"):
        config_from_dict({"decode": {"workers": 257}})


def test_the_command_line_help_of_each_decoding_option_is_the_tables():
    import typer

    from mtkit.cli import app
    from mtkit.core.search_options import OPTIONS

    commands = typer.main.get_command(app).commands
    for command in ("translate", "serve"):
        helps = {p.name: p.help for p in commands[command].params}
        for name in (
            "beam",
            "lenpen",
            "max_len_a",
            "no_repeat_ngram",
            "sampling",
            "topp",
            "align_layer",
        ):
            assert helps[name] == OPTIONS[name].help, (command, name)
    assert {p.name: p.help for p in commands["translate"].params}["nbest"] == OPTIONS["nbest"].help


@pytest.mark.parametrize(
    "given, says",
    [
        ({"beam": 0}, "--beam must be from 1 to 256, got 0"),
        ({"lenpen": float("nan")}, "--lenpen must be from 0 to 10, got nan"),
        ({"max_len_b": -1}, "--max-len-b must be at least 0, got -1"),
        ({"sampling": True, "temperature": 0.0}, "--temperature must be above 0, got 0.0"),
        ({"sampling": True, "topp": 1.5}, "--topp must be in (0, 1], got 1.5"),
        ({"topk": 5}, "--topk is a sampling option: add --sampling"),
        ({"align_layer": 0}, "--align-layer chooses where alignments come from: add --alignments"),
    ],
)
def test_each_option_is_checked_once_with_the_flag_named(given, says):
    from mtkit.core.config import DecodeConfig
    from mtkit.core.errors import OptionError

    with pytest.raises(OptionError) as e:
        SearchOptions.from_config(DecodeConfig(), **given)
    assert str(e.value) == says and e.value.option in given


def test_a_request_field_is_named_as_the_api_spells_it():
    """`mtkit serve` builds a request's options with the same checks, naming its fields."""
    from mtkit.core.errors import OptionError

    defaults = SearchOptions(beam=4)
    assert SearchOptions.from_config(defaults, spell=str, nbest=4).nbest == 4
    with pytest.raises(OptionError, match=r"^nbest 3 must not exceed beam 2$") as e:
        SearchOptions.from_config(defaults, spell=str, beam=2, nbest=3)
    assert e.value.option == "nbest"


def test_an_engine_refuses_what_it_cannot_do_in_one_line_naming_the_option():
    from mtkit.core.errors import OptionError
    from mtkit.core.search_options import Capabilities, check

    ct2 = Capabilities(sampling=False, alignments=False, needs="a checkpoint")
    check(SearchOptions(beam=3, nbest=2), ct2)  # a plain search: fine
    for opts, option in (
        (SearchOptions(sampling=True), "--sampling"),
        (SearchOptions(alignments=True), "--alignments"),
        (SearchOptions(alignments=True, align_layer=0), "--align-layer"),
    ):
        with pytest.raises(OptionError, match=rf"^{option} needs a checkpoint$"):
            check(opts, ct2)
    check(SearchOptions(sampling=True, alignments=True), Capabilities())  # PyTorch's
