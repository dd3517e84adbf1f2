"""The flags many entry points take (the model's workdir, prompts, sampling, outputs): defined
once here, so each has one help text and one meaning in every script's `--help`.

A script calls the `define_*` functions it needs, with its own defaults where they differ (a
benchmark times more tokens than a quick search); the flags count as the script's own, so its
`--help` lists them (`flags.disclaim_key_flags`)."""

from __future__ import annotations

from absl import flags

flags.disclaim_key_flags()  # the flags defined below are the calling script's key flags

HELP = {
    "workdir": "The model's workdir: its config, checkpoints and tokenizer (written by "
               "train/train.py or tools/convert.py).",
    # no full stop: absl ends a repeatable flag's help with "; repeat this option ..."
    "draft_workdir": "Workdirs of drafters for this model: a smaller model with the same "
                     "tokenizer (strategy draft; trained or imported) or heads trained on this "
                     "model (kangaroo, specdec, medusa, eagle, the CALM classifier)",
    "prompts_file": "JSONL file, one {\"prompt\": ...}, {\"messages\": [{\"role\": ..., "
                    "\"content\": ...}, ...]} or {\"ids\": [token ids]} per line.",
    "num_prompts": "How many prompts: held-out windows of the workdir's validation text, or "
                   "the first of --prompt_set where one is given (none: all of it).",
    "prompt_len": "Tokens per prompt (held-out windows are cut to this length).",
    "max_new_tokens": "New tokens per prompt: generated, or, where a script scores a "
                      "continuation, scored.",
    "temperature": "0: greedy decoding; else sampled at this temperature (lossless in "
                   "distribution).",
    "top_k": "Top-k filtering when sampling (0: off).",
    "top_p": "Nucleus filtering when sampling (1: off).",
    "repeats": "Timed repeats of each measurement (the median is kept; the best by "
               "bench/data_bench.py).",
    "output_json": "Also write the results here as JSON.",
}

PROMPT_FLAGS = ("num_prompts", "prompt_len", "max_new_tokens")  # sized per script


def define_model_flags(drafters: bool = False, required: bool = False) -> None:
    """--workdir (a flag error when `required` and missing) and, with `drafters`,
    --draft_workdir (repeatable)."""
    flags.DEFINE_string("workdir", None, HELP["workdir"], required=required)
    if drafters:
        flags.DEFINE_multi_string("draft_workdir", None, HELP["draft_workdir"])


def define_prompt_flags(prompts_file: bool = False, **defaults: int | None) -> None:
    """--prompts_file when `prompts_file`, and each of --num_prompts, --prompt_len and
    --max_new_tokens named in `defaults` with its default there (None: unset)."""
    if prompts_file:
        flags.DEFINE_string("prompts_file", None, HELP["prompts_file"])
    for name, default in defaults.items():
        if name not in PROMPT_FLAGS:
            raise TypeError(f"define_prompt_flags: {name!r} is not one of {PROMPT_FLAGS}")
        flags.DEFINE_integer(name, default, HELP[name])


def define_sampling_flags() -> None:
    """--temperature, --top_k and --top_p (greedy by default), read with
    `sampling_or_greedy(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p, prefix="--")`."""
    flags.DEFINE_float("temperature", 0.0, HELP["temperature"])
    flags.DEFINE_integer("top_k", 0, HELP["top_k"])
    flags.DEFINE_float("top_p", 1.0, HELP["top_p"])


def define_output_flags(repeats: int | None = None, output_json: bool = True) -> None:
    """--output_json (unless not `output_json`) and, for a script that times, --repeats with
    this default."""
    if repeats is not None:
        flags.DEFINE_integer("repeats", repeats, HELP["repeats"])
    if output_json:
        flags.DEFINE_string("output_json", None, HELP["output_json"])
