"""The exit report of a workdir's model: per exit, held-out loss, top-1 accuracy and agreement
with the last layer, and the predicted tau and speed-up of drafting K tokens from it (see
`specjax/tools/exit_report.py`). Works on a model trained here or freshly imported (the logit
lens). By default the predictions are the benchmark's on its prompts (--prompt_set,
--prompts_file, else held-out windows): played over the model's continuations of them (greedy,
or sampled with --temperature), with the real decode loop timed once (`ar` and selfspec at one
exit); --noworkload gives the quicker greedy estimates from the held-out text and the pieces
alone.

    python infer/exit_report.py --workdir runs/tiny
    python infer/exit_report.py --workdir runs/tiny --temperature 0.8 --top_p 0.95
    python infer/exit_report.py --workdir runs/smollm2 --prompt_set humaneval
    python infer/exit_report.py --workdir runs/llama --texts_file heldout.jsonl --noworkload \\
        --output_json exits.json --plot exits.png
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import json

from absl import app, flags

from specjax.api import LanguageModel
from specjax.cli.decoding import read_prompts_file, require_positive_flags, whole_numbers_flag
from specjax.cli.entrypoint import parse_flags, run_cli
from specjax.cli.flags import (
    define_model_flags,
    define_output_flags,
    define_prompt_flags,
    define_sampling_flags,
)
from specjax.cli.texts import define_texts_flags, given_texts
from specjax.decoding.sampling import sampling_or_greedy
from specjax.loading import load_model
from specjax.outputs import check_destinations, staged
from specjax.prompt_sets import PROMPT_SETS
from specjax.tools.exit_report import NUM_DRAFTS

define_model_flags()
define_output_flags(repeats=7)
define_texts_flags("Held-out text", "the validation documents of the workdir's data, else of "
                   "the embedded corpus")
flags.DEFINE_integer("seq_len", None, "Tokens per window (default: the workdir's data seq_len).")
flags.DEFINE_integer("max_tokens", 32768, "At most this many held-out tokens are predicted.")
flags.DEFINE_list("num_draft", [str(k) for k in NUM_DRAFTS], "Draft counts K to predict.")
flags.DEFINE_integer("batch_size", 4, "Windows evaluated together.")
flags.DEFINE_integer("context", 256, "Cached tokens behind the timed layers.")
flags.DEFINE_bool("workload", True, "Predict the benchmark's speed-ups on prompts (the model's "
                  "continuations of them, the real loop timed once); --noworkload: greedy "
                  "estimates from the held-out text and the pieces alone.")
define_prompt_flags(prompts_file=True, num_prompts=8, prompt_len=128, max_new_tokens=256)
define_sampling_flags()
flags.DEFINE_enum("prompt_set", None, sorted(PROMPT_SETS), "The workload: a prompt set's first "
                  "--num_prompts prompts (default: held-out windows of --prompt_len tokens).")
flags.DEFINE_string("plot", None, "Also write agreement and predicted speed-up by exit here "
                    "(PNG, or the format its extension names: .svg, .pdf...).")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    run_cli(run)


def run() -> None:
    require_positive_flags("max_tokens", "batch_size", "context", "repeats", "num_prompts",
                           "prompt_len", "max_new_tokens")
    if FLAGS.prompts_file and FLAGS.prompt_set:
        raise ValueError("give --prompts_file or --prompt_set, not both")
    if not FLAGS.workload and (FLAGS.prompts_file or FLAGS.prompt_set):
        raise ValueError("--prompts_file and --prompt_set are the workload's: drop "
                         "--noworkload")
    sampled = sampling_or_greedy(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p, prefix="--")
    if sampled is not None and not FLAGS.workload:
        raise ValueError("--temperature: a sampled report plays the model's sampled "
                         "continuations of the workload: drop --noworkload")
    if FLAGS.seq_len is not None and FLAGS.seq_len < 1:
        raise ValueError(f"--seq_len={FLAGS.seq_len} must be >= 1")
    num_draft = whole_numbers_flag("num_draft", 1)
    check_destinations({"--output_json": FLAGS.output_json, "--plot": FLAGS.plot},
                       {"--workdir": FLAGS.workdir, "--texts_file": FLAGS.texts_file,
                        "--prompts_file": FLAGS.prompts_file})
    if FLAGS.plot:
        from specjax import plots  # matplotlib only when a plot is asked for

        plot_format = plots.image_format(FLAGS.plot)
    with staged(FLAGS.output_json) as json_path, staged(FLAGS.plot) as plot_path:
        texts = given_texts()
        prompts = read_prompts_file(FLAGS.prompts_file) if FLAGS.prompts_file else None
        model = LanguageModel(load_model(FLAGS.workdir))
        report = model.exit_report(
            texts, workload=FLAGS.workload, prompts=prompts, prompt_set=FLAGS.prompt_set,
            num_prompts=FLAGS.num_prompts, prompt_len=FLAGS.prompt_len,
            max_new_tokens=FLAGS.max_new_tokens, temperature=FLAGS.temperature,
            top_k=FLAGS.top_k, top_p=FLAGS.top_p, seq_len=FLAGS.seq_len,
            max_tokens=FLAGS.max_tokens, num_draft=num_draft, batch_size=FLAGS.batch_size,
            context=FLAGS.context, repeats=FLAGS.repeats,
            progress=lambda line: print(line, flush=True))
        print(report.table())
        if json_path:
            with open(json_path, "w", encoding="utf-8") as f:
                json.dump(report.to_records(), f, indent=1)
        if plot_path:
            plots.exit_report(report).savefig(plot_path, format=plot_format, dpi=120)
    for path in (FLAGS.output_json, FLAGS.plot):
        if path:
            print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
