"""Plain data (YAML's) checked against frozen dataclasses: each leaf's type and range,
unknown keys (with the nearest valid one), lists of sections; `ConfigError` for every
mistake, one line naming the file and the dotted key. `mtkit.core.config` declares what the
sections are; this module only checks data against them."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any, Literal

from mtkit.core.errors import UserError, nearest


class ConfigError(UserError, ValueError):
    """A user mistake in a config file or a `--set` override (one line)."""

    label = "config error: "


def value_range(lo: float | None = None, hi: float | None = None, lo_open: bool = False):
    """Field metadata: the allowed closed range [lo, hi] (or (lo, hi] with lo_open)."""
    return {"lo": lo, "hi": hi, "lo_open": lo_open}


def _field_types(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(tp) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _convert(value: Any, tp, key: str, where: str) -> Any:
    """Check (and for numbers, widen) one leaf value against its annotated type."""
    bad = ConfigError(f"{where}{key} must be {_describe(tp)}, got {value!r}")
    if typing.get_origin(tp) is Literal:
        if isinstance(value, bool) and {"on", "off"} <= set(typing.get_args(tp)):
            value = "on" if value else "off"  # YAML 1.1 reads on and off as true and false
        if value not in typing.get_args(tp):
            raise bad
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, str):  # YAML 1.1 reads `3e-4` (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise bad from None
        if not isinstance(value, (int, float)):
            raise bad
        if not math.isfinite(value):
            raise ConfigError(f"{where}{key} must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, bool):  # `tgt_lang: no` (Norwegian) reads as false
            raise ConfigError(
                f"{where}{key} must be a string, got {value!r}: quote it, as "
                f"YAML reads yes, no, on and off as true or false"
            )
        if not isinstance(value, str):
            raise bad
        return value
    raise TypeError(f"unsupported config type {tp}")  # a bug in this module


def _check_range(value, meta, key: str, where: str) -> None:
    lo, hi, lo_open = meta.get("lo"), meta.get("hi"), meta.get("lo_open", False)
    if lo is None and hi is None:
        return
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    too_high = hi is not None and value > hi
    if too_low or too_high:
        left = "(" if lo_open else "["
        span = f"{left}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ConfigError(f"{where}{key} must be in {span}, got {value!r}")


# A language code goes into its tag, `<2xx>` (`mtkit.core.languages`), a SentencePiece
# user-defined symbol that must stay one piece: ASCII letters, digits, - and _ (en,
# pt-BR, deu_Latn). A space splits it (`c p`: 7 pieces, in every translation), a `>`
# ends it early, and a non-ASCII letter may not survive the tokenizer's NFKC
# normalization. 35 characters: what RFC 5646 (4.4.1) asks any holder of a BCP 47
# language tag to allow for.
LANGUAGE_CODE = re.compile(r"[A-Za-z0-9_-]{1,35}")
LANGUAGE_CODE_RULE = "ASCII letters, digits, - and _, at most 35; e.g. en, pt-BR, deu_Latn"


def language_code_fault(code: str) -> str | None:
    """What is wrong with `code` as a language code, as the end of an error line
    ("'c p' is not a language code (...)"; a long value shortened), or None."""
    if isinstance(code, str) and LANGUAGE_CODE.fullmatch(code):
        return None
    shown = code if not isinstance(code, str) or len(code) <= 40 else code[:40] + "..."
    return f"{shown!r} is not a language code ({LANGUAGE_CODE_RULE})"


ALIASES = {"from": "from_"}  # YAML keys that are Python keywords -> their field names


def build_section(cls, data: Any, prefix: str, where: str):
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}"
        )
    types_ = _field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        name = ALIASES.get(name, name)
        if value is None and name in fields and fields[name].default == "":
            value = ""  # `init_from: null`: none
        if name not in fields:
            names = {v: k for k, v in ALIASES.items()}
            valid = [f"{prefix}{names.get(n, n)}" for n in fields]
            close = nearest(name, fields)
            hint = f"did you mean {prefix}{close}?" if close else "valid keys: " + ", ".join(valid)
            raise ConfigError(f"{where}{key} is not a key; {hint}")
        tp = types_[name]
        if typing.get_origin(tp) is tuple and not dataclasses.is_dataclass(
            typing.get_args(tp)[0]
        ):  # a list of plain values (or one value)
            kwargs[name] = _build_values(typing.get_args(tp)[0], value, key, where)
        elif typing.get_origin(tp) is tuple:  # a list of corpora (or one mapping)
            kwargs[name] = _build_list(
                typing.get_args(tp)[0], value, fields[name].default[0], key, where
            )
        elif dataclasses.is_dataclass(tp):
            default = fields[name].default
            base = dataclasses.asdict(default) if default is not dataclasses.MISSING else {}
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{where}{key} must be a mapping, got {value!r}")
            kwargs[name] = build_section(tp, {**base, **(value or {})}, key + ".", where)
        else:
            converted = _convert(value, tp, key, where)
            _check_range(converted, fields[name].metadata, key, where)
            kwargs[name] = converted
    return cls(**kwargs)


def _build_values(tp, value: Any, key: str, where: str) -> tuple:
    """A tuple of plain values of type `tp`, from a list (or one value)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    return tuple(
        _convert(item, tp, f"{key}.{i}" if len(items) > 1 else key, where)
        for i, item in enumerate(items)
    )


def _build_list(cls, value: Any, default, key: str, where: str) -> tuple:
    """A tuple of `cls` from one mapping or a list of mappings; each starts from `default`."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]  # tuple: a default
    if not items:
        raise ConfigError(f"{where}{key} is an empty list; give at least one corpus")
    base = dataclasses.asdict(default)
    out = []
    for i, item in enumerate(items):
        item_key = f"{key}.{i}" if len(items) > 1 else key
        if item is not None and not isinstance(item, dict):
            raise ConfigError(f"{where}{item_key} must be a mapping, got {item!r}")
        out.append(build_section(cls, {**base, **(item or {})}, item_key + ".", where))
    return tuple(out)
