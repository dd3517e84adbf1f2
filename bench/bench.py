"""Benchmarks decoding strategies on a trained workdir: speed, speed-up over autoregressive
decoding, tokens per round, acceptance, compile time, and memory bandwidth. Same weights and
prompts, one process, after a warm-up; greedy unless --temperature.

    python bench/bench.py --workdir runs/tiny
    python bench/bench.py --workdir runs/tiny --exit_layer=1,2 --num_draft=3,4,6
    python bench/bench.py --workdir runs/tiny --tree chain --tree 2,2,1,1 --tree dynamic --tree auto
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import os
import platform
import sys

import jax
from absl import app, flags

from specjax.cli import decoding as cli
from specjax.cli.decoding import (
    DECODING_FLAGS,
    decoding_defaults,
    define_decoding_flags,
    define_mesh_flag,
    mesh_from_flag,
    read_prompts_file,
    require_positive_flags,
    require_weights_used,
    resolve_auto_tree,
    run_writing_json,
    sweep_options,
)
from specjax.cli.entrypoint import parse_flags
from specjax.cli.flags import (
    define_model_flags,
    define_output_flags,
    define_prompt_flags,
    define_sampling_flags,
)
from specjax.data import completion_prompts, heldout_data, heldout_prompts
from specjax.decoding.registry import STRATEGIES, make_strategy, require_used
from specjax.decoding.sampling import sampling_or_greedy
from specjax.kernels import decision
from specjax.loading import load_model
from specjax.prompt_sets import PROMPT_SETS, encode_prompts, load_prompt_set
from specjax.tokenizer import workdir_tokenizer
from specjax.tools.bench import (
    decode_step_bytes,
    matvec_bandwidth,
    read_bandwidth,
    run_benchmark,
)
from specjax.tools.tree_search import pass_seconds

define_model_flags(drafters=True)
define_prompt_flags(prompts_file=True, num_prompts=8, prompt_len=128, max_new_tokens=256)
define_sampling_flags()
define_output_flags(repeats=3)
flags.DEFINE_enum("prompt_set", "heldout", ["heldout", "completion", *sorted(PROMPT_SETS)],
                  "Prompts: held-out windows from the middle of validation files, code "
                  "completion whose prompt shares text with its answer "
                  "(data.completion_prompts), or the first --num_prompts of a set of real "
                  "text (humaneval: HumanEval's problems; chat: questions over MT-bench's "
                  "categories, in the chat template where the model has one).")
flags.DEFINE_list("strategies", ["ar", "selfspec"], "Strategies to compare with ar (the "
                  "baseline, always run); available: "
                  f"{', '.join(sorted(STRATEGIES))}.")
define_decoding_flags(sweep=True)
define_mesh_flag()
flags.adopt_module_key_flags(cli)  # --help lists the decoding flags too
flags.DEFINE_integer("batch_size", 1, "Prompts decoded together.")
flags.DEFINE_integer("seeds", 1, "Sampled runs: decode every prompt with seeds 0..N-1 (one "
                     "seed's tau, and so its speed, differed by 12% between two seeds at 16 "
                     "prompts x 256 tokens).")
flags.DEFINE_integer("bandwidth_mb", None, "Array size for the read-bandwidth measurement "
                     "(default 512 on a CPU, 4096 on an accelerator: a GPU reads a 512 MB array "
                     "at 60% of the rate it reads 4 GiB).")
flags.DEFINE_bool("compare_hf", False, "Also time Hugging Face transformers' greedy generate() "
                  "and its equivalent of each strategy that has one (assistant_early_exit for "
                  "selfspec chains, prompt lookup for ngram, assisted generation with the "
                  "--draft_workdir model for draft) on the same weights (needs the `hf` "
                  "extra).")
flags.DEFINE_float("hf_budget_s", 900, "--compare_hf: a transformers variant whose warm-up on "
                   "the first prompt projects more than this many seconds for its timed runs "
                   "is skipped (and reported so).")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    print(format_report(run_writing_json(benchmark, FLAGS.output_json, reads={
        "--workdir": FLAGS.workdir, "--prompts_file": FLAGS.prompts_file,
        "--draft_workdir": FLAGS.draft_workdir})))


def _progress(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


def benchmark() -> dict:
    require_positive_flags("num_prompts", "prompt_len", "max_new_tokens", "batch_size", "repeats",
                           "seeds")
    for name in ("num_prompts", "prompt_len", "prompt_set"):
        if FLAGS.prompts_file and FLAGS[name].present:
            raise ValueError(f"--{name} and --prompts_file do not go together: --{name} "
                             "shapes held-out prompts, --prompts_file gives its own; drop one")
    if FLAGS.prompt_set in PROMPT_SETS and FLAGS["prompt_len"].present:
        raise ValueError(f"--prompt_len shapes held-out windows; --prompt_set {FLAGS.prompt_set} "
                         "brings its own prompts: drop one")
    sampling = sampling_or_greedy(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p, prefix="--")
    mesh = mesh_from_flag()
    loaded = load_model(FLAGS.workdir, draft_workdir=FLAGS.draft_workdir, mesh=mesh)
    params, cfg, meta = loaded.params, loaded.cfg, loaded.meta
    tokenizer = workdir_tokenizer(meta, FLAGS.workdir)
    if FLAGS.prompts_file:
        prompts = encode_prompts(tokenizer, read_prompts_file(FLAGS.prompts_file))
    elif FLAGS.prompt_set in PROMPT_SETS:
        prompts = encode_prompts(tokenizer, load_prompt_set(FLAGS.prompt_set, tokenizer,
                                                            FLAGS.num_prompts))
    else:
        data = heldout_data(meta)
        choose = completion_prompts if FLAGS.prompt_set == "completion" else heldout_prompts
        prompts = choose(data, tokenizer, FLAGS.num_prompts, FLAGS.prompt_len)
    generator = loaded.generator()
    sweeps = {name: getattr(FLAGS, name) for name in DECODING_FLAGS}
    swept = sweep_options(decoding_defaults(meta), cfg, sweeps)
    # ar is the baseline of every column (speed-up, identical to ar, the bandwidth): always run.
    names = list(dict.fromkeys(["ar", *FLAGS.strategies]))
    require_used(FLAGS.strategies, swept, [name for name, values in sweeps.items() if values])
    # An auto tree is measured once and then read from the workdir's plans.
    option_sets = [resolve_auto_tree(options, generator, lambda: prompts, sampling,
                                     workdir=FLAGS.workdir, step=meta["step"],
                                     strategies=names)
                   for options in swept]
    strategies, plans = {}, {}
    for name in names:
        for options, plan in option_sets:
            chosen = [option for option, values in sweeps.items() if values]
            strategy = make_strategy(name, loaded.at_head_exit(name, options, chosen))
            strategies[strategy.label()] = strategy
            if plan is not None and strategy.shape == plan.tree:
                plans[strategy.label()] = plan
    require_weights_used(FLAGS.draft_workdir, strategies.values())
    if FLAGS.compare_hf:
        require_hf_peer(strategies)
    elif FLAGS["hf_budget_s"].present:
        raise ValueError("--hf_budget_s bounds --compare_hf's runs: give --compare_hf too")
    results = run_benchmark(generator, strategies, prompts, max_new_tokens=FLAGS.max_new_tokens,
                            batch_size=FLAGS.batch_size, repeats=FLAGS.repeats,
                            baseline="ar",
                            sampling=sampling, seeds=FLAGS.seeds, progress=_progress)
    bandwidth_mb = FLAGS.bandwidth_mb or (512 if jax.default_backend() == "cpu" else 4096)
    bandwidth, single_thread_bandwidth = read_bandwidth(bandwidth_mb * 2**20)
    bandwidth = max(bandwidth, single_thread_bandwidth)
    matvec = matvec_bandwidth(generator.params, cfg)
    mean_prompt = sum(len(p) for p in prompts) / len(prompts)
    per_step = decode_step_bytes(params, cfg, mean_prompt + FLAGS.max_new_tokens / 2,
                                 FLAGS.batch_size)
    rows = [{"strategy": r.name, "tokens_per_s": r.tokens_per_second,
             "speedup": r.speedup, "tau": r.stats.tau,
             "expected_tau": plans[r.name].expected_tau if r.name in plans else None,
             "tree_parents": list(getattr(strategies[r.name].shape, "parents", [])) or None,
             "acceptance_rate": r.stats.acceptance_rate,
             "positions_verified_per_round": r.stats.verified_per_round,
             "compile_s": r.compile_seconds,
             "decode_tokens_per_s": r.decode_tokens_per_second, "tokens": r.tokens,
             "seconds": r.seconds, "prefill_seconds": r.prefill_seconds,
             "distinct_4grams": r.distinct_4grams,
             "identical_to_ar": r.identical_to_baseline} for r in results]
    verify_costs = _verify_costs(generator, strategies, prompts)
    ar = next((r for r in results if r.name == "ar"), None)
    ar_rate = ar.decode_tokens_per_second if ar else None
    measured = ar_rate is not None
    achieved = per_step * ar_rate / FLAGS.batch_size if measured else None  # bytes/s
    peers = compare_with_hf(results, strategies, prompts, generator) if FLAGS.compare_hf else []
    return {
        "workdir": os.path.abspath(FLAGS.workdir), "step": meta["step"],
        "unfinished_training": list(loaded.unfinished),
        "model": cfg.to_dict(), "prompts": len(prompts), "mean_prompt_tokens": mean_prompt,
        "max_new_tokens": FLAGS.max_new_tokens, "batch_size": FLAGS.batch_size,
        "repeats": FLAGS.repeats, "seeds": FLAGS.seeds, "temperature": FLAGS.temperature,
        "top_k": FLAGS.top_k, "top_p": FLAGS.top_p,
        "results": rows, "read_bandwidth_gb_s": bandwidth / 1e9,
        "single_thread_read_bandwidth_gb_s": single_thread_bandwidth / 1e9,
        "matvec_chain_gb_s": matvec / 1e9,
        "cpu_kernels": decision.summary() if jax.default_backend() == "cpu" else {},
        "ar_bytes_per_step": per_step,
        "ar_decode_tokens_per_s": ar_rate,
        "ar_achieved_gb_s": achieved / 1e9 if measured else None,
        "ar_bandwidth_fraction": achieved / bandwidth if measured else None,
        "ar_matvec_fraction": achieved / matvec if measured else None,
        "hf_peers": peers, "verify_seconds": verify_costs,
        "device": str(jax.devices()[0]), "cpu_count": os.cpu_count(),
        "mesh": None if mesh is None else dict(mesh.shape),
        "jax": jax.__version__, "python": platform.python_version()}


def _verify_costs(generator, strategies, prompts) -> dict | None:
    """When trees are benchmarked: seconds of the verifying layers [E, L) + head on n tokens
    (n = 1, 8, 16, 32) at the prompts' context, for the first tree's exit E."""
    trees = [s for s in strategies.values() if not s.shape.is_chain]
    if not trees:
        return None
    exit_layer = trees[0].verify_from
    context = int(sum(len(p) for p in prompts) / len(prompts) + FLAGS.max_new_tokens / 2)
    sizes = [1, 8, 16, 32]
    seconds = pass_seconds(generator, (exit_layer, generator.cfg.num_layers), sizes, context)
    return {"exit_layer": exit_layer, "tokens": sizes, "seconds": seconds}


def require_hf_peer(strategies) -> None:
    """--compare_hf's needs, checked before anything is timed: greedy decoding, batch 1 and a
    positive time budget (transformers' greedy decoding always runs; its equivalents of the
    strategies that have one beside it)."""
    if FLAGS.temperature != 0 or FLAGS.batch_size != 1:
        raise ValueError("--compare_hf needs greedy decoding (--temperature 0) and batch size 1 "
                         "(transformers' assisted generation is batch 1 only)")
    if FLAGS.hf_budget_s <= 0:
        raise ValueError(f"--hf_budget_s={FLAGS.hf_budget_s:g} must be > 0")


def compare_with_hf(results, strategies, prompts, generator) -> list[dict]:
    """HF greedy decoding and HF's equivalent of every strategy that has one, each compared for
    speed and exact output with the specjax strategy it stands for (None where skipped)."""
    from specjax.tools.hf_peer import hf_peer_benchmark

    by_name = {r.name: r for r in results}
    draft = generator.draft_weights.get("draft")
    peers = hf_peer_benchmark(FLAGS.workdir, prompts, max_new_tokens=FLAGS.max_new_tokens,
                              strategies=strategies, repeats=FLAGS.repeats,
                              draft_workdir=draft.workdir if draft else None,
                              budget_seconds=FLAGS.hf_budget_s, progress=_progress)
    return [{"strategy": peer.name, "tokens_per_s": peer.tokens_per_second,
             "specjax_strategy": peer.specjax, "skipped": peer.skipped,
             "specjax_speedup": None if peer.skipped else
             by_name[peer.specjax].tokens_per_second / peer.tokens_per_second,
             "identical_to_specjax": None if peer.skipped else
             peer.generated == by_name[peer.specjax].generated}
            for peer in peers]


def format_report(report: dict) -> str:
    seeds = report["seeds"]
    mode = ("greedy" if report["temperature"] == 0 else
            f"sampled (temperature {report['temperature']}, top-k {report['top_k']}, "
            f"top-p {report['top_p']}"
            + (f", seeds 0..{seeds - 1}" if seeds > 1 else "") + ")")
    lines = [f"{report['prompts']} prompts x {report['max_new_tokens']} new tokens, batch "
             f"{report['batch_size']}, {mode}, median of {report['repeats']} "
             f"(step {report['step']} of {report['workdir']}"
             + (", mesh " + ",".join(f"{k}={v}" for k, v in report["mesh"].items())
                if report.get("mesh") else "") + ")",
             f"{'strategy':<34}{'tok/s':>9}{'speedup':>9}{'tau':>7}{'accept':>8}{'nodes':>7}"
             f"{'decode tok/s':>14}{'compile s':>11}{'distinct 4g':>13}  identical to ar"]
    lines[:0] = [f"WARNING: {note}" for note in report.get("unfinished_training", [])]
    for r in report["results"]:
        same = {True: "yes", False: "NO", None: "n/a (sampled)"}[r["identical_to_ar"]]
        accept = "n/a" if r["strategy"] == "ar" else f"{r['acceptance_rate']:.2f}"
        lines.append(f"{r['strategy']:<34}{r['tokens_per_s']:9.1f}{r['speedup']:8.2f}x"
                     f"{r['tau']:7.2f}{accept:>8}{r['positions_verified_per_round']:7.1f}"
                     f"{_rate(r['decode_tokens_per_s']):>14}"
                     f"{r['compile_s']:11.1f}{r['distinct_4grams']:13.2f}  {same}")
        if r["expected_tau"] is not None:
            lines.append(f"{'':<34}(--tree auto: expected tau {r['expected_tau']:.2f}, "
                         f"parents {r['tree_parents']})")
    if report["verify_seconds"]:
        costs = report["verify_seconds"]
        lines.append(f"verify pass (layers {costs['exit_layer']}..L + head): " + ", ".join(
            f"{n} tokens {1e3 * t:.2f} ms ({1e3 * t / n:.3f} ms/token)"
            for n, t in zip(costs["tokens"], costs["seconds"], strict=True)))
    for peer in report["hf_peers"]:
        if peer.get("skipped"):
            lines.append(f"{peer['strategy']}: skipped ({peer['skipped']})")
            continue
        lines.append(f"{peer['strategy']}: {peer['tokens_per_s']:.1f} tok/s; "
                     f"{peer['specjax_strategy']} is {peer['specjax_speedup']:.2f}x faster, output "
                     f"{'identical' if peer['identical_to_specjax'] else 'DIFFERENT'}")
    if report["ar_achieved_gb_s"] is not None:
        kernel = report["cpu_kernels"].get("SPECJAX_CPU_MATMUL", "not used")
        lines.append(
            f"ar decode reads {report['ar_bytes_per_step'] / 1e6:.1f} MB a step (the weights + "
            f"{report['batch_size']} row(s)' live KV): {report['ar_achieved_gb_s']:.1f} GB/s "
            f"achieved = "
            f"{100 * report['ar_bandwidth_fraction']:.0f}% of the "
            f"{report['read_bandwidth_gb_s']:.1f} GB/s read bandwidth measured here (one core "
            f"alone reads {report['single_thread_read_bandwidth_gb_s']:.1f} GB/s)"
            + (" — more than memory delivers: the weights stay in this CPU's caches"
               if report["ar_bandwidth_fraction"] > 1 else "") + "\n"
            f"the model's matrix-vector products alone, chained in one jitted loop, read "
            f"{report['matvec_chain_gb_s']:.1f} GB/s (batch-1 ceiling of this runtime; CPU matmul "
            f"kernel: {kernel}): ar decode reaches {100 * report['ar_matvec_fraction']:.0f}% of it")
    else:
        lines.append("ar decode bandwidth not measured: the run is too short to separate "
                     "decoding from prefill (raise --max_new_tokens)")
    if report["cpu_kernels"]:
        lines.append("CPU kernels: " + "; ".join(
            f"{switch} {state}" for switch, state in report["cpu_kernels"].items()))
    return "\n".join(lines)


def _rate(tokens_per_s: float | None) -> str:
    return "n/a" if tokens_per_s is None else f"{tokens_per_s:.1f}"


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
