"""Learn-then-Test calibration of a decoding threshold: the most aggressive value of a grid
(ordered from the safest) whose risk is at most --delta with probability at least
1 - --epsilon over the calibration prompts, written to the workdir's decoding defaults
(`calibrated_decoding.json`, read by every entry point that loads the workdir).

    python infer/learn_then_test.py --workdir runs/tiny --delta 0.1 --epsilon 0.05 \\
        --consistency textual
    python infer/learn_then_test.py --workdir runs/calm --calm_measure classifier --consistency risk
    python infer/learn_then_test.py --workdir runs/tiny --strategy selfspec --delta 0.3

--strategy calm calibrates CALM's lambda (`calm_threshold`), the risk a consistency (see
`specjax.tools.calm_quality`): textual, 1 - ROUGE-L F1 against the full model's greedy
output; risk, the excess per-token log-loss of the reference continuation, clipped to [0, 1].
--strategy selfspec calibrates the chain's confidence stop eta (`draft_threshold`), the risk
the fraction of a prompt's drafts that verification rejects (wasted draft work), greedy or
sampled (--temperature, --top_p).

Calibration prompts are windows of held-out documents after the first --skip_documents (which
bench/bench.py and bench/calm_quality.py decode), or the first --num_prompts of a --prompt_set
(HumanEval, chat questions), whose reference continuation is the model's own greedy one.
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import dataclasses
from collections.abc import Callable

import numpy as np
from absl import app, flags

from specjax.cli import decoding as cli
from specjax.cli.decoding import (
    decoding_defaults,
    define_decoding_flags,
    options_from_flags,
    require_positive_flags,
    run_writing_json,
)
from specjax.cli.entrypoint import parse_flags, refuse_flags
from specjax.cli.flags import (
    define_model_flags,
    define_output_flags,
    define_prompt_flags,
    define_sampling_flags,
)
from specjax.decoding.drafter import Drafter
from specjax.decoding.engine import AUTOREGRESSIVE, Generator
from specjax.decoding.registry import make_strategy
from specjax.decoding.sampling import SamplingParams, sampling_or_greedy
from specjax.io.calibrated_defaults import write_calibrated
from specjax.loading import load_model
from specjax.outputs import check_writable
from specjax.prompt_sets import PROMPT_SETS, encode_prompts, load_prompt_set
from specjax.timing import progress_bar
from specjax.tokenizer import workdir_tokenizer
from specjax.tools.bench import run_benchmark
from specjax.tools.calm_quality import CONSISTENCIES, heldout_continuations, measure_quality
from specjax.tools.learn_then_test import check_risk_levels, learn_then_test

define_model_flags(drafters=True)
define_sampling_flags()
define_prompt_flags(num_prompts=80, prompt_len=64, max_new_tokens=64)
define_output_flags()
CALIBRATED = ("calm", "selfspec")  # the strategies with a threshold to calibrate
flags.DEFINE_enum("strategy", "calm", list(CALIBRATED), "Whose threshold to calibrate.")
flags.DEFINE_float("delta", 0.1, "Risk bound: the chosen value's expected loss is <= delta...")
flags.DEFINE_float("epsilon", 0.05, "... with probability >= 1 - epsilon.")
flags.DEFINE_enum("consistency", "textual", CONSISTENCIES, "calm: the loss bounded (see above).")
flags.DEFINE_list("grid", None, "Values tested, from the safest down (default: calm 1 to 0, "
                  "selfspec 0.95 to 0, in steps of 0.05).")
flags.DEFINE_enum("prompt_set", None, sorted(PROMPT_SETS), "Calibrate on a prompt set of real "
                  "text instead of held-out windows (its first --num_prompts).")
flags.DEFINE_integer("per_document", 4, "Calibration windows per held-out document.")
flags.DEFINE_integer("skip_documents", 16, "Held-out documents left to the benchmarks.")
flags.DEFINE_integer("speed_prompts", 4, "Prompts timed at the chosen value (batch 1).")
flags.DEFINE_bool("write", True, "Write the chosen value to the workdir's decoding defaults.")
define_decoding_flags(strategies=CALIBRATED)
flags.adopt_module_key_flags(cli)  # --help lists the decoding flags too
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A grid's per-prompt losses [len(grid), n], one printable row per grid point under
    `header` and a phrase saying what it does, and the strategy at a value with the decoding
    field that value sets."""

    losses: np.ndarray
    header: str
    rows: list[str]
    summaries: list[str]
    at: Callable[[float], Drafter]
    field: str


def main(argv):
    del argv
    run_writing_json(run, FLAGS.output_json, reads={"--workdir": FLAGS.workdir,
                                                    "--draft_workdir": FLAGS.draft_workdir})


def run() -> dict:
    require_positive_flags("num_prompts", "per_document", "prompt_len", "max_new_tokens",
                           "speed_prompts")
    check_risk_levels(FLAGS.delta, FLAGS.epsilon, prefix="--")
    grid = _grid([f"{1 - i / 20:.2f}" for i in range(FLAGS.strategy != "calm", 21)]
                 if FLAGS.grid is None else FLAGS.grid, below_one=FLAGS.strategy != "calm")
    sampling = sampling_or_greedy(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p, prefix="--")
    if sampling is not None and FLAGS.strategy == "calm":
        raise ValueError("--temperature: CALM is calibrated on greedy outputs; leave it at 0")
    if FLAGS.strategy != "calm":
        refuse_flags(("consistency", "draft_workdir"), "--strategy calm")
    if FLAGS.write:
        check_writable(FLAGS.workdir, f"the calibrated defaults into --workdir {FLAGS.workdir} "
                       "(--nowrite only reports them)")
    loaded = load_model(FLAGS.workdir, draft_workdir=FLAGS.draft_workdir)
    tokenizer = workdir_tokenizer(loaded.meta, FLAGS.workdir)
    calibrated = "calm_threshold" if FLAGS.strategy == "calm" else "draft_threshold"
    if getattr(FLAGS, calibrated) is not None:
        raise ValueError(f"--{calibrated}: this is what calibration chooses (over --grid); "
                         "drop it")
    if FLAGS.strategy == "selfspec" and FLAGS.tree is not None:
        raise ValueError("--tree: selfspec's eta is a chain's confidence stop, which a tree "
                         "does not have; drop --tree")
    options = options_from_flags(decoding_defaults(loaded.meta), loaded.cfg, [FLAGS.strategy])
    if FLAGS.strategy == "selfspec":  # eta stops a chain: a stored default tree is not used
        options = dataclasses.replace(options, tree="")
    generator = loaded.generator()
    strategy = make_strategy(FLAGS.strategy, options)
    generator.with_weights(strategy, None)  # a classifier it lacks: refused before the prompts
    prompts, references = _prompts(loaded.meta, tokenizer, generator)
    print(f"calibrating {strategy.label()} on {len(prompts)} prompts (delta {FLAGS.delta:g}, "
          f"epsilon {FLAGS.epsilon:g}) ...", flush=True)
    sweep = (_calm(generator, strategy, grid, prompts, references)
             if FLAGS.strategy == "calm" else
             _selfspec(generator, options, grid, prompts, sampling))
    chosen = learn_then_test(grid, sweep.losses, FLAGS.delta, FLAGS.epsilon)
    print(f"{'value':>6} {'risk':>7} {'p-value':>8} {sweep.header}")
    for j, row in enumerate(sweep.rows):
        mark = "  <- chosen" if j == chosen.index else ""
        print(f"{grid[j]:6.2f} {chosen.risks[j]:7.4f} {chosen.p_values[j]:8.2g} {row}{mark}")
    result = {"strategy": FLAGS.strategy, "field": sweep.field, "delta": FLAGS.delta,
              "epsilon": FLAGS.epsilon, "num_prompts": len(prompts), "grid": grid,
              "risks": list(chosen.risks), "p_values": list(chosen.p_values),
              "threshold": chosen.value}
    if FLAGS.strategy == "calm":
        result["consistency"] = FLAGS.consistency
    if chosen.index is None:
        print(f"no value is certified at delta {FLAGS.delta:g} (not even the safest, "
              f"{grid[0]:g}): raise delta or calibrate on more prompts; decoding defaults "
              "unchanged")
        return result
    timed = run_benchmark(generator, {"ar": AUTOREGRESSIVE, "chosen": sweep.at(chosen.value)},
                          prompts[:FLAGS.speed_prompts], max_new_tokens=FLAGS.max_new_tokens,
                          sampling=sampling)
    result["speedup"] = timed[1].speedup
    print(f"chosen {sweep.field}={chosen.value:g}: {sweep.summaries[chosen.index]}, speed-up "
          f"over ar {result['speedup']:.2f}x (batch 1, {FLAGS.speed_prompts} prompts)")
    if FLAGS.write:
        fields = {sweep.field: chosen.value}
        if FLAGS.strategy == "calm":
            fields.update(calm_measure=options.calm_measure, calm_exits=options.calm_exits,
                          calm_decay=options.calm_decay)
        path = write_calibrated(FLAGS.workdir, int(loaded.meta["step"]), fields,
                                {sweep.field: {key: result[key] for key in result
                                               if key not in ("grid", "risks", "p_values")}})
        print(f"wrote {sweep.field}={chosen.value:g} to {path}")
    return result


def _calm(generator: Generator, strategy: Drafter, grid: list[float],
          prompts: list[list[int]], references: list[list[int]]) -> Sweep:
    qualities = measure_quality(generator, strategy, grid, prompts, references)
    return Sweep(np.stack([q.losses[FLAGS.consistency] for q in qualities]),
                 f"{'exit':>5} {'agree':>6} {'loss':>6}",
                 [f"{q.mean_exit:5.2f} {q.agreement:6.3f} {q.log_loss:6.3f}" for q in qualities],
                 [f"average exit layer {q.mean_exit:.2f} of {generator.cfg.num_layers}"
                  for q in qualities],
                 lambda value: dataclasses.replace(strategy, threshold=value), "calm_threshold")


def _selfspec(generator: Generator, options, grid: list[float], prompts: list[list[int]],
              sampling: SamplingParams | None) -> Sweep:
    """Per prompt, the fraction of its drafts rejected, with the chain stopping at eta."""
    def at(value: float) -> Drafter:
        return make_strategy("selfspec", dataclasses.replace(options, draft_threshold=value))

    losses, rows, summaries = [], [], []
    for value in progress_bar(grid, desc="thresholds"):
        out = generator.generate(prompts, max_new_tokens=FLAGS.max_new_tokens, strategy=at(value),
                                 sampling=sampling)
        losses.append([(s.drafted - s.accepted) / s.drafted if s.drafted else 0.0
                       for s in out.stats])
        rows.append(f"{out.total.tau:5.2f} {out.total.drafted / out.total.rounds:6.2f}")
        summaries.append(f"tau {out.total.tau:.2f}")
    return Sweep(np.asarray(losses), f"{'tau':>5} {'drafts':>6}", rows, summaries, at,
                 "draft_threshold")


def _prompts(meta: dict, tokenizer, generator: Generator) -> tuple[list, list]:
    """(calibration prompts, their reference continuations): held-out windows and the text
    after them, or a prompt set's prompts and the model's greedy continuations."""
    if FLAGS.prompt_set is None:
        return heldout_continuations(
            meta, tokenizer, FLAGS.num_prompts, FLAGS.prompt_len, FLAGS.max_new_tokens,
            skip_documents=FLAGS.skip_documents, per_document=FLAGS.per_document)
    for name in ("prompt_len", "per_document", "skip_documents"):
        if FLAGS[name].present:
            raise ValueError(f"--{name} shapes held-out windows; a --prompt_set brings its own "
                             "prompts: drop one")
    prompts = [ids.tolist() for ids in encode_prompts(
        tokenizer, load_prompt_set(FLAGS.prompt_set, tokenizer, FLAGS.num_prompts))]
    references = generator.generate(prompts, max_new_tokens=FLAGS.max_new_tokens).tokens
    return prompts, references


def _grid(values: list[str], below_one: bool) -> list[float]:
    """The thresholds tested: numbers in [0, 1] (below 1 for selfspec's eta, which 1 would
    stop at every draft), descending from the safest; a one-line error naming --grid."""
    try:
        grid = [float(v) for v in values]
    except ValueError:
        raise ValueError(f"--grid={','.join(values)}: expected numbers") from None
    top = "1)" if below_one else "1]"
    if (not grid or grid != sorted(grid, reverse=True) or not 0 <= grid[-1] <= grid[0] <= 1
            or (below_one and grid[0] >= 1)):
        raise ValueError(f"--grid={','.join(values)!r}: expected thresholds in [0, {top}, "
                         "descending from the safest")
    return grid


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
