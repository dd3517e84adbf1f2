"""The proposal shape the decoding options describe, and those options: what every drafter that
drafts a chain or a tree (all but `ar` and `calm`) reads."""

from __future__ import annotations

import dataclasses

from specjax.decoding.options import at_least, option, within
from specjax.decoding.proposal import Shape
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree

CHAIN_SPECS = ("", "chain")


def _tree_spec(value: str, cfg: object) -> str | None:
    """Checks a `tree` option when it is set (config files, checkpoints, flags), not when a
    strategy first drafts with it: the tree's own parse error, else None."""
    spec = value.strip()
    if spec in (*CHAIN_SPECS, "dynamic", "auto") or spec.startswith("auto:"):
        return None
    try:
        StaticTree.parse(spec)
    except ValueError as error:
        return f"is not a tree: {str(error).split(': ', 1)[-1]}"
    return None


@dataclasses.dataclass(frozen=True)
class ShapeOptions:
    """A chain of up to `num_draft` tokens per round, a row stopping early at a draft whose
    probability is below `draft_threshold` (0: never); or, when `tree` is set, a token tree:
    children per depth ("2,2,1,1"), a JSON file of parents, "dynamic" (EAGLE-2: `tree_nodes`
    nodes, `tree_top_k` children per expanded node, `tree_depth` levels) or "auto" (shaped from
    measurements); `tree_children`: how a static tree's sampled children are drawn."""

    num_draft: int = option(4, "Drafts per round K of a chain.", at_least(1))
    draft_threshold: float = option(
        0.0, "A chain row stops drafting after a draft whose draft probability is below this "
             "(0: always K drafts).", within(0, 1, high_included=False))
    tree: str = option(
        "", "A token tree instead of a chain: children per depth (2,2,1,1), a parents list "
            "([-1,0,0]) or JSON file of one, 'dynamic' (EAGLE-2) or 'auto' (a Sequoia tree "
            "shaped from measurements); 'chain' for a chain.", _tree_spec, listed=True)
    tree_nodes: int = option(16, "Node budget T of a dynamic tree.", at_least(1))
    tree_top_k: int = option(4, "Children per expanded node, and expanded nodes per depth, of a "
                                "dynamic tree.", at_least(1))
    tree_depth: int = option(4, "Depth of a dynamic tree.", at_least(1))
    tree_children: str = option(
        "without_replacement", "How a static tree's sampled children are drawn: "
                               "without_replacement, iid or top_k (deterministic).")


def shape_for(options: ShapeOptions, stop_risk: float = 0.0) -> Shape:
    """The proposal shape the options describe: a chain unless `tree` is set. `stop_risk`: a
    chain's SpecDec++ stop (h), for the drafter with an acceptance head to pass on; trees have
    none (that drafter scores a dynamic tree with its head instead). A tree does not read the
    chain's options (`num_draft`, `draft_threshold`): stored defaults do not apply to it, and
    the same given by the user are refused as unused (`registry.require_used`)."""
    tree = options.tree.strip()
    if tree in CHAIN_SPECS:
        return Chain(options.num_draft, options.draft_threshold, stop_risk)
    if tree == "auto" or tree.startswith("auto:"):
        raise ValueError(f"tree {tree!r} must be resolved from measurements first "
                         "(infer/generate.py and bench/bench.py do)")
    if tree == "dynamic":
        return DynamicTree(options.tree_nodes, options.tree_top_k, options.tree_depth)
    return StaticTree.parse(tree, options.tree_children)
