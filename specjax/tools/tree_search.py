"""Tree shapes from measurements (Sequoia): `--tree auto` (`measure`, then
`Measurements.best_tree`).

1. Positional acceptance: on the model's own continuations of held-out prompts (greedy or
   sampled, as the decoding will be), the probability that the r-th child of a node is the one
   the target accepts, measured with the very acceptance rule decoding uses (`accept` on
   one-level trees of the drafter's top or sampled tokens).
2. Costs: the time of the drafter's layers and of the verifier's layers on n tokens at the
   prompts' context length, measured per n, plus the loop's per-round overhead (an `ar` step
   minus a full one-token pass).
3. Sequoia's dynamic programme: c(n, d) = 1 + max over child subtree sizes a_1 + ... = n - 1 of
   sum_r acc[r] * c(a_r, d - 1), the most tokens per round a tree of n positions (the pending
   token included) and depth d can expect; every (n, d) optimum is costed and the fastest
   expected tokens per second wins.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding.acceptance import accept
from specjax.decoding.engine import Generator
from specjax.decoding.proposal import CHILD_RULES, Proposal
from specjax.decoding.sampling import SamplingParams, draw_children
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.decoding.shapes.tree import chain_layout
from specjax.model import allocate_cache, embed, exit_logits, prefill_cached, run_layers_cached
from specjax.timing import progress_bar, timed

MAX_CHILDREN = 8


@dataclasses.dataclass(frozen=True)
class TreePlan:
    """The chosen tree, the tokens per round it should give (expected tau) and its expected
    speed-up over `ar` under the cost model, with the measurements behind them."""

    tree: StaticTree
    expected_tau: float
    expected_speedup: float
    acceptance: tuple[float, ...]

    def to_dict(self) -> dict:
        return {"parents": list(self.tree.parents), "children": self.tree.children,
                "expected_tau": self.expected_tau, "expected_speedup": self.expected_speedup,
                "acceptance": list(self.acceptance)}

    @classmethod
    def from_dict(cls, values: dict) -> TreePlan:
        return cls(StaticTree(tuple(values["parents"]), values["children"]),
                   values["expected_tau"], values["expected_speedup"],
                   tuple(values["acceptance"]))


@dataclasses.dataclass(frozen=True)
class Measurements:
    """Positional acceptance (`acceptance[r]`: how often a node's r-th child is accepted) and
    costs, for one model, exit, sampling mode and way of drawing children."""

    acceptance: np.ndarray
    costs: Costs
    children: str

    def best_tree(self, *, nodes: int | None = None, max_nodes: int = 32,
                  max_depth: int = 32) -> TreePlan:
        """The Sequoia tree with the highest expected speed-up: exactly `nodes` nodes, or (None)
        any count up to `max_nodes`; at most `max_depth` deep."""
        max_nodes = nodes or max_nodes
        programme = Sequoia(self.acceptance, max_nodes + 1, max_depth)
        best = None
        for depth in range(1, max_depth + 1):
            for size in ([nodes + 1] if nodes else range(2, max_nodes + 2)):
                found = programme.tree(size, depth)
                if found is None:
                    continue
                tau, parents = found
                tree = StaticTree.from_parents(parents, self.children)
                speedup = tau * self.costs.ar_step / self.costs.tree_round(tree)
                if best is None or speedup > best.expected_speedup:
                    best = TreePlan(tree, tau, speedup,
                                    tuple(float(a) for a in self.acceptance))
        return best


def measure(generator: Generator, exit_layer: int, prompts: Sequence[Sequence[int]], *,
            sampling: SamplingParams | None, children: str = "without_replacement",
            max_nodes: int = 32, new_tokens: int = 128, seed: int = 0) -> Measurements:
    """Positional acceptance on the model's own continuations of `prompts` and the costs of
    passes of up to `max_nodes` + 1 tokens at their context length."""
    if children not in CHILD_RULES:
        raise ValueError(f"tree children={children!r} must be one of {CHILD_RULES}")
    acceptance = child_acceptance(generator, exit_layer, prompts, sampling=sampling,
                                  children=children, new_tokens=new_tokens, seed=seed)
    context = int(np.mean([len(p) for p in prompts])) + new_tokens // 2
    return Measurements(acceptance, round_costs(generator, exit_layer, context, max_nodes + 1),
                        children)


@dataclasses.dataclass(frozen=True)
class Costs:
    """Measured seconds: `shallow[n]` and `deep[n]`, the drafter's layers [0, E) and the
    verifier's layers [E, L), each with the head, on n tokens; `overhead`, the loop's own time
    per round; `ar_step`, one `ar` round."""

    shallow: np.ndarray
    deep: np.ndarray
    overhead: float
    ar_step: float

    def tree_round(self, tree: StaticTree) -> float:
        """Modelled time of one round (`StaticTree.round_from_passes`): the drafter's passes
        (the leaves' in verification too) and the verifier's, as measured, and the loop's
        overhead."""
        return tree.round_from_passes(self.shallow.__getitem__, self.shallow.__getitem__,
                                      self.deep.__getitem__) + self.overhead


class Sequoia:
    """Sequoia's dynamic programme under positional acceptance `acceptance[r]` (the probability
    that a node's r-th child is the accepted one), for trees of at most `max_size` positions
    (the pending token included) and depth `max_depth`."""

    def __init__(self, acceptance: Sequence[float], max_size: int, max_depth: int):
        ranks = len(acceptance)
        # best[n, d]: most expected tokens per round with exactly n positions, depth <= d and
        # at most one child per rank (-inf: no such tree); split[n, d]: the child subtree
        # sizes (in rank order) that achieve it.
        self.best = np.full((max_size + 1, max_depth + 1), -np.inf)
        self.best[1, :] = 1.0
        self.split: dict[tuple[int, int], tuple[int, ...]] = {}
        for d in range(1, max_depth + 1):
            for n in range(2, max_size + 1):
                # fill[m, r]: the best value of m nodes spread over children of ranks >= r.
                fill = np.full((n, ranks + 1), -np.inf)
                fill[0, :] = 0.0
                choice = {}
                for r in reversed(range(ranks)):
                    for m in range(1, n):
                        subtree = self.best[1:m + 1, d - 1]  # -inf: no such subtree
                        feasible = subtree > -np.inf
                        values = (np.where(feasible, acceptance[r] * np.where(feasible, subtree,
                                                                              0.0), -np.inf)
                                  + fill[m - 1::-1, r + 1])
                        choice[m, r] = int(np.argmax(values)) + 1
                        fill[m, r] = values[choice[m, r] - 1]
                self.best[n, d] = 1.0 + fill[n - 1, 0]
                if self.best[n, d] == -np.inf:
                    continue
                sizes, m, r = [], n - 1, 0
                while m > 0:
                    sizes.append(choice[m, r])
                    m, r = m - choice[m, r], r + 1
                self.split[n, d] = tuple(sizes)

    def tree(self, size: int, depth: int) -> tuple[float, list[int]] | None:
        """The best tree of `size` positions and depth at most `depth`: (expected tokens per
        round, parents list); None if no tree has that size and depth."""
        if self.best[size, depth] == -np.inf:
            return None
        parents: list[int] = []

        def build(parent: int, n: int, d: int) -> None:
            if n < 2 or d < 1:
                return
            children = []
            for subtree in self.split[n, d]:
                parents.append(parent)
                children.append((len(parents) - 1, subtree))
            for node, subtree in children:
                build(node, subtree, d - 1)

        build(-1, size, depth)
        return float(self.best[size, depth]), parents


def child_acceptance(generator: Generator, exit_layer: int, prompts: Sequence[Sequence[int]],
                     *, sampling: SamplingParams | None, children: str, new_tokens: int,
                     seed: int = 0, repeats: int = 4, chunk: int = 512) -> np.ndarray:
    """acc[r], r < MAX_CHILDREN: how often the target accepts a node's r-th child, on the
    model's own continuations of `prompts` (greedy, or sampled with `sampling`)."""
    out = generator.generate(prompts, max_new_tokens=new_tokens, sampling=sampling, seed=seed)
    texts = [list(p) + t for p, t in zip(prompts, out.tokens, strict=True)]
    draft_logits, target_logits = _teacher_forced(generator, exit_layer, texts,
                                                  [len(p) for p in prompts])
    tree = StaticTree.from_branching((MAX_CHILDREN,), children)
    counts = np.zeros(MAX_CHILDREN)
    key = jax.random.PRNGKey(seed)
    total = 0
    for start in range(0, len(draft_logits), chunk):
        draft = jnp.repeat(draft_logits[start:start + chunk], repeats if sampling else 1, 0)
        target = jnp.repeat(target_logits[start:start + chunk], repeats if sampling else 1, 0)
        key, draw_key, accept_key = jax.random.split(key, 3)
        accepted = np.asarray(_first_level(draw_key, accept_key, draft, target, sampling, tree))
        counts += np.bincount(accepted[accepted >= 0], minlength=MAX_CHILDREN)
        total += len(accepted)
    return counts / total


@functools.partial(jax.jit, static_argnames=("tree",))
def _first_level(draw_key, accept_key, draft_logits, target_logits, sampling, tree):
    """The accepted child (-1: none) of one-level trees whose children the drafter drew from
    draft logits [M, V], judged against target logits [M, V] by `accept`."""
    batch, width = draft_logits.shape[0], tree.num_nodes
    tokens, q = draw_children(draw_key, draft_logits, sampling, width, tree.children)
    if q is not None and tree.children != "top_k":
        q = jnp.broadcast_to(q[:, None], (batch, width, q.shape[-1]))
        valid = jnp.take_along_axis(q, tokens[..., None], -1)[..., 0] > 0
    else:
        q, valid = None, jnp.ones((batch, width), bool)
    proposal = Proposal(tokens=tokens, parents=jnp.full((batch, width), -1, jnp.int32),
                        valid=valid, q=q, reuse=None, stats={}, shape=tree)
    logits = jnp.pad(target_logits[:, None], ((0, 0), (0, width), (0, 0)))
    result = accept(accept_key, proposal, logits, sampling)
    return jnp.where(result.num_accepted > 0, result.path[:, 0], -1)


def _teacher_forced(generator: Generator, exit_layer: int, texts: list[list[int]],
                    starts: list[int]) -> tuple[jax.Array, jax.Array]:
    """Draft (exit E) and target logits [M, V] predicting every generated token of `texts`."""
    cfg = generator.cfg
    padded, lengths = generator.pad(texts)
    batch, width = padded.shape
    cache = allocate_cache(cfg, batch, width)
    run = jax.jit(prefill_cached, static_argnames=("cfg", "layers"))
    shallow, cache = run(generator.params, cfg, embed(generator.params, cfg, padded), cache,
                         lengths, layers=(0, exit_layer))
    final, _ = run(generator.params, cfg, shallow, cache, lengths,
                   layers=(exit_layer, cfg.num_layers))
    rows = [(b, t) for b in range(batch) for t in range(starts[b] - 1, int(lengths[b]) - 1)]
    index_b, index_t = (jnp.asarray(i) for i in zip(*rows, strict=True))
    head = jax.jit(exit_logits, static_argnames="cfg")
    return (head(generator.params, cfg, shallow[index_b, index_t]),
            head(generator.params, cfg, final[index_b, index_t]))


def round_costs(generator: Generator, exit_layer: int, context: int, max_tokens: int) -> Costs:
    """`Costs` for 1 <= n <= max_tokens tokens after `context` cached tokens; the overhead is an
    `ar` round minus one full-model pass."""
    sizes = measured_sizes(max_tokens)
    layers = generator.cfg.num_layers
    shallow = pass_seconds(generator, (0, exit_layer), sizes, context)
    deep = pass_seconds(generator, (exit_layer, layers), sizes, context)
    full = pass_seconds(generator, (0, layers), [1], context)[0]
    per_round = ar_round_seconds(generator, context)
    return Costs(interpolate(sizes, shallow, max_tokens), interpolate(sizes, deep, max_tokens),
                 max(per_round - full, 0.0), per_round)


def ar_round_seconds(generator: Generator, context: int) -> float:
    """Seconds of one `ar` round (one token) after `context` tokens: the difference of 33 and 1
    new tokens, per token (prefill and compile excluded)."""
    prompt = [[1] * context]
    for new in (1, 33):  # compile both before timing
        generator.run(prompt, max_new_tokens=new).tokens.block_until_ready()
    return statistics.median(
        timed(lambda: generator.run(prompt, max_new_tokens=33).tokens.block_until_ready())
        - timed(lambda: generator.run(prompt, max_new_tokens=1).tokens.block_until_ready())
        for _ in range(3)) / 32


def pass_seconds(generator: Generator, layers: tuple[int, int], sizes: Sequence[int],
                 context: int, repeats: int = 15) -> list[float]:
    """Median seconds of layers [start, stop) plus the head on n new tokens after `context`
    cached ones, for each n in `sizes` (warm: compile time excluded). The cache is donated and
    written in place, as in the decode loop (a cache that is not would be copied per layer)."""
    cfg, params = generator.cfg, generator.params
    cache = allocate_cache(cfg, 1, context + max(sizes), window=max(sizes)).prefilled(
        jnp.asarray([context]))

    @functools.partial(jax.jit, donate_argnums=2)
    def segment(params, hidden, cache):  # params an argument: a closure bakes them in as constants
        layout = chain_layout(cache.lengths, hidden.shape[1], cache.max_len)
        out, cache = run_layers_cached(params, cfg, hidden, cache, layout.slots, layers=layers,
                                       positions=layout.positions, mask=layout.mask)
        return exit_logits(params, cfg, out), cache

    def seconds(tokens):
        hidden = jnp.zeros((1, tokens, cfg.d_model), cfg.compute_dtype)

        def call():
            nonlocal cache
            logits, cache = segment(params, hidden, cache)
            logits.block_until_ready()

        call()
        return statistics.median(timed(call) for _ in range(repeats))

    return [seconds(n) for n in progress_bar(sizes, desc=f"timing layers {layers[0]}-"
                                                          f"{layers[1] - 1}")]


def measured_sizes(max_tokens: int) -> list[int]:
    sizes = [1, 2, 3, 4, 6, 8, 12, 16, 17, 24, 32, 48, 64]
    return [n for n in sizes if n < max_tokens] + [max_tokens]


def interpolate(sizes: list[int], seconds: list[float], max_tokens: int) -> np.ndarray:
    """Seconds for every token count 0..max_tokens (0 costs nothing)."""
    table = np.interp(np.arange(max_tokens + 1), sizes, seconds)
    table[0] = 0.0
    return table
