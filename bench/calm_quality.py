"""CALM's quality against speed over its threshold lambda (strategy calm, no verification): for
each lambda the average exit layer, tokens/s and speed-up over ar (batch 1, one process, after
a warm-up), agreement with the full model's greedy output (ROUGE-L F1) and the per-token
log-loss of the held-out continuation (teacher-forced through the same exits). Optionally the
curve as a PNG, with the workdir's calibrated lambda marked.

    python bench/calm_quality.py --workdir runs/tiny --plot calm_curve.png
    python bench/calm_quality.py --workdir runs/tiny --calm_exits 1,2,3,4,5,6,7
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import dataclasses
import sys

from absl import app, flags

from specjax.cli import decoding as cli
from specjax.cli.decoding import (
    decoding_defaults,
    define_decoding_flags,
    options_from_flags,
    require_positive_flags,
    run_writing_json,
)
from specjax.cli.entrypoint import parse_flags
from specjax.cli.flags import define_model_flags, define_output_flags, define_prompt_flags
from specjax.decoding.engine import AUTOREGRESSIVE
from specjax.decoding.registry import make_strategy
from specjax.io.calibrated_defaults import read_calibrated
from specjax.loading import load_model
from specjax.outputs import staged
from specjax.plots import calm_curve, image_format
from specjax.tokenizer import workdir_tokenizer
from specjax.tools.bench import run_benchmark
from specjax.tools.calm_quality import heldout_continuations, measure_quality

define_model_flags(drafters=True)
define_prompt_flags(num_prompts=8, prompt_len=128, max_new_tokens=128)
define_output_flags(repeats=3)
flags.DEFINE_list("thresholds", ["1", "0.95", "0.9", "0.8", "0.6", "0.4", "0.2", "0"],
                  "The lambdas swept.")
flags.DEFINE_string("plot", None, "Write the quality-versus-speed curve here (PNG, or the "
                    "format its extension names: .svg, .pdf...).")
define_decoding_flags(strategies=("calm",))
flags.adopt_module_key_flags(cli)  # --help lists the decoding flags too
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    run_writing_json(lambda: run_with_plot(FLAGS.plot), FLAGS.output_json,
                     reads={"--workdir": FLAGS.workdir, "--draft_workdir": FLAGS.draft_workdir},
                     writes={"--plot": FLAGS.plot})


def run_with_plot(path: str | None) -> list[dict]:
    """`run`, its curve written to `path` whole or not at all (a bad path or image format fails
    first)."""
    plot_format = image_format(path) if path else "png"
    with staged(path) as partial:
        return run(partial, plot_format)


def run(plot: str | None, plot_format: str = "png") -> list[dict]:
    require_positive_flags("num_prompts", "prompt_len", "max_new_tokens", "repeats")
    try:
        thresholds = [float(t) for t in FLAGS.thresholds]
    except ValueError:
        raise ValueError(f"--thresholds={','.join(FLAGS.thresholds)}: expected numbers") from None
    if not all(0 <= t <= 1 for t in thresholds):
        raise ValueError(f"--thresholds={','.join(FLAGS.thresholds)}: each must lie in [0, 1]")
    loaded = load_model(FLAGS.workdir, draft_workdir=FLAGS.draft_workdir)
    tokenizer = workdir_tokenizer(loaded.meta, FLAGS.workdir)
    if FLAGS.calm_threshold is not None:
        raise ValueError("--calm_threshold: the bench sweeps --thresholds instead; drop it")
    options = options_from_flags(decoding_defaults(loaded.meta), loaded.cfg, ["calm"])
    calm = make_strategy("calm", options)
    generator = loaded.generator()
    generator.with_weights(calm, None)  # a classifier it lacks: refused before the prompts
    prompts, references = heldout_continuations(loaded.meta, tokenizer, FLAGS.num_prompts,
                                                FLAGS.prompt_len, FLAGS.max_new_tokens)
    print("measuring quality ...", file=sys.stderr, flush=True)
    qualities = measure_quality(generator, calm, thresholds, prompts, references)
    strategies = {"ar": AUTOREGRESSIVE,
                  **{f"{t:g}": dataclasses.replace(calm, threshold=t) for t in thresholds}}
    timed = {r.name: r for r in run_benchmark(
        generator, strategies, prompts, max_new_tokens=FLAGS.max_new_tokens, repeats=FLAGS.repeats,
        progress=lambda line: print(f"[bench] {line}", file=sys.stderr, flush=True))}
    rows = [{"threshold": q.threshold, "mean_exit": q.mean_exit,
             "tokens_per_second": timed[f"{q.threshold:g}"].tokens_per_second,
             "speedup": timed[f"{q.threshold:g}"].speedup,
             "agreement": q.agreement, "log_loss": q.log_loss} for q in qualities]
    print(f"{calm.early_exit.label()}, {len(prompts)} held-out prompts x {FLAGS.max_new_tokens} "
          f"tokens, batch 1; ar {timed['ar'].tokens_per_second:.0f} tok/s")
    print(f"{'lambda':>6} {'exit':>5} {'tok/s':>7} {'speed-up':>8} {'ROUGE-L':>7} {'loss':>6}")
    for row in rows:
        print(f"{row['threshold']:6.2f} {row['mean_exit']:5.2f} {row['tokens_per_second']:7.0f} "
              f"{row['speedup']:7.2f}x {row['agreement']:7.3f} {row['log_loss']:6.3f}")
    if plot:
        calm_curve(rows, loaded.cfg.num_layers, calm.early_exit.label(),
                   read_calibrated(FLAGS.workdir).get("decoding", {}).get("calm_threshold")
                   ).savefig(plot, dpi=120, format=plot_format)
        print(f"wrote {FLAGS.plot}")
    return rows


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
