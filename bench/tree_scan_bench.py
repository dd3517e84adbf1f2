"""Verifying a token tree through Mamba-2 layers: the tree scan against unrolled paths.

    python bench/tree_scan_bench.py --config tiny_code:mamba2 [--tree 3,2,1]

One verification pass of the pending token and a static tree's nodes over every layer of a model
with a committed prompt, two ways, each jitted and timed in turn after a warm-up:
  tree      the tree at once (`verify.verify`: the tree scan and the conv along each path; the
            attention layers of a hybrid read the same ancestor mask);
  unrolled  STree's naive baseline: every root-to-leaf path as a chain of its own, a batch of
            paths over a cache copied once per path.
Both produce every node's logits (checked equal); the ratio is the median over repeats of the
unrolled time over the tree's. Random weights of the config's sizes (speed does not depend on
training). Also printed: the bytes a decode step moves (`bench.decode_step_bytes`: the weights, the
K/V of attention layers, each Mamba-2 layer's state and conv history read and written).
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import statistics

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax.cli.decoding import require_positive_flags, run_writing_json
from specjax.cli.entrypoint import define_config, parse_flags
from specjax.cli.flags import define_output_flags, define_prompt_flags
from specjax.config import ModelConfig
from specjax.decoding.proposal import Proposal
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.decoding.verify import verify
from specjax.model import (
    allocate_cache,
    embed,
    exit_logits,
    init_params,
    prefill_cached,
    run_layers_cached,
    unstack_layers,
)
from specjax.timing import time_interleaved
from specjax.tools.bench import decode_step_bytes
from specjax.training.config import config_reference

__doc__ += "\n" + config_reference()  # `--help` lists the config fields too

_CONFIG = define_config("tiny_code:mamba2", "The config[:variant] whose model is measured.")
flags.DEFINE_string("tree", "3,2,1", "Children per depth (the default: 15 nodes + the "
                    "pending token = 16 tokens).")
define_prompt_flags(prompt_len=128)
define_output_flags(repeats=30)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    run_writing_json(measure, FLAGS.output_json)


def measure() -> dict:
    require_positive_flags("prompt_len", "repeats")
    cfg = ModelConfig.from_dict(_CONFIG.value.model)
    tree = StaticTree.parse(FLAGS.tree)
    params = unstack_layers(init_params(cfg, jax.random.PRNGKey(0)), cfg)
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(0, cfg.vocab_size, (1, FLAGS.prompt_len)))
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (1, tree.num_nodes + 1)))
    parents = jnp.asarray(tree.parents)[None]
    paths = _root_to_leaf_paths(np.asarray(tree.parents))
    max_len = FLAGS.prompt_len + tree.num_nodes + 1

    @jax.jit
    def prefill(params):
        cache = allocate_cache(cfg, 1, max_len, window=tree.num_nodes + 1)
        _, cache = prefill_cached(params, cfg, embed(params, cfg, prompt), cache,
                                  jnp.asarray([FLAGS.prompt_len]))
        return cache.prefilled(jnp.asarray([FLAGS.prompt_len]))

    @jax.jit
    def tree_pass(params, cache):
        proposal = Proposal(tokens=tokens[:, 1:], parents=parents,
                            valid=jnp.ones_like(parents, bool), q=None, reuse=None, stats={},
                            shape=tree)
        return verify(params, cfg, cache, tokens[:, 0], proposal).logits[0]

    @jax.jit
    def unrolled_pass(params, cache):
        rows = len(paths)
        index = jnp.asarray(paths)                                    # [rows, depth + 1]
        cache = jax.tree.map(lambda x: jnp.tile(x, (rows,) + (1,) * (x.ndim - 1)), cache)
        hidden, _ = run_layers_cached(params, cfg, embed(params, cfg, tokens[0][index]), cache,
                                      cache.lengths)
        return exit_logits(params, cfg, hidden)                       # [rows, depth + 1, V]

    cache = prefill(params)
    tree_logits = tree_pass(params, cache)
    unrolled = unrolled_pass(params, cache)
    for row, path in enumerate(paths):
        np.testing.assert_allclose(unrolled[row], tree_logits[np.asarray(path)], rtol=1e-3,
                                   atol=1e-3)
    calls = {name: (lambda _, fn=fn: jax.block_until_ready(fn(params, cache)))
             for name, fn in (("tree", tree_pass), ("unrolled", unrolled_pass))}
    seconds, _ = time_interleaved(calls, items=1, repeats=FLAGS.repeats)
    median = {name: statistics.median(times[0]) for name, times in seconds.items()}
    name = FLAGS["config"].config_filename if hasattr(FLAGS["config"], "config_filename") \
        else "config"
    report = {"config": name, "tree": FLAGS.tree, "tokens": tree.num_nodes + 1,
              "paths": len(paths), "tree_ms": 1e3 * median["tree"],
              "unrolled_ms": 1e3 * median["unrolled"],
              "tree_speedup": median["unrolled"] / median["tree"],
              "decode_step_bytes": decode_step_bytes(params, cfg, FLAGS.prompt_len)}
    print(f"{name}, tree {FLAGS.tree} ({report['tokens']} tokens, {len(paths)} paths): "
          f"tree scan {report['tree_ms']:.2f} ms, unrolled paths {report['unrolled_ms']:.2f} ms,"
          f" {report['tree_speedup']:.2f}x; a decode step reads "
          f"{report['decode_step_bytes'] / 1e6:.2f} MB")
    return report


def _root_to_leaf_paths(parents: np.ndarray) -> list[list[int]]:
    """Positions (0: the pending token) along every root-to-leaf path, padded at the end by
    repeating the leaf (a repeated token changes nothing before it)."""
    size = len(parents) + 1
    parent_of = np.concatenate([[-1], parents + 1])
    leaves = [p for p in range(size) if p not in set(parent_of[1:])]
    paths = []
    for leaf in leaves:
        path, node = [], leaf
        while node >= 0:
            path.append(int(node))
            node = parent_of[node]
        paths.append(path[::-1])
    depth = max(map(len, paths))
    return [path + [path[-1]] * (depth - len(path)) for path in paths]


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
