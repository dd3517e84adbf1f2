"""Decoding options, declared by the drafters that read them.

A drafter module declares the options it reads as small frozen dataclasses of `option` fields
(`ShapeOptions` for a proposal's shape, CALM's own, ...): a default, the help of its flag and a
check against the model. The registry joins the groups of every registered strategy into one
flat `DecodingConfig`: the `decoding` section a checkpoint stores, one flag per field in the
entry points (`specjax.cli.decoding`) and one sweep axis per field in `bench/bench.py`. A new
drafter's options are therefore declared once, in its own file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from specjax.config import SETTING_KINDS, ModelConfig, kind_problem

# check(value, model config) -> what is wrong with the value ("must be >= 1"), or None.
Check = Callable[[Any, ModelConfig], str | None]


def option(default: Any, help: str, check: Check | None = None, *, listed: bool = False) -> Any:
    """A decoding option: its default (whose type the value must have), its flag's help, a
    check against the model, and whether its values hold commas (`listed`: a sweep repeats the
    flag instead of splitting one value at commas)."""
    if type(default) not in SETTING_KINDS:
        raise TypeError(f"a decoding option's default must be an int, a float or a string (a "
                        f"flag of that type), not {default!r}")
    return dataclasses.field(default=default, metadata={"help": help, "check": check,
                                                         "listed": listed})


def at_least(low: int | float) -> Check:
    """A check that the value is >= `low`."""
    return lambda value, cfg: None if value >= low else f"must be >= {low}"


def within(low: float, high: float, *, high_included: bool) -> Check:
    """A check that the value lies in [low, high] (or [low, high) without `high_included`)."""
    def check(value: float, cfg: ModelConfig) -> str | None:
        inside = low <= value <= high if high_included else low <= value < high
        return None if inside else f"must lie in [{low}, {high}{']' if high_included else ')'}"
    return check


def join_options(groups: Iterable[type]) -> type:
    """One frozen dataclass with the fields of every option group, in order (a group named
    twice counts once; a field that two groups declare is an error: its flag would be
    ambiguous)."""
    owners: dict[str, type] = {}
    fields = []
    for group in dict.fromkeys(groups):
        for field in dataclasses.fields(group):
            if field.name in owners:
                raise ValueError(f"decoding option {field.name!r} is declared by both "
                                 f"{owners[field.name].__name__} and {group.__name__}")
            owners[field.name] = group
            fields.append((field.name, field.type, dataclasses.field(default=field.default,
                                                                     metadata=field.metadata)))
    return dataclasses.make_dataclass(
        "DecodingConfig", fields, frozen=True, namespace={"check": _check, "__doc__": (
            "Decoding defaults stored with a trained model for the inference entry points "
            "(whose flags of the same names override them): every registered drafter's "
            "options (`specjax.decoding.options`); each field's help is its metadata's.")})


def _check(options: Any, cfg: ModelConfig) -> None:
    """Raises a one-line ValueError naming the first option of the wrong type or value."""
    for field in dataclasses.fields(options):
        value, kind = getattr(options, field.name), type(field.default)
        problem = kind_problem(value, kind) or (field.metadata["check"]
                                                and field.metadata["check"](value, cfg))
        if problem:
            raise ValueError(f"decoding.{field.name}={value!r} {problem}")
