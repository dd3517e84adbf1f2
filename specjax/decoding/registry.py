"""The one registry of decoding strategies and proposal shapes.

A strategy is a `Drafter` built from the decoding options (`DecodingConfig`: the checkpoint's
defaults, overridden by flags). Adding one means adding it to `STRATEGIES`; the generate and
bench entry points, labels and the peer benchmark all read from here and from the drafter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any

from specjax.config import DecodingConfig
from specjax.decoding.drafter import Drafter
from specjax.decoding.drafters.autoregressive import Autoregressive
from specjax.decoding.drafters.calm import Calm, CalmDraft
from specjax.decoding.drafters.draft_model import DraftModel
from specjax.decoding.drafters.early_exit import EarlyExit
from specjax.decoding.drafters.kangaroo import Kangaroo
from specjax.decoding.drafters.layerskip import SelfSpeculative, SkipLayers
from specjax.decoding.drafters.specdec import SpecDecHead
from specjax.decoding.proposal import Shape
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree

STRATEGIES: dict[str, Callable[[DecodingConfig], Drafter]] = {
    "ar": lambda options: Autoregressive(),
    "selfspec": lambda options: SelfSpeculative(options.exit_layer, shape_for(options)),
    "skip": lambda options: SkipLayers(skip_set(options), shape_for(options)),
    "kangaroo": lambda options: Kangaroo(options.exit_layer, shape_for(options)),
    "draft": lambda options: DraftModel(shape_for(options)),
    "specdec": lambda options: SpecDecHead(options.exit_layer, shape_for(options,
                                                                         options.draft_risk)),
    "calm": lambda options: Calm(early_exit(options), options.calm_threshold,
                                 options.calm_decay),
    "calmdraft": lambda options: CalmDraft(early_exit(options), options.calm_threshold,
                                           options.calm_decay, shape_for(options)),
}

CHAIN_SPECS = ("", "chain")


def make_strategy(name: str, options: DecodingConfig) -> Drafter:
    """The named strategy with these options (one-line ValueError for unknown names)."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose from {sorted(STRATEGIES)}")
    return STRATEGIES[name](options)


def require_used(strategies: Sequence[str], option_sets: Sequence[DecodingConfig],
                 chosen: Collection[str]) -> None:
    """A one-line error when an option the user set (`chosen`, e.g. from flags) is read by none
    of these strategies built with any of these option sets: `--tree` with `calm`, `--skip_layers`
    with `selfspec`, `--num_draft` with a dynamic tree are mistakes, not defaults. What a
    strategy reads is recorded while building it, so a new strategy needs no table; an auto
    tree reads what the static tree it becomes reads."""
    read: set[str] = set()
    for name in strategies:
        for options in option_sets:
            if options.tree.strip().startswith("auto"):
                options = dataclasses.replace(options, tree="1")
            recorder = _ReadRecorder(options)
            make_strategy(name, recorder)  # type: ignore[arg-type]
            read |= recorder.read
    unused = [name for name in chosen if name not in read]
    if unused:
        names = ", ".join(strategies)
        raise ValueError(f"--{unused[0]} is not used by strategy {names} with these options "
                         f"(it reads {', '.join(sorted(read)) or 'no decoding option'}): drop it "
                         "or choose a strategy that uses it")


class _ReadRecorder:
    """Decoding options that note which of them are read."""

    def __init__(self, options: DecodingConfig):
        self._options, self.read = options, set()

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._options, name)


def shape_for(options: DecodingConfig, stop_risk: float = 0.0) -> Shape:
    """The proposal shape the options describe: a chain unless `tree` is set. `stop_risk`: a
    chain's SpecDec++ stop (h), for the drafter with an acceptance head to pass on; trees have
    none (that drafter scores a dynamic tree with its head instead)."""
    tree = options.tree.strip()
    if tree in CHAIN_SPECS:
        return Chain(options.num_draft, options.draft_threshold, stop_risk)
    if options.draft_threshold:
        raise ValueError("draft_threshold (a chain's stop rule) does not apply to trees; set it "
                         "to 0")
    if tree == "auto" or tree.startswith("auto:"):
        raise ValueError(f"tree {tree!r} must be resolved from measurements first "
                         "(infer/generate.py and infer/bench.py do)")
    if tree == "dynamic":
        return DynamicTree(options.tree_nodes, options.tree_top_k, options.tree_depth)
    return StaticTree.parse(tree, options.tree_children)


def early_exit(options: DecodingConfig) -> EarlyExit:
    """CALM's early exit as the options describe it."""
    return EarlyExit(layer_list(options.calm_exits, "calm_exits"), options.calm_measure)


def skip_set(options: DecodingConfig) -> tuple[int, ...]:
    """The layers `skip_layers` names ("2,3,5"), as sorted indices."""
    layers = layer_list(options.skip_layers, "skip_layers")
    if not layers:
        raise ValueError("strategy 'skip' needs --skip_layers (comma-separated layer indices)")
    return layers


def layer_list(value: str, flag: str) -> tuple[int, ...]:
    """Comma-separated layer numbers ("2,3,5") as a tuple; a one-line error naming `flag`."""
    try:
        return tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{flag}={value!r}: expected comma-separated layer numbers, e.g. "
                         "2,3,5") from None
