"""The one registry of decoding strategies, and the decoding options they declare.

Every module of `specjax.decoding.drafters` that exports `STRATEGIES` ({name: `Strategy`}) is
registered here: adding a drafter is adding its file (and its tests). `DecodingConfig` joins
the option groups of every registered strategy (`decoding.options`): the checkpoint's
`decoding` section, the entry points' flags and the benchmark's sweep axes all read it.
A builder sees only the fields it declares; what a strategy reads is recorded while it is
built (`require_used`), so a flag it ignores is an error without a table. A strategy that
declares `VocabOptions` gets the draft-vocabulary size set on its drafter here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from specjax.decoding import drafters
from specjax.decoding.draft_vocab import VocabOptions
from specjax.decoding.drafter import Drafter, Strategy
from specjax.decoding.options import join_options
from specjax.discovery import exported


def discover(package: Any = drafters) -> dict[str, Strategy]:
    """The strategies the modules of `package` export, by name (a name exported twice is an
    error)."""
    return exported(package, "STRATEGIES", "strategy")


STRATEGIES: Mapping[str, Strategy] = discover()
_GROUPS = [group for strategy in STRATEGIES.values() for group in strategy.options]
# The most shared groups first (the shape's, the exit's): the order of flags in --help and of
# the rows of a benchmark's sweep.
DecodingConfig = join_options(sorted(dict.fromkeys(_GROUPS), key=lambda g: -_GROUPS.count(g)))
DecodingConfig.__module__ = __name__  # where pickle finds it


def make_strategy(name: str, options: Any) -> Drafter:
    """The named strategy with these options (a `DecodingConfig`; one-line ValueError for
    unknown names). The strategy's builder sees only the options it declares."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose from {sorted(STRATEGIES)}")
    strategy, declared = STRATEGIES[name], _Declared(name, options, declared_options([name]))
    if strategy.composite:
        return strategy.build(declared, lambda part: make_strategy(part, options))
    drafter = strategy.build(declared)
    if VocabOptions in strategy.options:  # a vocabulary head (`decoding.draft_vocab`)
        drafter = dataclasses.replace(drafter, draft_vocab=declared.draft_vocab)
    return drafter


def declared_options(names: Sequence[str]) -> set[str]:
    """The decoding options these strategies declare (their option groups' fields)."""
    return {field.name for name in names for group in STRATEGIES[name].options
            for field in dataclasses.fields(group)}


def require_used(strategies: Sequence[str], option_sets: Sequence[Any],
                 chosen: Collection[str], prefix: str = "--") -> None:
    """A one-line error when an option the user set (`chosen`, e.g. from flags) is read by none
    of these strategies built with any of these option sets: `--tree` with `calm`, `--skip_layers`
    with `selfspec`, `--num_draft` with a dynamic tree are mistakes, not defaults. What a
    strategy reads is recorded while building it, so a new strategy needs no table; an auto
    tree reads what the static tree it becomes reads. `prefix` names an option as the caller
    gave it ("--" for a flag, "" for a keyword)."""
    read = {field for name in strategies for options in option_sets
            for field in options_read(name, options)}
    unused = [name for name in chosen if name not in read]
    if unused:
        names = ", ".join(strategies)
        raise ValueError(f"{prefix}{unused[0]} is not used by strategy {names} with these options "
                         f"(it reads {', '.join(sorted(read)) or 'no decoding option'}): drop it "
                         "or choose a strategy that uses it")


def options_read(name: str, options: Any) -> set[str]:
    """The decoding options strategy `name` reads when built with `options` (a tree-capable
    strategy reads `tree`; given a tree, it no longer reads `num_draft`). An auto tree reads
    what the static tree it becomes reads."""
    if options.tree.strip().startswith("auto"):
        options = dataclasses.replace(options, tree="1")
    recorder = _ReadRecorder(options)
    make_strategy(name, recorder)
    return recorder.read


class _ReadRecorder:
    """Decoding options that note which of them are read."""

    def __init__(self, options: Any):
        self._options, self.read = options, set()

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._options, name)


class _Declared:
    """The options a strategy declared; reading another one is the drafter's bug, named."""

    def __init__(self, strategy: str, options: Any, declared: set[str]):
        self._strategy, self._options, self._declared = strategy, options, declared

    def __getattr__(self, name: str) -> Any:
        if name not in self._declared:
            raise AttributeError(f"strategy {self._strategy!r} reads decoding option {name!r}, "
                                 "which none of its option groups declares")
        return getattr(self._options, name)
