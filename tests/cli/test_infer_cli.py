"""infer/generate.py and bench/bench.py as a user runs them, on a briefly trained workdir."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from specjax.io.checkpoint import load_params
from specjax.kernels import cpu_attention, cpu_matmul
from specjax.tools.bench import decode_step_bytes
from tests.support import ROOT
from tests.support.scripts import run_script, script_env, with_default_sigint

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out


@pytest.fixture(scope="module")
def workdir(trained_workdir):
    return trained_workdir


def _run(script, *args, env=None):
    return run_script(script, *args, env=env)


def test_generate_greedy_selfspec_matches_ar_from_a_prompts_file(workdir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "import os\\n"}\n{"prompt": "def f(x):"}\n')
    outputs = {}
    for strategy in ("ar", "selfspec", "skip"):
        out = tmp_path / f"{strategy}.jsonl"
        result = _run("infer/generate.py", "--workdir", workdir, "--strategy", strategy,
                      "--prompts_file", str(prompts), "--max_new_tokens", "20",
                      *(["--skip_layers", "1,3"] if strategy == "skip" else []),
                      "--output", str(out))
        assert result.returncode == 0, result.stderr[-2000:]
        outputs[strategy] = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in outputs["ar"]] == ["import os\n", "def f(x):"]
    completions = {s: [r["completion"] for r in rows] for s, rows in outputs.items()}
    assert completions["ar"] == completions["selfspec"] == completions["skip"]
    record = outputs["selfspec"][0]
    assert {"rounds", "drafted", "accepted", "tau", "acceptance_rate"} <= set(record)
    assert record["drafted"] == 3 * record["rounds"]  # K=3 came from the checkpoint's config
    assert record["cpu_kernels"][cpu_matmul.SWITCH] == (  # the run records its arithmetic
        "pinned: kernel" if cpu_matmul.available() else "not built: XLA")


@pytest.mark.parametrize("tree", ["auto"])  # static: the mesh test; dynamic: test_decoding_trees
def test_generate_with_a_tree_matches_ar(workdir, tmp_path, tree):
    """Trees from the CLI: the greedy output is ar's; `auto` measures a tree, saves the plan in
    the workdir and reports expected and measured tau. Catches a corrupt plan cache that
    fails every later run ("Expecting value: line 4 column 3", no file named)."""
    outputs = {}
    for name, extra in (("ar", ["--strategy", "ar"]),
                        ("tree", ["--tree", tree])):
        out = tmp_path / f"{name}.jsonl"
        result = _run("infer/generate.py", "--workdir", workdir, "--prompt", "def f(x):",
                      "--max_new_tokens", "24", "--output", str(out), *extra)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs[name] = json.loads(out.read_text())
        if name == "tree" and tree == "auto":
            assert "--tree auto:" in result.stdout and "measured tau" in result.stdout
            assert os.path.exists(os.path.join(workdir, "tree_plans.json"))
    assert outputs["tree"]["completion"] == outputs["ar"]["completion"]
    assert outputs["tree"]["accepted"] + outputs["tree"]["rounds"] == 23
    # A truncated plan cache (an interrupted write) is named, ignored and measured again.
    plans = os.path.join(workdir, "tree_plans.json")
    with open(plans, "r+", encoding="utf-8") as f:
        f.truncate(os.path.getsize(plans) // 2)
    result = _run("infer/generate.py", "--workdir", workdir, "--prompt", "def f(x):",
                  "--max_new_tokens", "4", *extra)
    assert result.returncode == 0 and f"ignoring {plans}, which cannot be read" in result.stderr
    with open(plans, encoding="utf-8") as f:
        assert len(json.load(f)) == 1  # healed: the plan measured again


def test_auto_tree_plans_are_cached_per_exit_layer(tmp_path, monkeypatch):
    """`--tree auto:4` at exit 1, then exit 2, then exit 1 again (the measurement scripted:
    exit 1's drafts rarely accepted, exit 2's mostly at the first child) measures each exit
    once, returns each exit's own best tree, and leaves two plans in tree_plans.json, one
    per exit. Catches a plan cache key without the exit layer (exit 2 decoding with the tree
    measured at exit 1, never measured itself)."""
    import numpy as np

    from specjax.cli import decoding
    from specjax.decoding.registry import DecodingConfig
    from specjax.tools.tree_search import Costs, Measurements

    acceptance = {1: [0.3, 0.2, 0.1], 2: [0.9, 0.05, 0.01]}

    def scripted(exit_layer, children):
        costs = Costs(shallow=np.full(40, 0.01), deep=np.full(40, 0.1), overhead=0.0,
                      ar_step=0.1)
        return Measurements(np.asarray(acceptance[exit_layer]), costs, children)

    measured = []
    monkeypatch.setattr(decoding, "_measured", lambda generator, exit_layer, mode, children,
                        prompts, sampling: measured.append(exit_layer) or
                        scripted(exit_layer, children))
    trees = {}
    for exit_layer in (1, 2, 1):
        options = DecodingConfig(tree="auto:4", exit_layer=exit_layer)
        resolved, plan = decoding.resolve_auto_tree(options, None, list, None,
                                                    workdir=str(tmp_path), step=6)
        expected = scripted(exit_layer, options.tree_children).best_tree(nodes=4)
        assert plan.tree.parents == expected.tree.parents
        assert json.loads(resolved.tree) == list(expected.tree.parents)
        trees[exit_layer] = plan.tree.parents
    assert measured == [1, 2] and trees[1] != trees[2]
    with open(tmp_path / "tree_plans.json", encoding="utf-8") as f:
        keys = sorted(json.load(f))
    assert [key.split("exit_layer=")[1].split()[0] for key in keys] == ["1", "2"]


def test_generate_sampling_with_a_single_prompt(workdir):
    result = _run("infer/generate.py", "--workdir", workdir, "--prompt", "class A:",
                  "--temperature", "0.8", "--top_k", "20", "--top_p", "0.9", "--seed", "3",
                  "--exit_layer", "1", "--num_draft", "2", "--max_new_tokens", "12")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("class A:") and "--- tau=" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--prompt", "x", "--prompts_file", "p.jsonl"],
         "exactly one of --prompt, --prompts_file and --prompt_set"),
    (["--prompt", "x", "--exit_layer", "4"], "exit_layer=4 must lie in"),
    (["--prompt", "x", "--exit_layer", "0"], "exit_layer=0 must lie in"),
    (["--prompt", "x", "--tree", "2,x"], "expected children per depth"),
    (["--prompt", "x", "--tree", "dynamic", "--tree_nodes", "2"], "tree_nodes=2 must lie in"),
    (["--prompt", "x", "--temperature", "-1"], "temperature=-1.0 must be > 0"),
    (["--prompt", "x", "--num_draft", "0"], "num_draft=0 must be"),
    (["--prompt", "x", "--strategy", "skip"], "strategy 'skip' needs --skip_layers"),
    (["--prompt", "x", "--strategy", "skip", "--skip_layers", "2,x"], "expected comma-separated"),
    (["--prompt", "x", "--strategy", "skip", "--skip_layers", "4"], "must lie in [1, num_layers"),
    (["--prompt", "x", "--top_p", "0.9"], "--top_p filters a sampling distribution"),
    (["--prompt", "x", "--seed", "3"], "--seed draws sampled tokens: set --temperature > 0"),
    (["--prompts_file", "missing.jsonl"], "missing.jsonl: no such prompts file"),
    (["--prompt", "x", "--mesh", "2,x"], "give three sizes data,fsdp,tensor"),
    (["--prompt", "x", "--mesh", "2,1,1"], "does not fit 1 devices"),
])
def test_generate_errors_are_clear(workdir, args, message):
    result = _run("infer/generate.py", "--workdir", workdir, *args)
    assert result.returncode == 1 and message in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_files_fail_at_once_with_the_file_named(workdir, tmp_path):
    """Catches a prompts file that is a directory or not UTF-8 ending in a traceback (or no
    file:line), and an unwritable --output failing only after all generation."""
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n')
    missing_dir = str(tmp_path / "no" / "such" / "dir" / "out.jsonl")
    for args, message in (
            (["--prompts_file", str(tmp_path)], f"{tmp_path}: is a directory"),
            (["--prompts_file", str(latin1)], f"{latin1}:2: not UTF-8 text"),
            (["--prompt", "x", "--output", missing_dir], f"cannot write {missing_dir}")):
        result = _run("infer/generate.py", "--workdir", workdir, *args)
        assert result.returncode == 1 and message in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    for flag in ("--repeats=0", "--num_prompts=0", "--seeds=0"):
        result = _run("bench/bench.py", "--workdir", workdir, flag)
        assert result.returncode == 1 and f"{flag} must be >= 1" in result.stderr



@pytest.mark.parametrize("script", ["infer/generate.py", "bench/bench.py",
                                    "infer/learn_then_test.py", "infer/skip_search.py",
                                    "infer/tune.py"])
def test_every_sampling_script_reads_top_k(workdir, script):
    """Catches a script taking the shared sampling flags (`specjax.cli.flags`) but not passing
    --top_k on to its sampling (bench, learn_then_test and skip_search had no --top_k): there a
    top-k filter at temperature 0 would run greedy instead of being refused."""
    prompt = ["--prompt", "x"] if script == "infer/generate.py" else []
    result = _run(script, "--workdir", workdir, "--top_k", "3", *prompt)
    assert result.returncode == 1 and "--top_k" in result.stderr, result.stderr[-2000:]
    assert "temperature" in result.stderr and result.stderr.count("\n") == 1

def test_ar_reports_no_acceptance_rate(workdir):
    """Catches `ar` rows printing acceptance 0.00: ar drafts nothing, so there is none."""
    result = _run("infer/generate.py", "--workdir", workdir, "--strategy", "ar", "--prompt", "x",
                  "--max_new_tokens", "4")
    assert result.returncode == 0 and "acceptance=n/a" in result.stdout, result.stderr[-2000:]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_during_generation_ends_cleanly_keeping_finished_rows(workdir, tmp_path, signum):
    """Catches Ctrl-C ending in a traceback and a crash of JAX's threads at exit, rows held
    back until the end (an interrupted run would lose them all), an interrupted run's rows
    under the output's own name (they go to <output>.partial), and SIGTERM killing the run
    with its hidden temporary file left beside the output. The child starts with
    SIGINT at its default and unblocked whatever the test runner's worker left (a worker that
    ignores or blocks it hands that on, and the run then ends normally, uninterrupted)."""
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out.jsonl"
    streamed = lambda: [tmp_path / n for n in os.listdir(tmp_path) if n.endswith(".partial")]
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}("}) + "\n" for i in range(5000)))
    env = script_env()
    command = [sys.executable, os.path.join(ROOT, "infer", "generate.py"), "--workdir", workdir,
               "--prompts_file", str(prompts), "--max_new_tokens", "64", "--batch_size", "1",
               "--output", str(out)]
    proc = subprocess.Popen(with_default_sigint(command), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not any(path.read_text().count("\n") >= 2 for path in streamed()):
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, "no row was written"
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and stderr.strip().endswith("interrupted"), (
        f"rc {proc.returncode}, runner SIGINT {signal.getsignal(signal.SIGINT)}, blocked "
        f"{signal.pthread_sigmask(signal.SIG_BLOCK, [])}: {stderr[-2000:]}")
    assert "Traceback" not in stderr and not out.exists()
    assert streamed() == [tmp_path / "out.jsonl.partial"]  # the hidden temporary file is gone
    rows = [json.loads(line) for line in streamed()[0].read_text().splitlines()]  # all whole
    assert 2 <= len(rows) < 5000 and rows[0]["prompt"] == "def f0("


def test_generate_without_a_checkpoint_is_a_clear_error(tmp_path):
    result = _run("infer/generate.py", "--workdir", str(tmp_path), "--prompt", "x")
    assert result.returncode == 1 and "no checkpoints in" in result.stderr
    assert "Traceback" not in result.stderr


def test_generate_on_a_mesh_of_four_devices_matches_one_device(workdir, tmp_path):
    """`--mesh 2,1,2` on 4 simulated devices: two prompts' rows over data, the weights over
    tensor, a selfspec tree gives one device's ar text. Catches the flag not reaching the
    Generator (no mesh line) and a layout that changes the tokens."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "import os\\n"}\n{"prompt": "def f(x):"}\n')
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    completions = {}
    for name, extra, env in (("one device", ["--strategy", "ar"], {}),
                             ("mesh", ["--tree", "2,2,1", "--mesh", "2,1,2"],
                              {"XLA_FLAGS": flags})):
        out = tmp_path / "out.jsonl"
        result = _run("infer/generate.py", "--workdir", workdir, "--prompts_file", str(prompts),
                      "--max_new_tokens", "16", "--output", str(out), *extra, env=env)
        assert result.returncode == 0, result.stderr[-2000:]
        completions[name] = [json.loads(line)["completion"] for line in open(out)]
    assert "decoding on a mesh of data=2, fsdp=1, tensor=2" in result.stderr
    assert completions["mesh"] == completions["one device"]


def test_bench_reports_speed_acceptance_and_bandwidth(workdir, tmp_path):
    """The bench's report at batch 2: speed, acceptance, identity with ar and ar's bandwidth,
    whose achieved rate is the report's own bytes a step times steps a second (tokens a second
    over the 2 rows a step decodes). Catches the achieved bandwidth charging a batch-2 step
    once per row (twice the bytes/s read), a bench whose baseline is whatever strategy
    comes first (a third probe: `--strategies ngram` showed 1.00x and "identical to ar" with
    no ar run): ar always runs, and bytes a step charged at a context of max_new_tokens
    instead of the mean one, the mean prompt plus half the new tokens (recomputed here)."""
    report_path = tmp_path / "bench.json"
    result = _run("bench/bench.py", "--workdir", workdir, "--num_prompts", "2", "--prompt_len",
                  "16", "--max_new_tokens", "48", "--repeats", "2", "--batch_size", "2",
                  "--strategies", "selfspec",
                  "--exit_layer=1,2",
                  "--tree", "chain", "--tree", "2,1", "--bandwidth_mb", "64",
                  "--output_json", str(report_path))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(report_path.read_text())
    names = [r["strategy"] for r in report["results"]]
    assert names == ["ar", "selfspec E=1 K=3", "selfspec E=2 K=3", "selfspec E=1 tree 2,1",
                     "selfspec E=2 tree 2,1"]
    assert [r["positions_verified_per_round"] for r in report["results"]] == [1, 4, 4, 5, 5]
    costs = report["verify_seconds"]
    assert costs["tokens"] == [1, 8, 16, 32] and min(costs["seconds"]) > 0
    assert "verify pass (layers 1..L + head)" in result.stdout
    for row in report["results"]:
        assert row["identical_to_ar"] and row["tokens"] == 2 * 48 and row["tokens_per_s"] > 0
    assert report["results"][0]["speedup"] == 1.0
    assert report["unfinished_training"] == [] and "WARNING" not in result.stdout  # 6 of 6
    assert report["read_bandwidth_gb_s"] > 0 and 0 < report["ar_bandwidth_fraction"]
    assert report["matvec_chain_gb_s"] > 0 and 0 < report["ar_matvec_fraction"]
    assert report["batch_size"] == 2
    assert report["ar_decode_tokens_per_s"] == report["results"][0]["decode_tokens_per_s"]
    assert report["ar_achieved_gb_s"] * 1e9 == pytest.approx(
        report["ar_bytes_per_step"] * report["ar_decode_tokens_per_s"] / 2, rel=1e-9)
    params, cfg, _ = load_params(workdir)
    assert report["mean_prompt_tokens"] == 16
    assert report["ar_bytes_per_step"] == decode_step_bytes(params, cfg, 16 + 48 / 2, batch=2)
    assert report["cpu_kernels"] == {
        kernel.SWITCH: "pinned: kernel" if kernel.available() else "not built: XLA"
        for kernel in (cpu_attention, cpu_matmul)}
    assert "CPU kernels: SPECJAX_CPU_ATTENTION " in result.stdout
    assert "identical to ar" in result.stdout and "GB/s read bandwidth" in result.stdout
    assert "[bench] timed repeat 2/2 of 5 strategies" in result.stderr  # progress
    assert "matrix-vector products alone" in result.stdout


def test_busy_bench_compares_the_kernel_with_xla_under_load(workdir, tmp_path):
    """The README's busy-machine command: one row per busy count, both programs timed, the
    background processes gone afterwards."""
    if not cpu_matmul.available():
        pytest.skip("no C++ compiler: nothing to compare")
    report = tmp_path / "busy.json"
    result = _run("bench/busy_bench.py", "--workdir", workdir, "--busy", "0,1", "--pairs", "1",
                  "--num_prompts", "1", "--prompt_len", "16", "--max_new_tokens", "8",
                  "--kernel", "all", "--output_json", str(report))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(report.read_text())
    assert [r["busy"] for r in rows] == [0, 1]
    assert all(r["default_tokens_per_s"] > 0 and r["xla_tokens_per_s"] > 0 for r in rows)
    assert "| busy processes | default tokens/s |" in result.stdout
    assert ("default: the matmul, attention kernel where chosen (SPECJAX_CPU_ATTENTION pinned: "
            "kernel; SPECJAX_CPU_MATMUL pinned: kernel); XLA: without it") in result.stdout
    assert not _processes_running("while True: pass")  # none left spinning


def test_attention_bench_times_the_kernel_against_xla(workdir, tmp_path):
    """The README's attention command: a row per (tokens, filled) case with both timings; a
    case that does not fit the cache, or a token count below 1, is a one-line error."""
    if not cpu_attention.available():
        pytest.skip("no C++ compiler: nothing to compare")
    report = tmp_path / "attention.json"
    result = _run("bench/attention_bench.py", "--workdir", workdir, "--tokens", "1,3",
                  "--filled", "5", "--slots", "40", "--calls", "2", "--repeats", "1",
                  "--output_json", str(report))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(report.read_text())
    assert [(r["tokens"], r["filled"]) for r in rows] == [(1, 5), (3, 5)]
    assert all(r["xla_us"] > 0 and r["kernel_us"] > 0 for r in rows)
    assert "| new tokens | filled slots | XLA | kernel | XLA / kernel |" in result.stdout
    result = _run("bench/attention_bench.py", "--workdir", workdir, "--filled", "40", "--slots",
                  "40")
    assert result.returncode != 0
    assert "--filled=40 plus --tokens=1 exceed --slots=40" in result.stderr.strip().splitlines()[-1]
    result = _run("bench/attention_bench.py", "--workdir", workdir, "--tokens", "1,0")
    assert result.returncode != 0 and "--tokens=0 must be >= 1" in result.stderr


def _processes_running(text):
    found = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as f:
                if text.encode() in f.read():
                    found.append(cmdline)
        except OSError:  # the process ended meanwhile
            pass
    return found


def test_search_skip_prints_the_best_sets_and_a_command_that_runs(workdir, tmp_path):
    """The README's skip-set search: a table of scored sets with LayerSkip's exits marked,
    JSON of every set, and a best line whose flags generate.py accepts."""
    report = tmp_path / "skip.json"
    result = _run("infer/skip_search.py", "--workdir", workdir, "--num_prompts", "2",
                  "--prompt_len", "16", "--max_new_tokens", "16", "--max_draft", "4",
                  "--output_json", str(report))
    assert result.returncode == 0, result.stderr[-2000:]
    scored = json.loads(report.read_text())
    assert len(scored) >= 4 and all(0 <= s["acceptance"] <= 1 for s in scored)
    assert "(= selfspec E=1)" in result.stdout
    best = result.stdout.strip().splitlines()[-1].removeprefix("best: ").split()
    generated = _run("infer/generate.py", "--workdir", workdir, *best, "--prompt", "x = ",
                     "--max_new_tokens", "8")
    assert generated.returncode == 0, generated.stderr[-2000:]


def test_generate_with_a_draft_model_matches_ar(workdir, tmp_path):
    """`--strategy draft --draft_workdir`: the draft model is loaded next to the target and
    greedy output is ar's (here the model drafts for itself: every draft is accepted)."""
    outputs = {}
    for name, extra in (("ar", ["--strategy", "ar"]),
                        ("draft", ["--strategy", "draft", "--draft_workdir", workdir])):
        out = tmp_path / f"{name}.jsonl"
        result = _run("infer/generate.py", "--workdir", workdir, *extra, "--prompt", "import os",
                      "--max_new_tokens", "16", "--output", str(out))
        assert result.returncode == 0, result.stderr[-2000:]
        outputs[name] = json.loads(out.read_text())
    assert outputs["draft"]["completion"] == outputs["ar"]["completion"]
    assert outputs["draft"]["acceptance_rate"] > 0.9  # the budget may cut the last round
    missing = _run("infer/generate.py", "--workdir", workdir, "--strategy", "draft", "--prompt",
                   "x")
    assert missing.returncode == 1 and "pass --draft_workdir" in missing.stderr


def test_a_prompts_line_whose_prompt_is_not_a_string_is_named(tmp_path):
    """A prompts file line `{"prompt": 5}` is a one-line error naming file:line. Catches a
    non-string "prompt" accepted (a number reaching the tokenizer: "argument 'input': 'int'
    object cannot be converted")."""
    from specjax.cli.decoding import read_prompts_file

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a"}\n{"prompt": 5}\n')
    with pytest.raises(ValueError, match=f"^{prompts}:2: expected an object with a string "
                                         "'prompt', a 'messages' list or an 'ids' list$"):
        read_prompts_file(str(prompts))


def test_an_auto_tree_of_no_nodes_is_refused(tmp_path):
    """`--tree auto:0` is a one-line error "N must be >= 1" before anything is measured.
    Catches `auto:0` accepted (a zero-node tree searched for and measured)."""
    from specjax.cli.decoding import resolve_auto_tree
    from specjax.decoding.registry import DecodingConfig

    with pytest.raises(ValueError, match=r"^tree 'auto:0': N must be >= 1$"):
        resolve_auto_tree(DecodingConfig(tree="auto:0"), None, list, None,
                          workdir=str(tmp_path), step=0)
