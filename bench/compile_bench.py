"""What a notebook session compiles: --calls `generate` calls on one loaded model, as a user
makes them, with new-token budgets spread from 1 to --max_new_tokens and batch sizes cycling
through --batch_sizes; prints each call's new decode programs and compile seconds, then the
totals.

    python bench/compile_bench.py --workdir runs/smoke [--calls 20] [--max_new_tokens 256] \
        [--batch_sizes 1,3,4] [--prompt_len 32]

Call i asks for round(M^(i / (calls - 1))) new tokens (M = --max_new_tokens: 1, ..., M, spread
evenly on a log scale), greedy, with the model's default strategy; its rows are random token
ids of lengths from 1 to --prompt_len. Compile seconds are what JAX reports for lowering
(the CPU kernels' first measurement of a shape class included, `kernels.decision`) and for
XLA's compile of every program of the call, or for reading it back from the persistent cache
(`jax.monitoring`'s /jax/core/compile/ events; tracing is left out, as nested jits report it
twice): run it twice with one SPECJAX_CACHE_DIR to see a second process's. CPU seconds are the
process's (all threads), which a busy machine does not inflate as it does wall seconds.
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import time
from collections import Counter

import numpy as np
from absl import app, flags
from jax import monitoring

import specjax
from specjax.cli.decoding import require_positive_flags, run_writing_json, whole_numbers_flag
from specjax.cli.entrypoint import parse_flags
from specjax.cli.flags import define_model_flags, define_output_flags, define_prompt_flags
from specjax.decoding import loop

define_model_flags(required=True)
define_prompt_flags(prompt_len=32, max_new_tokens=256)  # the longest; calls run 1 to them
flags.DEFINE_integer("calls", 20, "generate calls in the session.")
flags.DEFINE_list("batch_sizes", ["1", "3", "4"], "Prompts per call, cycled through.")
define_output_flags()
FLAGS = flags.FLAGS

LOWERING = "/jax/core/compile/jaxpr_to_mlir_module_duration"
XLA_COMPILE = "/jax/core/compile/backend_compile_duration"


def main(argv):
    del argv
    run_writing_json(measure, FLAGS.output_json)


def measure() -> dict:
    require_positive_flags("calls", "max_new_tokens", "prompt_len")
    batch_sizes = whole_numbers_flag("batch_sizes", 1)
    seconds: Counter = Counter()
    monitoring.register_event_duration_secs_listener(
        lambda event, duration, **_: seconds.update({event: duration}))
    model = specjax.load(FLAGS.workdir)
    rng = np.random.default_rng(0)
    print("| call | prompts | longest prompt | max_new_tokens | new programs | lowering s | "
          "XLA compile s | CPU s | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for call, budget in enumerate(budgets(FLAGS.calls, FLAGS.max_new_tokens)):
        lengths = rng.integers(1, FLAGS.prompt_len + 1, batch_sizes[call % len(batch_sizes)])
        prompts = [rng.integers(0, model.generator.cfg.vocab_size, n).tolist() for n in lengths]
        before, programs = dict(seconds), loop.generate_tokens._cache_size()
        start, cpu = time.perf_counter(), time.process_time()
        model.generate(prompts, max_new_tokens=budget)
        row = {"call": call + 1, "prompts": len(prompts), "longest_prompt": int(max(lengths)),
               "max_new_tokens": budget,
               "new_programs": loop.generate_tokens._cache_size() - programs,
               "lowering_s": seconds[LOWERING] - before.get(LOWERING, 0.0),
               "xla_compile_s": seconds[XLA_COMPILE] - before.get(XLA_COMPILE, 0.0),
               "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - start}
        rows.append(row)
        print(" | ".join(["", *(f"{v:.1f}" if isinstance(v, float) else str(v)
                                for v in row.values()), ""]).strip(), flush=True)
    total = {"programs": sum(r["new_programs"] for r in rows),
             **{key: sum(r[key] for r in rows) for key in ("lowering_s", "xla_compile_s", "cpu_s",
                                                       "wall_s")}}
    print(f"total: {total['programs']} decode programs, {total['lowering_s']:.1f} s lowering, "
          f"{total['xla_compile_s']:.1f} s in XLA's compile "
          f"(persistent cache: {seconds['/jax/compilation_cache/compile_time_saved_sec']:.1f} s "
          f"saved), {total['cpu_s']:.1f} CPU s and {total['wall_s']:.1f} s in {len(rows)} calls")
    return {"calls": rows, "total": total}


def budgets(calls: int, largest: int) -> list[int]:
    """`calls` budgets from 1 to `largest`, evenly spread on a log scale."""
    return [round(largest ** (i / max(calls - 1, 1))) for i in range(calls)]


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
