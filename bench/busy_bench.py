"""Decoding speed on the default path (each CPU kernel where `kernels.decision` picks it) against
XLA's own ops, on an idle and on a busy machine.

    python bench/busy_bench.py --workdir runs/tiny [--busy 0,1,2] [--pairs 20] \
        [--kernel matmul|attention|all]

For each count in --busy, that many processes spin on the cores (`python -c 'while True:
pass'`, as a data loader or a second job would) while both programs decode the same held-out
prompts, each prompt by one and then by the other. Both programs are compiled ahead
of time in this one process; the ratio is the median over pairs of XLA's time over the
default path's (above 1: the default path is faster). --kernel picks what the XLA program goes
without: the matrix kernel (the default), the attention kernel, or both. The target: at least
0.95 in every row (the default path never loses to XLA's ops).
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import jax
from absl import app, flags

from specjax.cli.decoding import (
    decoding_defaults,
    decoding_options,
    require_positive_flags,
    run_writing_json,
    whole_numbers_flag,
)
from specjax.cli.entrypoint import parse_flags
from specjax.cli.flags import define_model_flags, define_output_flags, define_prompt_flags
from specjax.data import heldout_data, heldout_prompts
from specjax.decoding.engine import Generator
from specjax.decoding.registry import STRATEGIES, make_strategy
from specjax.kernels import KERNELS, decision, library
from specjax.loading import load_model
from specjax.timing import time_interleaved
from specjax.tokenizer import workdir_tokenizer

define_model_flags(required=True)
define_prompt_flags(num_prompts=4, prompt_len=128, max_new_tokens=128)
define_output_flags()
flags.DEFINE_list("busy", ["0", "1", "2"], "Busy background processes, one measurement each.")
flags.DEFINE_integer("pairs", 20, "Timed (default, XLA) pairs per measurement.")
flags.DEFINE_enum("kernel", "matmul", [*KERNELS, "all"],
                  "The kernel (or all) that the XLA program goes without.")
flags.DEFINE_enum("strategy", "ar", sorted(STRATEGIES), "Decoding strategy (greedy), with "
                  "the checkpoint's decoding defaults.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    run_writing_json(measure, FLAGS.output_json)


def measure() -> list[dict]:
    busy_counts = whole_numbers_flag("busy", 0)
    require_positive_flags("pairs", "num_prompts", "prompt_len", "max_new_tokens")
    compared = [name for name in KERNELS if FLAGS.kernel in (name, "all")]
    for name in compared:
        if not KERNELS[name].available():
            raise ValueError(f"the CPU {name} kernel is not available here "
                             f"({KERNELS[name].SWITCH}=0, no C++ compiler, or not a CPU "
                             "backend): nothing to compare")
    loaded = load_model(FLAGS.workdir)
    cfg, meta = loaded.cfg, loaded.meta
    tokenizer = workdir_tokenizer(meta, FLAGS.workdir)
    prompts = heldout_prompts(heldout_data(meta), tokenizer, FLAGS.num_prompts, FLAGS.prompt_len)
    strategy = make_strategy(FLAGS.strategy,
                             decoding_options(decoding_defaults(meta), cfg, {}))
    generator = loaded.generator()
    programs = {}
    without = [KERNELS[name].SOURCE for name in compared]
    for name, routing in (("default", contextlib.nullcontext),
                          ("xla", lambda: library.xla_only(*without))):
        with routing():
            jax.clear_caches()
            programs[name] = generator.compile(prompts[:1], max_new_tokens=FLAGS.max_new_tokens,
                                               strategy=strategy)
    jax.clear_caches()
    outputs = {name: [_tokens(decode([p])) for p in prompts] for name, decode in programs.items()}
    if outputs["default"] != outputs["xla"]:
        print("note: default and XLA outputs differ (float rounding changed an argmax)")
    print(f"{FLAGS.strategy}, {len(prompts)} prompts x {FLAGS.max_new_tokens} new tokens, "
          f"{FLAGS.pairs} pairs per row")
    print(f"default: the {', '.join(compared)} kernel where chosen ("
          + "; ".join(f"{k} {v}" for k, v in decision.summary().items()) + "); XLA: without it")
    print("| busy processes | default tokens/s | XLA tokens/s | default / XLA |")
    print("|---|---|---|---|")
    rows = []
    for busy in busy_counts:
        with _busy_processes(busy):
            row = _time_pairs(programs, prompts)
        rows.append({"busy": busy, **row})
        print(f"| {busy} | {row['default_tokens_per_s']:.0f} | {row['xla_tokens_per_s']:.0f} | "
              f"{row['ratio']:.2f} |", flush=True)
    return rows


def _time_pairs(programs: dict, prompts: list[list[int]]) -> dict:
    """Both programs on every prompt in turn, --pairs times; per pair, XLA's time over the
    default path's."""
    calls = {name: lambda item, decode=decode: jax.block_until_ready(decode([prompts[item]]))
             for name, decode in programs.items()}
    seconds, _ = time_interleaved(calls, len(prompts), FLAGS.pairs)
    totals = {name: [sum(per_item[r] for per_item in seconds[name]) for r in range(FLAGS.pairs)]
              for name in programs}
    tokens = len(prompts) * FLAGS.max_new_tokens
    return {"default_tokens_per_s": tokens / statistics.median(totals["default"]),
            "xla_tokens_per_s": tokens / statistics.median(totals["xla"]),
            "ratio": statistics.median(x / k for x, k in zip(totals["xla"], totals["default"],
                                                             strict=True))}


@contextlib.contextmanager
def _busy_processes(count: int) -> Iterator[None]:
    """`count` spinning processes for the duration of the block, killed however it ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.3 if procs else 0)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _tokens(output) -> list[int]:
    return Generator.unpack(output).tokens


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
