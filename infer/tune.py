"""Finds the fastest drafter for a workdir's model on given prompts and stores it as the
workdir's decoding default (`calibrated_decoding.json`, greedy and sampled separately):
`infer/generate.py` and `model.generate` without a strategy then decode with it.

Every strategy the workdir can run is a candidate (model-free ones, selfspec at the exits the
exit report ranks first, the trained drafters of --draft_workdir, trees), pruned by prediction
(the exit report's, or a short measurement on two prompts) and the best few confirmed with the
benchmark's interleaved timing (`specjax/tools/tune.py`). --budget_s stops the search.

    python infer/tune.py --workdir runs/tiny --budget_s 300
    python infer/tune.py --workdir runs/smollm2 --prompt_set humaneval --num_prompts 4 \\
        --draft_workdir runs/smollm2_eagle --draft_workdir runs/smollm2_draft
    python infer/tune.py --workdir runs/tiny --temperature 0.8 --top_p 0.95   # sampled default
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

from absl import app, flags

from specjax.api import LanguageModel
from specjax.cli.decoding import (
    read_prompts_file,
    require_positive_flags,
    run_writing_json,
    whole_numbers_flag,
)
from specjax.cli.entrypoint import parse_flags
from specjax.cli.flags import (
    define_model_flags,
    define_output_flags,
    define_prompt_flags,
    define_sampling_flags,
)
from specjax.decoding.sampling import sampling_or_greedy
from specjax.loading import load_model
from specjax.prompt_sets import PROMPT_SETS
from specjax.tools.tune import NUM_DRAFTS, TREE

define_model_flags(drafters=True)
define_prompt_flags(prompts_file=True, num_prompts=4, prompt_len=128, max_new_tokens=64)
define_sampling_flags()
define_output_flags()
flags.DEFINE_enum("prompt_set", None, sorted(PROMPT_SETS), "Tune on a prompt set's first "
                  "--num_prompts prompts.")
flags.DEFINE_float("budget_s", 600.0, "Seconds of search: no candidate is measured after it; "
                   "the best so far wins.")
flags.DEFINE_list("strategies", None, "Tune only these strategies (default: every one the "
                  "workdir can run).")
flags.DEFINE_integer("exits", 2, "selfspec: the exits tried, the exit report's best.")
flags.DEFINE_list("num_draft", [str(k) for k in NUM_DRAFTS], "Drafts per round K tried for "
                  "each chain.")
flags.DEFINE_multi_string("trees", [TREE], "Trees tried for each strategy that drafts trees "
                          "(--trees= : none).")
flags.DEFINE_integer("confirm", 3, "Kinds of candidate confirmed on all the prompts.")
flags.DEFINE_bool("write", True, "Store the winner as the workdir's decoding default.")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    run_writing_json(run, FLAGS.output_json, lambda tuning: tuning.to_dict(), reads={
        "--workdir": FLAGS.workdir, "--draft_workdir": FLAGS.draft_workdir,
        "--prompts_file": FLAGS.prompts_file})


def run():
    require_positive_flags("num_prompts", "prompt_len", "max_new_tokens", "exits", "confirm")
    num_draft = whole_numbers_flag("num_draft", 1)
    if FLAGS.budget_s <= 0:
        raise ValueError(f"--budget_s={FLAGS.budget_s:g} must be > 0")
    if FLAGS.prompts_file and FLAGS.prompt_set:
        raise ValueError("give --prompts_file or --prompt_set, not both")
    sampling_or_greedy(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p, prefix="--")  # a bad one
    # named as the flag the user typed, before the model loads
    prompts = read_prompts_file(FLAGS.prompts_file) if FLAGS.prompts_file else None
    model = LanguageModel(load_model(FLAGS.workdir, draft_workdir=FLAGS.draft_workdir))
    tuning = model.tune(
        prompts, prompt_set=FLAGS.prompt_set, num_prompts=FLAGS.num_prompts,
        prompt_len=FLAGS.prompt_len, max_new_tokens=FLAGS.max_new_tokens,
        temperature=FLAGS.temperature, top_k=FLAGS.top_k, top_p=FLAGS.top_p,
        budget_s=FLAGS.budget_s, strategies=FLAGS.strategies, exits=FLAGS.exits,
        num_draft=num_draft, trees=[tree for tree in FLAGS.trees if tree],
        confirm=FLAGS.confirm, write=FLAGS.write, progress=lambda line: print(line, flush=True))
    print(tuning.table())
    return tuning


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
