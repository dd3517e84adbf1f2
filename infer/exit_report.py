"""The exit report of a workdir's model: per exit, held-out loss, top-1 accuracy and agreement
with the last layer, and the predicted tau and speed-up of drafting K tokens from it (see
`specjax/tools/exit_report.py`; estimates, which bench/bench.py then measures). Works on a model
trained here or freshly imported (the logit lens).

    python infer/exit_report.py --workdir runs/tiny
    python infer/exit_report.py --workdir runs/llama --texts_file heldout.jsonl \\
        --output_json exits.json --plot exits.png
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import json

from absl import app, flags

from specjax.cli.decoding import require_positive_flags, whole_numbers_flag
from specjax.cli.entrypoint import parse_flags, run_cli
from specjax.cli.flags import define_model_flags, define_output_flags
from specjax.cli.texts import define_texts_flags, given_texts
from specjax.loading import load_model
from specjax.outputs import check_destinations, staged
from specjax.tokenizer import workdir_tokenizer
from specjax.tools.exit_report import NUM_DRAFTS, model_exit_report

define_model_flags()
define_output_flags(repeats=7)
define_texts_flags("Held-out text", "the validation documents of the workdir's data, else of "
                   "the embedded corpus")
flags.DEFINE_integer("seq_len", None, "Tokens per window (default: the workdir's data seq_len).")
flags.DEFINE_integer("max_tokens", 32768, "At most this many held-out tokens are predicted.")
flags.DEFINE_list("num_draft", [str(k) for k in NUM_DRAFTS], "Draft counts K to predict.")
flags.DEFINE_integer("batch_size", 4, "Windows evaluated together.")
flags.DEFINE_integer("context", 256, "Cached tokens behind the timed layers.")
flags.DEFINE_string("plot", None, "Also write agreement and predicted speed-up by exit here "
                    "(PNG, or the format its extension names: .svg, .pdf...).")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    run_cli(run)


def run() -> None:
    require_positive_flags("max_tokens", "batch_size", "context", "repeats")
    if FLAGS.seq_len is not None and FLAGS.seq_len < 1:
        raise ValueError(f"--seq_len={FLAGS.seq_len} must be >= 1")
    num_draft = whole_numbers_flag("num_draft", 1)
    check_destinations({"--output_json": FLAGS.output_json, "--plot": FLAGS.plot},
                       {"--workdir": FLAGS.workdir, "--texts_file": FLAGS.texts_file})
    if FLAGS.plot:
        from specjax import plots  # matplotlib only when a plot is asked for

        plot_format = plots.image_format(FLAGS.plot)
    with staged(FLAGS.output_json) as json_path, staged(FLAGS.plot) as plot_path:
        texts = given_texts()
        loaded = load_model(FLAGS.workdir)
        tokenizer = workdir_tokenizer(loaded.meta, FLAGS.workdir)
        report = model_exit_report(
            loaded.params, loaded.cfg, tokenizer, loaded.meta, texts, seq_len=FLAGS.seq_len,
            max_tokens=FLAGS.max_tokens, num_draft=num_draft, batch_size=FLAGS.batch_size,
            context=FLAGS.context, repeats=FLAGS.repeats)
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
