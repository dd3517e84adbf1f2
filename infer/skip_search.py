"""Searches the layers a `skip` draft should pass over for the best expected speed-up, on
held-out prompts (greedy, or sampled with --temperature), and prints the best sets with the
command that decodes with the first.

    python infer/skip_search.py --workdir runs/tiny
    python infer/skip_search.py --workdir runs/tiny --temperature 0.8 --top_p 0.95
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import sys

from absl import app, flags

from specjax.cli.decoding import require_positive_flags, run_writing_json
from specjax.cli.entrypoint import parse_flags
from specjax.cli.flags import (
    define_model_flags,
    define_output_flags,
    define_prompt_flags,
    define_sampling_flags,
)
from specjax.data import heldout_data, heldout_prompts
from specjax.decoding.sampling import sampling_or_greedy
from specjax.loading import load_model
from specjax.tokenizer import workdir_tokenizer
from specjax.tools.skip_search import AcceptanceProbe, SkipCandidate, measure_costs, search

define_model_flags()
define_prompt_flags(num_prompts=8, prompt_len=128, max_new_tokens=128)
define_sampling_flags()
define_output_flags()
flags.DEFINE_integer("max_draft", 12, "Longest chain K considered.")
flags.DEFINE_integer("top", 10, "Skip sets printed.")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    run_writing_json(run, FLAGS.output_json, lambda found: [c.to_dict() for c in found],
                     reads={"--workdir": FLAGS.workdir})


def run() -> list[SkipCandidate]:
    require_positive_flags("num_prompts", "prompt_len", "max_new_tokens", "max_draft", "top")
    sampling = sampling_or_greedy(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p, prefix="--")
    loaded = load_model(FLAGS.workdir)
    tokenizer = workdir_tokenizer(loaded.meta, FLAGS.workdir)
    prompts = heldout_prompts(heldout_data(loaded.meta), tokenizer, FLAGS.num_prompts,
                              FLAGS.prompt_len)
    generator = loaded.generator()
    print("measuring costs and acceptance ...", file=sys.stderr, flush=True)
    costs = measure_costs(generator, FLAGS.prompt_len + FLAGS.max_new_tokens // 2, FLAGS.max_draft)
    probe = AcceptanceProbe(generator, prompts, sampling, new_tokens=FLAGS.max_new_tokens)
    candidates = search(probe, costs, FLAGS.max_draft)
    num_layers = loaded.cfg.num_layers
    mode = ("greedy" if sampling is None else
            f"sampled T={FLAGS.temperature:g} top_k={FLAGS.top_k} top_p={FLAGS.top_p:g}")
    print(f"{len(candidates)} skip sets scored ({mode}, {len(prompts)} held-out prompts); "
          f"costs: layer {costs.layer * 1e6:.0f} us, head {costs.head * 1e6:.0f} us, ar step "
          f"{costs.ar_step * 1e6:.0f} us")
    print(f"{'skip layers':<22} {'drafted':>7} {'accept':>7} {'K':>3} {'exp. tau':>8} "
          f"{'exp. speed-up':>13}")
    tails = {tuple(range(e, num_layers)): e for e in range(1, num_layers)}
    shown = candidates[:FLAGS.top] + [c for c in candidates[FLAGS.top:] if c.skip in tails]
    for c in shown:
        note = f"  (= selfspec E={tails[c.skip]})" if c.skip in tails else ""
        print(f"{','.join(map(str, c.skip)):<22} {num_layers - len(c.skip):>7} "
              f"{c.acceptance:7.3f} {c.num_draft:>3} {c.expected_tau:8.2f} "
              f"{c.expected_speedup:12.2f}x{note}")
    best = candidates[0]
    print(f"best: --strategy skip --skip_layers {','.join(map(str, best.skip))} --num_draft "
          f"{best.num_draft} --tree chain --draft_threshold 0")
    return candidates


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
