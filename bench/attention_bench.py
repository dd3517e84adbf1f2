"""Cost of one cached attention call at a model's shape: the CPU attention kernel against XLA's
ops, for a few new-token counts (1: decoding a token, K+1: verifying K drafts) and filled parts
of the cache.

    python bench/attention_bench.py --workdir runs/tiny [--tokens 1,7,16] [--filled 150,300]

Both run inside one jitted loop of --calls calls (each call's output feeds the next query, so
none is skipped), compiled ahead of time in this one process and timed in turns; the table
gives the median microseconds per call over --repeats.
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import functools
import itertools
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax.cli.decoding import require_positive_flags, run_writing_json, whole_numbers_flag
from specjax.cli.entrypoint import parse_flags
from specjax.cli.flags import define_model_flags, define_output_flags
from specjax.config import ModelConfig
from specjax.kernels import cpu_attention
from specjax.loading import load_model
from specjax.nn.attention import _attend
from specjax.timing import time_interleaved

define_model_flags(required=True)
define_output_flags(repeats=7)
flags.DEFINE_list("tokens", ["1", "7", "16"], "New tokens per call.")
flags.DEFINE_list("filled", ["150", "300"], "Cache slots the tokens see before their own.")
flags.DEFINE_integer("slots", 512, "Cache slots (the cache's length).")
flags.DEFINE_integer("calls", 200, "Calls per timed loop.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    run_writing_json(measure, FLAGS.output_json)


def measure() -> list[dict]:
    require_positive_flags("slots", "calls", "repeats")
    if not cpu_attention.available():
        raise ValueError("the CPU attention kernel is not available here "
                         f"({cpu_attention.SWITCH}=0, no C++ compiler): nothing to compare")
    cases = list(itertools.product(whole_numbers_flag("tokens", 1),
                                   whole_numbers_flag("filled", 1)))
    cfg = load_model(FLAGS.workdir).cfg
    for tokens, filled in cases:
        if filled + tokens > FLAGS.slots:
            raise ValueError(f"--filled={filled} plus --tokens={tokens} exceed --slots="
                             f"{FLAGS.slots}")
    print(f"kv heads {cfg.num_kv_heads}, group {cfg.group_size}, head_dim {cfg.head_dim}, "
          f"{FLAGS.slots} slots, batch 1; microseconds per call, median of {FLAGS.repeats}")
    print("| new tokens | filled slots | XLA | kernel | XLA / kernel |")
    print("|---|---|---|---|---|")
    rows = []
    for tokens, filled in cases:
        operands = _operands(cfg, tokens, filled)
        programs = {
            "xla": _loop(functools.partial(_attend, cfg), operands),
            "kernel": _loop(functools.partial(cpu_attention.cached_attention,
                                              scale=cfg.head_dim ** -0.5), operands)}
        calls = {name: functools.partial(_call, run, operands) for name, run in programs.items()}
        seconds, _ = time_interleaved(calls, 1, FLAGS.repeats)
        micros = {name: 1e6 * statistics.median(seconds[name][0]) / FLAGS.calls
                  for name in programs}
        rows.append({"tokens": tokens, "filled": filled, "xla_us": micros["xla"],
                     "kernel_us": micros["kernel"]})
        print(f"| {tokens} | {filled} | {micros['xla']:.1f} | {micros['kernel']:.1f} | "
              f"{micros['xla'] / micros['kernel']:.2f} |", flush=True)
    return rows


def _operands(cfg: ModelConfig, tokens: int, filled: int) -> tuple[jax.Array, ...]:
    """Queries, keys, values and the causal mask of `tokens` new tokens after `filled` slots."""
    rng = np.random.default_rng(0)
    heads, dim = cfg.num_kv_heads, cfg.head_dim
    q = rng.normal(size=(heads, cfg.group_size * tokens, dim))
    k, v = (rng.normal(size=(heads, FLAGS.slots, dim)) for _ in range(2))
    sees = np.arange(FLAGS.slots)[None, None] <= filled + np.arange(tokens)[None, :, None]
    return (*(jnp.asarray(x, jnp.float32) for x in (q, k, v)), jnp.asarray(sees))


def _call(program, operands: tuple[jax.Array, ...], _item: int) -> jax.Array:
    return jax.block_until_ready(program(*operands))


def _loop(attend, operands):
    """`attend` called --calls times in one program, ahead-of-time compiled."""
    def run(q, k, v, mask):
        return jax.lax.fori_loop(0, FLAGS.calls, lambda _, q: q + 1e-3 * attend(q, k, v, mask), q)
    return jax.jit(run).lower(*operands).compile()


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
