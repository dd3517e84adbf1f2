"""Bad inputs that used to end in a traceback are one-line errors naming the file or value, and
leave nothing half-made behind."""

import dataclasses
import json
import os
import re
import shutil
import subprocess

import jax
import pytest

import specjax
from specjax.config import ModelConfig
from specjax.convert.hf import export_checkpoint, import_checkpoint
from specjax.convert.hf_config import ConversionError
from specjax.data import DataConfig, iter_documents
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.errors import SpecjaxError
from specjax.io.checkpoint import Checkpointer
from specjax.loading import load_model
from specjax.model import init_params
from specjax.outputs import staged, staged_dir
from specjax.training.trainer import Trainer
from tests.support.models import TINY_MODEL, model_workdir, tiny_run
from tests.support.scripts import run_script


@pytest.fixture
def hf_dir(base_workdir, tmp_path):
    path = str(tmp_path / "hf")
    export_checkpoint(base_workdir, path)
    return path


def test_a_truncated_or_empty_safetensors_is_named_and_no_workdir_is_made(hf_dir, tmp_path):
    """Catches the safetensors library's own error escaping as a traceback, and an import that
    creates the workdir (and its checkpoints/ folder) before every tensor was read."""
    weights = os.path.join(hf_dir, "model.safetensors")
    for size in (100, 0):
        with open(weights, "r+b") as f:
            f.truncate(size)
        workdir = tmp_path / f"imported{size}"
        with pytest.raises(ConversionError, match="model.safetensors is not a readable "
                                                  "safetensors file"):
            import_checkpoint(hf_dir, str(workdir))
        assert not workdir.exists()


def test_a_broken_config_json_is_named(hf_dir, tmp_path):
    """Catches a KeyError for a missing size and a JSON error that does not name the file."""
    path = os.path.join(hf_dir, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    del config["vocab_size"]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    with pytest.raises(ConversionError, match=re.escape(f"{path} lacks ['vocab_size']")):
        import_checkpoint(hf_dir, str(tmp_path / "w"))
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"architectures": ["LlamaForCausalLM"],')
    with pytest.raises(ConversionError, match=f"{path} is not readable JSON"):
        import_checkpoint(hf_dir, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("key,change,field", [
    ("vocab_size", 5, "vocab_size=264 (the weights fit 259)"),
    ("hidden_size", 5, "hidden_size=37 (the weights fit 32)"),
    ("num_key_value_heads", 2, "num_key_value_heads=4 (the weights fit 2)"),
    ("num_attention_heads", 4, "num_attention_heads=8 (the weights fit 4)"),
    ("head_dim", 8, "head_dim=16 (the weights fit 8)"),
    ("intermediate_size", 5, "intermediate_size=69 (the weights fit 64)"),
    ("num_hidden_layers", 1, "num_hidden_layers is 5"),
    ("num_hidden_layers", -1, "num_hidden_layers is 3"),
    ("num_key_value_heads", 1, "config.json's num_key_value_heads=3 must divide "
                               "num_attention_heads=4"),
    ("head_dim", 1, "config.json's head_dim=9 must be even"),
    ("num_hidden_layers", -4, "config.json's num_hidden_layers=0 must be a positive int")])
def test_a_config_json_that_disagrees_with_the_weights_names_the_field(hf_dir, tmp_path, key,
                                                                       change, field):
    """Catches a ~900-character dump of every parameter's shape, numpy's "cannot reshape
    array" from inside a conversion, or a bare "missing tensor", instead of one line naming the
    tensors, their shapes and the config.json field that sized them; a changed
    num_attention_heads blamed on num_key_value_heads and head_dim (the sizes its expected shape
    shows); and fewer layers in the config than in the weights imported silently, the last
    layers dropped (the third probe); sizes ModelConfig refuses named by its own fields
    (num_kv_heads, not config.json's num_key_value_heads; the fourth probe)."""
    path = os.path.join(hf_dir, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config[key] += change
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    with pytest.raises(ConversionError) as error:
        import_checkpoint(hf_dir, str(tmp_path / "w"))
    message = str(error.value)
    assert field in message and "\n" not in message, message
    assert "disagree" in message or message.startswith("config.json's"), message
    assert len(message) < 400, message
    assert not (tmp_path / "w").exists()


def test_a_tree_naming_a_directory_is_one_line(tmp_path):
    """Catches `--tree` on a folder raising IsADirectoryError."""
    with pytest.raises(ValueError, match="is a directory, not a JSON file of parents"):
        StaticTree.parse(str(tmp_path))


def test_a_workdir_that_is_a_file_is_one_line(tmp_path):
    """Catches `train.py --workdir` on an existing file raising FileExistsError."""
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    with pytest.raises(SpecjaxError, match="is a file, not a directory"):
        Trainer(tiny_run(), str(path))
    assert path.read_text() == "mine"


@pytest.mark.parametrize("prompts, kind", [(b"def f(", "bytes"),
                                           ([1.0, 2.0], "list holding a float"),
                                           ([], "list"), (["ok", 5], "list holding a int"),
                                           ([True, 2], "list holding a bool")])
def test_the_api_names_a_prompt_that_is_not_text(base_workdir, prompts, kind):
    """Catches bytes or numbers that are no token ids reaching the tokenizer (an
    AttributeError from inside it), and a list with one wrong element reported by its first
    (a second probe's "not list of str")."""
    model = specjax.load(base_workdir)
    with pytest.raises(ValueError, match=f"a non-empty list of them, not {kind}"):
        model.generate(prompts)


@pytest.mark.parametrize("flag", ["--delta=0", "--delta=1.5", "--epsilon=0"])
def test_calibration_levels_are_checked_before_the_sweep(base_workdir, flag):
    """Catches `learn_then_test.py --delta 0` failing only after the whole sweep (80 prompts x 21
    values by default): the error must come before the model is even loaded."""
    result = run_script("infer/learn_then_test.py", "--workdir=/nonexistent", flag)
    assert result.returncode == 1
    name, value = flag[2:].split("=")
    assert result.stderr.strip() == f"error: --{name}={float(value):g} must lie in (0, 1)"


def test_a_prompt_longer_than_the_trained_sequences_is_warned_about(base_workdir, caplog):
    """Catches a 3.7 kB prompt on a model trained on 256-token sequences decoding silently
    (its output degrades to spaces): the warning gives both lengths."""
    loaded = load_model(base_workdir)
    model = dataclasses.replace(loaded, meta={**loaded.meta,
                                              "config": {"data": {"seq_len": 256}}})
    with caplog.at_level("WARNING", logger="absl"):
        model.warn_long_prompts([12, 3700])
        model.warn_long_prompts([256])
    lines = [r.getMessage() for r in caplog.records if "longer than" in r.getMessage()]
    assert lines == [f"a prompt of 3700 tokens is longer than the 256-token sequences the "
                     f"model in {base_workdir} was trained on: expect degraded output"]


def test_a_head_on_a_base_without_a_tokenizer_is_one_line(tmp_path, tiny_cfg, tiny_params):
    """Catches a head's config on a base imported without a tokenizer failing with a TypeError
    (there are no tokenizer fields to read) instead of saying what is missing."""
    from specjax.training.frozen_base import config_on_base, load_base

    base = model_workdir(str(tmp_path), tiny_params, tiny_cfg, tokenizer=None)
    with pytest.raises(ValueError, match="names no tokenizer"):
        config_on_base({"kangaroo": {}}, load_base(base))


@pytest.mark.parametrize("strategy, options, unused", [
    ("calm", {"tree": "2,2"}, "tree"),
    ("selfspec", {"skip_layers": "1"}, "skip_layers"),
    ("selfspec", {"tree": "dynamic", "num_draft": 3}, "num_draft"),
    ("ar", {"exit_layer": 2}, "exit_layer"),
], ids=["tree-with-calm", "skip-layers-with-selfspec", "num-draft-with-a-dynamic-tree",
        "exit-with-ar"])
def test_an_option_the_strategy_does_not_read_is_an_error(base_workdir, strategy, options,
                                                          unused):
    """Catches an option silently ignored by the chosen strategy (the user believes they
    measured or decoded something they did not), and the error naming it as a command-line
    flag (a third probe: "--exit_layer" to a Python caller); options it reads still work."""
    model = specjax.load(base_workdir)
    with pytest.raises(ValueError, match=f"^{unused} is not used by strategy {strategy} "):
        model.generate("x", strategy=strategy, max_new_tokens=2, **options)
    used = {k: v for k, v in options.items() if k != unused}
    assert model.generate("x", strategy=strategy, max_new_tokens=2, **used).prompt == "x"


def test_unused_and_empty_decoding_flags_are_one_line_errors(base_workdir):
    """The command line's path: catches `--tree ''` quietly decoding with another tree (it means
    nothing: 'chain' is a chain), and a flag the strategy ignores reaching the decode."""
    for flags, error in [(["--tree="], "error: --tree is empty: give 'chain' for a chain"),
                         (["--strategy=calm", "--tree=2,2"],
                          "error: --tree is not used by strategy calm")]:
        result = run_script("infer/generate.py", f"--workdir={base_workdir}", "--prompt=x",
                            *flags)
        assert result.returncode == 1 and result.stderr.strip().startswith(error), result.stderr


@pytest.mark.parametrize("script, flags, error", [
    ("infer/generate.py", ["--prompt=x", "--draft_workdir={workdir}"],
     "--draft_workdir: the chosen strategies draft without weights of their own (kangaroo, "
     "specdec, draft and calm's classifier use them)"),
    ("bench/bench.py", ["--prompts_file={prompts}", "--num_prompts=5"],
     "--num_prompts and --prompts_file do not go together: --num_prompts shapes held-out "
     "prompts, --prompts_file gives its own; drop one"),
    ("infer/learn_then_test.py", ["--strategy=selfspec", "--consistency=risk"],
     "--consistency applies to --strategy calm only"),
    ("tools/convert.py", ["--hf_dir={workdir}", "--max_shard_gb=1"],
     "--max_shard_gb applies to an export (--to_hf) only"),
    ("tools/convert.py", ["--to_hf", "--hf_dir={tmp}/hf", "--tokenizer=bytes"],
     "--tokenizer applies to an import only"),
    ("tools/convert.py", ["--to_hf", "--hf_dir={tmp}/hf", "--max_shard_gb=0"],
     "--max_shard_gb=0 must be > 0"),
    ("tools/convert.py", ["--hf_dir={workdir}", "--workdir={prompts}"],
     "--workdir {prompts} is a file, not a directory"),
    ("infer/learn_then_test.py", ["--strategy=selfspec", "--grid=1,0.5"],
     "--grid='1,0.5': expected thresholds in [0, 1), descending from the safest"),
    ("infer/learn_then_test.py", ["--strategy=selfspec", "--tree=2,2"],
     "--tree: selfspec's eta is a chain's confidence stop, which a tree does not have; drop "
     "--tree"),
    ("infer/learn_then_test.py", ["--grid="],
     "--grid='': expected thresholds in [0, 1], descending from the safest"),
    ("infer/generate.py", ["--prompt=x", "--output={tmp}"], "--output {tmp} is a directory: "
     "give a file name"),
    ("tools/convert.py", ["--hf_dir={tmp}/nope", "--workdir={tmp}/w"],
     "'{tmp}/nope' does not exist: a Hugging Face checkpoint directory is expected"),
    ("train/train.py", ["--config=tiny_code", "--config.decoding.ngram_max=x",
                        "--workdir={tmp}/t"],
     "--config.decoding.ngram_max=x: expected a whole number"),
    ("train/train.py", ["--config=tiny_code", "--config.decoding.tree=abc",
                        "--workdir={tmp}/t"],
     "decoding.tree='abc' is not a tree: expected children per depth like 2,2,1,1, a parents "
     "list, a JSON file of parents, 'dynamic' or 'auto'"),
], ids=["draft-workdir-unused", "num-prompts-with-a-file", "consistency-with-selfspec",
        "shard-size-on-import", "tokenizer-on-export", "zero-shard-size", "import-into-a-file",
        "selfspec-grid-at-one", "selfspec-eta-for-a-tree", "empty-grid", "output-a-directory",
        "import-from-nowhere", "config-int-not-a-number", "config-tree-not-a-tree"])
def test_flags_the_run_would_ignore_are_one_line_errors(base_workdir, tmp_path, script, flags,
                                                       error):
    """The probes' silent ignores and cryptic lines: a flag the chosen mode or strategy does not
    read is named, before the work (or, for --draft_workdir, before decoding); the fourth
    probe's: calibrate's selfspec grid at eta 1 (failed after loading, naming draft_threshold)
    and an empty grid (the default was used silently), an output that is a folder blamed on
    the workdir inside it, a missing import folder said to lack config.json, config_flags'
    and Python's wordings ("invalid literal for int() with base 10"), and a bad tree stored
    by train.py, found only when decoding from its checkpoint."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    values = {"workdir": base_workdir, "prompts": prompts, "tmp": tmp_path}
    args = [flag.format(**values) for flag in flags]
    if not any(arg.startswith("--workdir") for arg in args):
        args.append(f"--workdir={base_workdir}")
    result = run_script(script, *args)
    assert result.returncode == 1 and result.stderr.strip() == f"error: {error.format(**values)}", \
        result.stderr[-2000:]


def test_the_skip_search_refuses_to_write_over_its_workdir(base_workdir):
    """Catches `skip_search.py --output_json W/metrics.jsonl` replacing the run's metrics (a
    second probe: the one writer that did not declare what it reads)."""
    metrics = os.path.join(base_workdir, "metrics.jsonl")
    with open(metrics, "w", encoding="utf-8") as f:
        f.write('{"step": 1}\n')
    try:
        result = run_script("infer/skip_search.py", "--workdir", base_workdir,
                            "--output_json", metrics)
        assert result.returncode == 1 and "would overwrite a file of" in result.stderr
        with open(metrics, encoding="utf-8") as f:
            assert f.read() == '{"step": 1}\n'
    finally:
        os.remove(metrics)


@pytest.mark.parametrize("thresholds", ["2", "-1", "1,0.5,1.5"])
def test_calm_bench_refuses_thresholds_outside_zero_one(base_workdir, thresholds):
    """Catches λ = 2 swept and plotted as if it were a threshold (generate refuses it)."""
    result = run_script("bench/calm_quality.py", "--workdir", base_workdir,
                        f"--thresholds={thresholds}")
    assert result.returncode == 1
    assert result.stderr.strip().endswith("each must lie in [0, 1]")


def test_compare_hf_settings_are_refused_before_timing(base_workdir, tmp_path):
    """Catches a bad transformers budget (`--hf_budget_s 0`, or one given without
    --compare_hf, which would be ignored) refused only after every strategy was timed (about
    9 s of work on the tiny model, minutes on a real one)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f("}\n')
    for args, message in ((["--compare_hf", "--hf_budget_s", "0"], "--hf_budget_s=0 must be > 0"),
                          (["--hf_budget_s", "60"], "give --compare_hf too")):
        result = run_script("bench/bench.py", "--workdir", base_workdir, "--strategies", "ar",
                            "--prompts_file", str(prompts), *args)
        assert result.returncode == 1 and "[bench]" not in result.stderr
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_import_into_its_own_checkpoint_folder_is_refused(hf_dir):
    """Catches `convert.py --hf_dir D --workdir D` writing checkpoints/ into the Hugging Face
    folder it reads (a second probe)."""
    before = sorted(os.listdir(hf_dir))
    result = run_script("tools/convert.py", "--hf_dir", hf_dir, "--workdir", hf_dir)
    assert result.returncode == 1 and "is --hf_dir" in result.stderr
    assert sorted(os.listdir(hf_dir)) == before


@pytest.fixture
def make_read_only():
    """Makes a folder unwritable: its mode where that binds (not for root), else the immutable
    attribute (the test is skipped where neither can be set); undone after the test."""
    made = []

    def make(folder):
        made.append(folder)
        folder.chmod(0o555)
        if os.access(folder, os.W_OK) and subprocess.run(
                ["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("cannot make a folder read-only here")
        return folder

    yield make
    for folder in made:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        folder.chmod(0o755)


def test_a_workdir_that_cannot_be_made_is_one_line(tmp_path, make_read_only):
    """Catches `train.py --workdir` under an unwritable folder (or a file) ending in a
    traceback from os.makedirs, after the corpus was read."""
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "read-only").mkdir()
    read_only = make_read_only(tmp_path / "read-only")
    for workdir, why in ((tmp_path / "notes.txt" / "run", "Not a directory"),
                         (read_only / "run", "")):
        result = run_script("train/train.py", "--config=tiny_code:smoke",
                            f"--workdir={workdir}")
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr[-2000:]
        assert result.stderr.startswith(f"error: cannot write --workdir {workdir}: {why}")


@pytest.mark.parametrize("script, flag, error", [
    ("bench/memory_check.py", "--steps=0", "--steps=0 must be >= 1"),
    ("bench/step_bench.py", "--steps=0", "--steps=0 must be >= 1"),
    ("bench/step_bench.py", "--peak_tflops=-3", "--peak_tflops=-3 must be > 0"),
    ("bench/feature_cache_bench.py", "--steps=0", "--steps=0 must be >= 1"),
], ids=["memory-check-no-steps", "step-bench-no-steps", "step-bench-negative-peak",
        "feature-cache-bench-no-steps"])
def test_step_counts_and_peaks_are_checked_before_compiling(script, flag, error):
    """Catches `memory_check.py --steps 0` ending in a ZeroDivisionError traceback, `step_bench
    --steps 0` failing on an empty median after compiling both programs (17 s), and
    `--peak_tflops -3` printing a negative utilisation."""
    result = run_script(script, "--config=tiny_code:smoke", flag)
    assert result.returncode == 1 and result.stderr.strip() == f"error: {error}", \
        result.stderr[-2000:]


def test_a_fractional_step_count_is_refused_before_training(tmp_path):
    """Catches `specjax.train(..., overrides={"train.total_steps": 25.5})` training and logging
    26 steps, never saving (no step equals 25.5), then raising: the work lost."""
    workdir = tmp_path / "w"
    with pytest.raises(ValueError, match=r"^train\.total_steps=25\.5 must be an int$"):
        specjax.train(tiny_run(), str(workdir), overrides={"train.total_steps": 25.5})
    assert not (workdir / "metrics.jsonl").exists()


@pytest.mark.parametrize("call, error", [
    (lambda m: m.generate("x", max_new_tokens="8"), "max_new_tokens='8' must be an int"),
    (lambda m: m.generate("x", seed="s"), "seed='s' must be an int"),
    (lambda m: m.generate("x", temperature="hot"), "temperature='hot' must be a number"),
    (lambda m: m.generate("x", temperature=1, top_k=1.5), "top_k=1.5 must be an int"),
    (lambda m: list(m.stream("x", max_new_tokens=2.0)), "max_new_tokens=2.0 must be an int"),
    (lambda m: m.generate("x", exit_layer=2.7), "exit_layer=2.7: expected an int"),
    (lambda m: m.generate("x", num_draft=2.5), "num_draft=2.5: expected an int"),
    (lambda m: m.benchmark(["x"]), "settings must map labels to option dicts, e.g. "
                                   "{'K=4': {'num_draft': 4}}; got list"),
    (lambda m: m.benchmark({"K=4": 4}), "settings must map .*; got int for 'K=4'"),
    (lambda m: m.benchmark({}, repeats="3"), "repeats='3' must be an int"),
    (lambda m: specjax.train(None, "w"),
     "config must be a shipped config or a config file .* not NoneType"),
    (lambda m: specjax.train({}, None), "workdir must be a path .* not NoneType"),
    (lambda m: specjax.load(None), "workdir must be a path .* not NoneType"),
    (lambda m: specjax.load(m.workdir, step="0"), "step='0' must be an int"),
    (lambda m: specjax.import_hf(5, "w"), "hf_dir must be a path .* not int"),
    (lambda m: m.generate("x", strategy=5),
     "strategy must be a name from strategies() or a Drafter, not int"),
    (lambda m: m.exit_report(["x" * 64], seq_len="32"), "seq_len='32' must be an int"),
    (lambda m: m.exit_report("x" * 64), "texts must be a list of documents, not one string"),
    (lambda m: m.exit_report(["x" * 64], seq_len=32, batch_size=0),
     "batch_size=0 must be >= 1"),
], ids=["tokens-text", "seed-text", "temperature-text", "top-k-fraction", "stream-tokens-fraction",
        "exit-fraction", "num-draft-fraction", "settings-list", "setting-not-a-dict",
        "repeats-text", "train-no-config", "train-no-workdir", "load-no-workdir", "step-text",
        "import-no-path", "strategy-int", "report-length-text", "report-texts-string",
         "report-batch-zero"])
def test_the_api_checks_its_arguments_types(base_workdir, call, error):
    """Catches the API passing wrong types to the machinery (JAX's "not a valid JAX array type",
    "'>' not supported between instances of 'str' and 'int'", "'list' object has no attribute
    'items'", "'NoneType' object is not iterable", "no checkpoint for step 0 ... (available:
    [0])") and silently truncating exit_layer=2.7 to 2 or num_draft=2.5 to 2 (decoding with
    another setting than asked), or reporting on a string's characters as documents: one line
    naming the argument, before any work. Catches exit_report's batch_size left unchecked
    (batch_size=0: "integer division or modulo by zero" from inside the report)."""
    model = specjax.load(base_workdir)
    with pytest.raises(ValueError, match=f"^{error}$" if ".*" in error else
                       f"^{re.escape(error)}$"):
        call(model)


def test_a_benchmark_prompt_string_is_one_prompt(base_workdir, monkeypatch):
    """Catches `benchmark(settings, prompts="def f(")` timing one prompt per character."""
    timed = []
    monkeypatch.setattr("specjax.api.run_benchmark",
                        lambda generator, strategies, prompts, **_: timed.append(prompts) or [])
    specjax.load(base_workdir).benchmark({}, prompts="def f(")
    assert [len(prompts) for prompts in timed] == [1]


def test_text_where_the_api_takes_a_number_still_parses_as_the_flag_would(base_workdir):
    """The command line's sweeps hand options over as text: num_draft="3" stays 3."""
    model = specjax.load(base_workdir)
    assert model.strategy("selfspec", num_draft="3").label() == \
        model.strategy("selfspec", num_draft=3).label()


@pytest.mark.parametrize("fields, error", [
    ({"files": "corpus.jsonl"}, "data.files is read only with data.source='files' (it is "
                                "'stdlib'): set data.source='files' too, or drop data.files"),
    ({"source": "files", "files": "a.jsonl", "hub_name": "x/y"},
     "data.hub_name is read only with data.source='hub' (it is 'files')"),
    ({"seq_len": 32.5}, "data.seq_len=32.5 must be an int"),
])
def test_data_settings_the_source_ignores_are_errors(fields, error):
    """Catches `--config.data.files=corpus.jsonl` without data.source=files training on the
    embedded corpus instead, silently."""
    with pytest.raises(ValueError, match=f"^{re.escape(error)}"):
        DataConfig.from_dict(fields)


def test_text_that_is_not_utf8_is_read_with_a_warning(tmp_path, caplog):
    """Catches bytes that are not UTF-8 replaced with U+FFFD without a word (the model learns
    replacement characters), and a warning per line rather than per file."""
    plain, rows = tmp_path / "latin1.txt", tmp_path / "rows.jsonl"
    plain.write_bytes("café\n".encode("latin-1"))
    rows.write_bytes(b'{"text": "ok"}\n' + b'{"text": "caf\xe9"}\n' * 3)
    with caplog.at_level("WARNING", logger="absl"):
        texts = [text for _, text in iter_documents(DataConfig(
            source="files", files=(str(plain), str(rows))))]
    assert texts == ["caf\ufffd\n", "ok"] + ["caf\ufffd"] * 3
    warnings = [r.getMessage() for r in caplog.records if "not UTF-8" in r.getMessage()]
    assert [w.split(" is not")[0] for w in warnings] == [str(plain), f"{rows}:2"]


def _tokenizer_json(ids: dict[str, int]) -> str:
    from tokenizers import Tokenizer, models

    return Tokenizer(models.BPE(vocab=ids, merges=[])).to_str()


@pytest.mark.parametrize("ids, error", [
    ({}, "its tokenizer has no tokens"),
    ({"a": 0, "b": 300}, "its tokenizer's ids run to 300, past the model's vocabulary of 259"),
    ({"a": 0, "b": 1}, "bos_id=256 is not an id of the tokenizer of"),
], ids=["empty", "another-models", "specials-outside"])
def test_a_tokenizer_the_model_cannot_use_is_refused_at_import(hf_dir, tmp_path, ids, error):
    """Catches a broken tokenizer.json (no tokens, ids past the model's vocabulary, or special
    ids it lacks) imported without a word, the failure coming at the first prompt, or after
    the workdir was made."""
    with open(os.path.join(hf_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(_tokenizer_json(ids))
    with pytest.raises(ValueError, match=re.escape(error)):
        import_checkpoint(hf_dir, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("source, error", [
    ("this is not python\n", "running it raised NameError: name 'this' is not defined"),
    ("model: {\n", "not a Python config file ('{' was never closed at line 1)"),
    ("x = 1\n", "defines no get_config() returning the config"),
    ("def get_config():\n    return 5\n",
     "get_config() returned int, not a config (an ml_collections.ConfigDict or a dict of "
     "sections)"),
], ids=["not-python", "syntax-error", "no-get-config", "returns-an-int"])
def test_a_config_file_that_is_no_config_is_named(tmp_path, source, error):
    """Catches config_flags' wordings ("module 'config_config' has no attribute
    'get_config'", "int' object has no attribute 'keys") and the API's raw AttributeError for
    a config file that is not Python, has no get_config() or returns something else."""
    path = tmp_path / "config.py"
    path.write_text(source)
    result = run_script("train/train.py", f"--config={path}", f"--workdir={tmp_path / 'w'}")
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: --config {path}: {error}", result.stderr[-2000:]
    with pytest.raises(ValueError, match=f"^config file {re.escape(f'{path}: {error}')}$"):
        specjax.train(str(path), str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def test_a_bool_where_an_int_is_due_is_refused(base_workdir, tmp_path):
    """`max_new_tokens=True` to the API and `train.total_steps=True` as a train override are
    one-line "must be an int" errors, before any work (True is a bool, not a count). Catches
    a bool taken as the int 1 (one token generated, one step trained, without a word)."""
    model = specjax.load(base_workdir)
    with pytest.raises(ValueError, match=r"^max_new_tokens=True must be an int$"):
        model.generate("x", max_new_tokens=True)
    with pytest.raises(ValueError, match=r"^seed=False must be an int$"):
        model.generate("x", seed=False)
    workdir = tmp_path / "w"
    with pytest.raises(ValueError, match=r"^train\.total_steps=True must be an int$"):
        specjax.train(tiny_run(), str(workdir), overrides={"train.total_steps": True})
    assert not (workdir / "metrics.jsonl").exists()


def test_text_in_a_float_setting_is_refused_as_not_a_number():
    """`data.val_fraction="0.1"` (text where a float is due) is the one-line "must be a
    number", as text in an int field is "must be an int". Catches the check run over int
    fields only: the float field's text reached the range check's `0.0 < "0.1"` (a
    TypeError)."""
    with pytest.raises(ValueError, match=r"^data\.val_fraction='0\.1' must be a number$"):
        DataConfig.from_dict({"val_fraction": "0.1"})
    assert DataConfig.from_dict({"val_fraction": 0.1}).val_fraction == 0.1  # a number is one


def test_a_config_file_whose_get_config_is_not_a_function_is_named(tmp_path):
    """A config file whose `get_config` is 5 (not callable) is the one-line "defines no
    get_config() returning the config", nothing written. Catches the check asking only that
    the name exist: the call then failed as "get_config() raised TypeError: 'int' object is
    not callable"."""
    path = tmp_path / "config.py"
    path.write_text("get_config = 5\n")
    error = f"config file {path}: defines no get_config() returning the config"
    with pytest.raises(ValueError, match=f"^{re.escape(error)}$"):
        specjax.train(str(path), str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def test_stream_checks_its_seeds_type_as_generate_does(base_workdir):
    """`stream("x", seed="s")` is generate's one-line "seed='s' must be an int", before any
    decoding. Catches stream dropping the check: the text reached JAX, a traceback ending in
    "Value 's' with dtype <U1 is not a valid JAX array type"."""
    model = specjax.load(base_workdir)
    with pytest.raises(ValueError, match=r"^seed='s' must be an int$"):
        model.generate("x", seed="s")
    with pytest.raises(ValueError, match=r"^seed='s' must be an int$"):
        list(model.stream("x", seed="s"))
    with pytest.raises(ValueError, match=r"^seed=1\.5 must be an int$"):
        list(model.stream("x", seed=1.5, temperature=1.0, max_new_tokens=2))


def test_an_output_link_stays_a_link_and_a_replaced_file_keeps_its_mode(tmp_path):
    """Catches an output that is a symbolic link replaced by a regular file or folder (what it
    pointed to left stale), and a replaced file's mode reset to the umask's (0600 became
    0644)."""
    target, link = tmp_path / "results.json", tmp_path / "latest.json"
    target.write_text("old")
    target.chmod(0o600)
    os.symlink(target, link)
    with staged(str(link)) as partial, open(partial, "w", encoding="utf-8") as f:
        f.write("new")
    assert os.path.islink(link) and os.readlink(link) == str(target)
    assert target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path)) == ["latest.json", "results.json"]
    folder, folder_link = tmp_path / "export", tmp_path / "export-link"
    folder.mkdir()
    os.symlink(folder, folder_link)
    with staged_dir(str(folder_link)) as staging:
        open(os.path.join(staging, "config.json"), "w").close()
    assert os.path.islink(folder_link) and os.listdir(folder) == ["config.json"]


def test_a_plot_format_matplotlib_cannot_write_is_refused_first(tmp_path):
    """Catches `calm_quality.py --plot x.docx` refused (or written as PNG bytes) only after the
    whole sweep: the extension is checked before the model is loaded."""
    result = run_script("bench/calm_quality.py", f"--workdir={tmp_path / 'none'}",
                        f"--plot={tmp_path / 'x.docx'}")
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: --plot {tmp_path / 'x.docx'}: matplotlib writes no "
                                    ".docx images; use one of "), result.stderr[-2000:]


def test_an_export_overwrites_only_a_hugging_face_folder(base_workdir, hf_dir, tmp_path):
    """Catches `convert.py --to_hf --overwrite` deleting the files of a folder that is not a
    Hugging Face checkpoint (notes, another project); an earlier export is still replaced."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ConversionError, match="holds no config.json, so it is no Hugging Face "
                                              "checkpoint: --overwrite would delete"):
        export_checkpoint(base_workdir, str(folder), overwrite=True)
    assert os.listdir(folder) == ["notes.txt"]
    (tmp_path / "hf" / "stale.bin").write_bytes(b"x")
    export_checkpoint(base_workdir, hf_dir, overwrite=True)
    assert "stale.bin" not in os.listdir(hf_dir)


def test_calibrate_finds_an_unwritable_workdir_before_the_sweep(base_workdir, tmp_path,
                                                               make_read_only):
    """Catches `learn_then_test.py` sweeping its whole grid (22 s) before finding that it cannot
    write the workdir's calibrated_decoding.json."""
    workdir = tmp_path / "model"
    shutil.copytree(base_workdir, workdir)
    make_read_only(workdir)
    result = run_script("infer/learn_then_test.py", f"--workdir={workdir}", "--strategy=selfspec")
    assert result.returncode == 1 and "calibrating" not in result.stdout
    assert result.stderr.startswith(f"error: cannot write the calibrated defaults into "
                                    f"--workdir {workdir} (--nowrite only reports them): "), \
        result.stderr[-2000:]


@pytest.mark.parametrize("script", ["bench/calm_quality.py", "infer/learn_then_test.py"])
def test_a_missing_calm_classifier_is_refused_before_the_prompts(tmp_path, script):
    """Catches `--calm_measure classifier` on a model without one refused only after its
    prompts and references were made (16 s on the default model): here, where the workdir's
    data is missing, the data's error came first."""
    workdir = str(tmp_path / "model")
    cfg = ModelConfig(**TINY_MODEL)
    Checkpointer(workdir).save(0, init_params(cfg, jax.random.PRNGKey(0)), None, {
        "step": 0, "data_position": 0, "model": cfg.to_dict(), "tokenizer": "bytes",
        "config": {"data": {"source": "files", "files": [str(tmp_path / "gone.jsonl")]}}})
    result = run_script(script, f"--workdir={workdir}", "--calm_measure=classifier",
                        "--nowrite" if script.endswith("learn_then_test.py") else "--repeats=1")
    assert result.returncode == 1
    assert result.stderr.startswith("error: strategy 'calm' needs weights of its own"), \
        result.stderr[-2000:]


def test_a_bad_calibrated_value_names_its_file(base_workdir, tmp_path):
    """Catches an edited calibrated_decoding.json failing as "decoding.num_draft='x' must be
    an int", which names no file (the checkpoint's own section looks to blame)."""
    workdir = tmp_path / "model"
    shutil.copytree(base_workdir, workdir)
    path = workdir / "calibrated_decoding.json"
    path.write_text('{"step": 0, "decoding": {"num_draft": "x"}}')
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: decoding.num_draft='x' must "
                                         "be an int; calibrate again or delete it$"):
        load_model(str(workdir))
