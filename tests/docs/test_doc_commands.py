"""Every command of the README and docs/ runs as written, at smoke size: each document's
commands (training runs first), in a fresh folder holding a reader's `corpus.jsonl`
and `prompts.jsonl`, and a smoke-size `runs/tiny` (the default config: 8 layers, width 32), with
only size flags appended (fewer steps, prompts and tokens; the values the document gives stay).
docs/results/' benchmarks run with their sweeps cut short (`one_point`). The commands no test
can run here are in NOT_RUN with their reason; test_recipe.py runs the recipe
(docs/guide/your-own-model.md). The runs take about 10 minutes on 2 cores (`-n 2 --dist load`),
more than CI's budget leaves: `pytest -m docs tests` runs them, the suite's command checks the
lists."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from specjax.cli.decoding import DECODING_FLAGS, LISTED_FLAGS
from tests.docs.test_docs import _read, commands
from tests.support import ROOT
from tests.support.scripts import reader_files, script_env

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

GUIDES = ["README.md", "docs/guide/training.md", "docs/guide/decoding.md",
          "docs/guide/drafters.md", "docs/guide/calm.md", "docs/guide/ssm.md",
          "docs/guide/meshes.md", "docs/guide/huggingface.md", "docs/guide/real-checkpoint.md",
          "docs/benchmarks.md"]
RESULTS = [name for name in sorted(os.path.relpath(path, ROOT) for path in
                                   glob.glob(os.path.join(ROOT, "docs", "results", "*.md")))
           if commands(_read(name))]
DOCS = GUIDES + RESULTS
RECIPE = commands(_read("docs/guide/your-own-model.md"))

TRAIN = ["--config.train.total_steps=2", "--config.train.warmup_steps=1",
         "--config.train.eval_every=2", "--config.train.save_every=2",
         "--config.train.batch_size=8", "--config.train.eval_batches=1",
         "--config.train.log_every=1"]
DATA = ["--config.data.seq_len=32", "--config.data.max_documents=60"]
MODEL = ["--config.model.d_model=32", "--config.model.mlp_dim=64"]
SSM = ["--config.model.ssm.num_heads=2", "--config.model.ssm.head_dim=16",
       "--config.model.ssm.chunk_size=16"]
DECODE = ["--num_prompts=1", "--prompt_len=16", "--max_new_tokens=8"]
# What each script gets appended (a model config's run also DATA and MODEL, see `_smoke`).
SMOKE = {
    "train/train.py": TRAIN,
    "infer/generate.py": ["--max_new_tokens=8"],
    "bench/bench.py": [*DECODE, "--repeats=1", "--bandwidth_mb=1"],
    "infer/learn_then_test.py": ["--grid=0.95,0.5,0", "--num_prompts=4", "--per_document=2",
                           "--skip_documents=0", "--prompt_len=16", "--max_new_tokens=8",
                           "--speed_prompts=1"],
    "bench/calm_quality.py": [*DECODE, "--repeats=1"],
    "infer/skip_search.py": [*DECODE, "--max_draft=3", "--top=2"],
    "bench/busy_bench.py": [*DECODE, "--pairs=1"],
    "bench/attention_bench.py": ["--calls=5", "--repeats=1"],
    "bench/compile_bench.py": ["--calls=2", "--max_new_tokens=4", "--prompt_len=8"],
    "infer/exit_report.py": ["--max_tokens=256", "--context=32", "--repeats=1", "--num_draft=2",
                             "--num_prompts=2", "--prompt_len=16", "--max_new_tokens=16"],
    "infer/draft_vocab.py": ["--max_tokens=4096"],
    "infer/tune.py": ["--num_prompts=1", "--prompt_len=16", "--max_new_tokens=8",
                      "--num_draft=2", "--trees=", "--exits=1", "--confirm=1"],
    "bench/tree_scan_bench.py": ["--prompt_len=16", "--repeats=1"],
    "bench/step_bench.py": ["--steps=2"],
    "bench/feature_cache_bench.py": ["--steps=1"],
    "bench/data_bench.py": ["--repeats=1", "--config.data.max_documents=20"],
    "train/tokenizer.py": ["--config.data.max_documents=60", "--vocab_size=300"],
    "tools/convert.py": [],
}
# The documented commands no test can run here, each with why (checked against the docs).
NOT_RUN = {
    "~/models/": "a published checkpoint the reader has; imports run on stand-ins in "
                 "test_hf_interop.py, test_medusa.py and test_feature_head_cli.py",
    "--hf_id": "a download from the Hugging Face Hub (no network in the tests): "
               "test_hub_ids.py imports a Hub id from a Hub-layout cache offline",
    "path/to/": "a published head the reader has; the imports run on stand-ins in "
                "test_medusa.py and test_feature_head_cli.py",
    "--distributed": "one of two processes; test_sharding.py runs the pair",
    "gpu1b": "sized for a GPU (1.0B parameters, 2 GB of bf16 weights)",
    "runs/c1500": "the recipe's stand-in after 1,500 steps of continual training on a GPU "
                  "(docs/results/2026-11-26-bring-your-own-model.md)",
    "runs/smollm2": "the real checkpoint, SmolLM2-135M-Instruct (30 layers of width 576): "
                    "tests/convert/test_smollm2.py imports its GGUF in CI and checks it against "
                    "transformers; its drafters train for up to an hour each on 2 cores "
                    "(docs/results/2026-11-27-smollm2.md)",
    "tiny_code:smollm2": "LayerSkip continual training of SmolLM2 and a draft model "
                         "distilled from it, up to an hour each on 2 cores "
                         "(docs/results/2026-11-27-smollm2.md); test_recipe.py runs "
                         "continual training and test_distill.py distillation at smoke size",
    "runs/sb512": "a second stand-in trained for 33 minutes and continued for 15 on 2 cores "
                  "(docs/results/2026-11-27-cpu-stand-in.md); test_recipe.py runs the same "
                  "commands at smoke size",
}
FIXTURE = "runs/tiny"  # made for every document that does not train it itself


def _flag(command: list[str], name: str) -> str | None:
    """The value of --name in `command`, or None."""
    for i, arg in enumerate(command):
        if arg == f"--{name}":
            return command[i + 1]
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def makes(command: list[str]) -> str | None:
    """The folder a command writes: a training run's or an import's workdir, an export, a
    tokenizer."""
    script = command[0]
    if script == "train/tokenizer.py":
        return _flag(command, "output_dir")
    if script == "tools/convert.py" and "--to_hf" in command:
        return _flag(command, "hf_dir")
    return _flag(command, "workdir") if script in ("train/train.py", "tools/convert.py") else None


def reads(command: list[str]) -> list[str]:
    """The runs/ folders a command reads (workdirs, bases, sources, tokenizers)."""
    values = [arg.split("=")[-1] for arg in command[1:]]
    return [v for v in values if v.startswith("runs/") and v != makes(command)]


def _smoke(command: list[str]) -> list[str]:
    """`command` with its script's size flags appended; a model config's training run (not a
    head's, which takes its model from its base) also gets a smoke-size model and data."""
    script, *args = command
    extra = list(SMOKE[script])
    config = _flag(command, "config") or ""
    if config.partition(":")[0] == "tiny_code" and script in ("train/train.py",
                                                                 "bench/step_bench.py",
                                                                 "bench/tree_scan_bench.py"):
        extra += [*DATA, *MODEL] if script != "bench/tree_scan_bench.py" else MODEL
        if config.endswith((":hybrid", ":mamba2")) or script == "bench/tree_scan_bench.py":
            extra += SSM
    return [script, *args, *extra]


def one_point(command: list[str]) -> list[str]:
    """A benchmark's sweep cut short: each comma-swept decoding flag to its first value, a
    repeated one (trees, skipped layers) to its first and last (a chain and a tree, whose
    options the command sets). A study's sweep is its size, one compiled program per point:
    docs/results/'s sweeps take more than 30 minutes at smoke size."""
    if command[0] != "bench/bench.py":
        return command
    pairs, args, i = [], command[1:], 0
    while i < len(args):
        name, joined, value = args[i][2:].partition("=")
        if not joined and name in DECODING_FLAGS:
            value, i = args[i + 1], i + 1
        pairs.append((name, value if name in DECODING_FLAGS else None, args[i]))
        i += 1
    kept = [command[0]]
    for k, (name, value, arg) in enumerate(pairs):
        if name not in DECODING_FLAGS:
            kept.append(arg)
        elif name in LISTED_FLAGS:
            places = [j for j, pair in enumerate(pairs) if pair[0] == name]
            if k in (places[0], places[-1]):
                kept.append(f"--{name}={value}")
        else:
            kept.append(f"--{name}={value.split(',')[0]}")
    return kept


def not_run(doc: str) -> dict[tuple[str, ...], str]:
    """The document's commands that do not run here, each with why: NOT_RUN's, and those that
    read what one of them would make."""
    reasons, unmade = {}, set()
    for command in commands(_read(doc)):
        why = next((why for key, why in NOT_RUN.items() if key in " ".join(command)), None)
        if doc == "README.md" and command in RECIPE:
            why = "the recipe: test_recipe.py runs it as written"
        missing = [path for path in reads(command) if path in unmade]
        if why is None and missing:
            why = f"reads {missing[0]}, which a command not run here makes"
        if why is not None:
            reasons[tuple(command)] = why
            unmade.add(makes(command))
    return reasons


def ordered(doc: str) -> list[list[str]]:
    """The document's runnable commands, each once, training runs first (a document may show a
    benchmark of the model it trains further down), after the commands of other documents
    that make what they read (a tokenizer, a head's workdir)."""
    skipped = not_run(doc)
    runnable = [c for c in commands(_read(doc)) if tuple(c) not in skipped]
    unique = list({tuple(c): c for c in runnable}.values())
    trains = [c for c in unique if c[0] == "train/train.py"]
    own = trains + [c for c in unique if c not in trains]
    made = {makes(c) for c in own} | {FIXTURE}
    needed = []
    for command in own:
        for path in reads(command):
            if path not in made:
                maker = MAKERS[path]
                needed += [c for c in ordered_makers(maker, made) if c not in needed]
    return needed + own


def ordered_makers(command: list[str], made: set[str]) -> list[list[str]]:
    """`command` after the commands that make what it reads, those not in `made`."""
    before = [c for path in reads(command) if path not in made
              for c in ordered_makers(MAKERS[path], made)]
    made.add(makes(command))
    return [*before, command]


ALL_DOCS = [*DOCS, "docs/guide/your-own-model.md"]
MAKERS = {}  # runs/ folder -> the first documented command that makes it
for _doc in ALL_DOCS:
    for _command in commands(_read(_doc)):
        if makes(_command) and not any(key in " ".join(_command) for key in NOT_RUN):
            MAKERS.setdefault(makes(_command), _command)


@pytest.fixture(scope="module")
def smoke_tiny(tmp_path_factory) -> str:
    """The main job's `runs/tiny` at smoke size: the default config, 8 layers of width 32."""
    folder = tmp_path_factory.mktemp("tiny")
    results = _run(str(folder), [_smoke(["train/train.py", "--config", "tiny_code",
                                         "--workdir", "runs/tiny"])])
    assert results[-1]["status"] == 0, results[-1]["output"]
    return str(folder / "runs" / "tiny")


def _run(cwd: str, sequence: list[list[str]], env: dict | None = None) -> list[dict]:
    plan = os.path.join(cwd, ".plan.json")
    with open(plan, "w", encoding="utf-8") as f:
        json.dump({"cwd": cwd, "commands": sequence}, f)
    result = subprocess.run([sys.executable, "-m", "tests.support.script_runner", plan], cwd=ROOT,
                            env=script_env(**(env or {})), capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.docs  # about 10 minutes: `-m docs` runs it (pyproject.toml)
@pytest.mark.parametrize("doc", DOCS)
def test_the_documented_commands_run_as_written(doc, smoke_tiny, tmp_path):
    """Catches a documented command that fails when run (a flag value the script refuses, a
    strategy that needs a workdir the document never made, a config variant that no longer
    trains), which a check of the flags' names alone (test_docs.py) lets through."""
    sequence = ordered(doc)
    reader_files(tmp_path)
    if FIXTURE not in {makes(c) for c in sequence}:
        shutil.copytree(smoke_tiny, tmp_path / "runs" / "tiny")
    devices = "--xla_force_host_platform_device_count=8"
    env = ({"XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {devices}"}
           if doc == "docs/guide/meshes.md" else None)
    if doc in RESULTS:
        sequence = list({tuple(one_point(c)): one_point(c) for c in sequence}.values())
    results = _run(str(tmp_path), [_smoke(c) for c in sequence], env)
    failed = [r for r in results if r["status"] != 0]
    assert not failed, f"{' '.join(failed[0]['command'])}:\n{failed[0]['output']}"
    assert len(results) == len(sequence)


def test_every_command_not_run_has_its_reason():
    """Catches a document with commands left out of DOCS (its commands would never run), and a
    NOT_RUN entry that no documented command needs any more (a reason kept for nothing hides
    that the command could now run)."""
    documents = {os.path.relpath(os.path.join(dirpath, name), ROOT)
                 for dirpath, _, names in os.walk(os.path.join(ROOT, "docs"))
                 for name in names if name.endswith(".md")} | {"README.md"}
    with_commands = {doc for doc in documents if commands(_read(doc))}
    assert with_commands == set(ALL_DOCS)
    used = {key for doc in DOCS for command in commands(_read(doc)) for key in NOT_RUN
            if key in " ".join(command)}
    assert used == set(NOT_RUN)
