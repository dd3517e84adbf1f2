"""Bad inputs that used to end in a traceback are one-line errors naming the file or value, and
leave nothing half-made behind."""

import dataclasses
import json
import os
import re

import jax
import pytest

import specjax
from specjax.config import ModelConfig
from specjax.convert.hf import export_checkpoint, import_checkpoint
from specjax.convert.hf_config import ConversionError
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.errors import SpecjaxError
from specjax.io.checkpoint import Checkpointer
from specjax.loading import load_model
from specjax.model import init_params
from specjax.training.trainer import Trainer
from tests.conftest import TINY_MODEL, run_script, tiny_run


@pytest.fixture(scope="module")
def model_workdir(tmp_path_factory):
    """A weights-only workdir of the tiny model (byte tokenizer)."""
    workdir = str(tmp_path_factory.mktemp("model"))
    cfg = ModelConfig(**TINY_MODEL)
    Checkpointer(workdir).save(0, init_params(cfg, jax.random.PRNGKey(0)), None, {
        "step": 0, "data_position": 0, "model": cfg.to_dict(), "tokenizer": "bytes"})
    return workdir


@pytest.fixture
def hf_dir(model_workdir, tmp_path):
    path = str(tmp_path / "hf")
    export_checkpoint(model_workdir, path)
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
    with pytest.raises(ConversionError, match=f"{path} is not valid JSON"):
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


@pytest.mark.parametrize("prompts, kind", [(b"def f(", "bytes"), ([1, 2, 3], "list holding a int"),
                                           ([], "list"), (["ok", 5], "list holding a int")])
def test_the_api_names_a_prompt_that_is_not_text(model_workdir, prompts, kind):
    """Catches bytes or token ids reaching the tokenizer (an AttributeError from inside it),
    and a list with one wrong element reported by its first (a second probe's "not list of
    str")."""
    model = specjax.load(model_workdir)
    with pytest.raises(ValueError, match=f"a non-empty list of strings, not {kind}"):
        model.generate(prompts)


@pytest.mark.parametrize("flag", ["--delta=0", "--delta=1.5", "--epsilon=0"])
def test_calibration_levels_are_checked_before_the_sweep(model_workdir, flag):
    """Catches `calibrate.py --delta 0` failing only after the whole sweep (80 prompts x 21
    values by default): the error must come before the model is even loaded."""
    result = run_script("infer/calibrate.py", "--workdir=/nonexistent", flag)
    assert result.returncode == 1
    name, value = flag[2:].split("=")
    assert result.stderr.strip() == f"error: --{name}={float(value):g} must lie in (0, 1)"


def test_a_prompt_longer_than_the_trained_sequences_is_warned_about(model_workdir, caplog):
    """Catches a 3.7 kB prompt on a model trained on 256-token sequences decoding silently
    (its output degrades to spaces): the warning gives both lengths."""
    loaded = load_model(model_workdir)
    model = dataclasses.replace(loaded, meta={**loaded.meta,
                                              "config": {"data": {"seq_len": 256}}})
    with caplog.at_level("WARNING", logger="absl"):
        model.warn_long_prompts([12, 3700])
        model.warn_long_prompts([256])
    lines = [r.getMessage() for r in caplog.records if "longer than" in r.getMessage()]
    assert lines == [f"a prompt of 3700 tokens is longer than the 256-token sequences the "
                     f"model in {model_workdir} was trained on: expect degraded output"]


def test_a_head_on_a_base_without_a_tokenizer_is_one_line(tmp_path):
    """Catches a head's config on a base imported without a tokenizer failing with a TypeError
    (there are no tokenizer fields to read) instead of saying what is missing."""
    from specjax.training.frozen_base import config_on_base, load_base

    cfg = ModelConfig(**TINY_MODEL)
    Checkpointer(str(tmp_path)).save(0, init_params(cfg, jax.random.PRNGKey(0)), None, {
        "step": 0, "data_position": 0, "model": cfg.to_dict(), "tokenizer": None})
    with pytest.raises(ValueError, match="names no tokenizer"):
        config_on_base({"kangaroo": {}}, load_base(str(tmp_path)))


@pytest.mark.parametrize("strategy, options, unused", [
    ("calm", {"tree": "2,2"}, "tree"),
    ("selfspec", {"skip_layers": "1"}, "skip_layers"),
    ("selfspec", {"tree": "dynamic", "num_draft": 3}, "num_draft"),
    ("ar", {"exit_layer": 2}, "exit_layer"),
], ids=["tree-with-calm", "skip-layers-with-selfspec", "num-draft-with-a-dynamic-tree",
        "exit-with-ar"])
def test_an_option_the_strategy_does_not_read_is_an_error(model_workdir, strategy, options,
                                                          unused):
    """Catches an option silently ignored by the chosen strategy (the user believes they
    measured or decoded something they did not), and the error naming it as a command-line
    flag (a third probe: "--exit_layer" to a Python caller); options it reads still work."""
    model = specjax.load(model_workdir)
    with pytest.raises(ValueError, match=f"^{unused} is not used by strategy {strategy} "):
        model.generate("x", strategy=strategy, max_new_tokens=2, **options)
    used = {k: v for k, v in options.items() if k != unused}
    assert model.generate("x", strategy=strategy, max_new_tokens=2, **used).prompt == "x"


def test_unused_and_empty_decoding_flags_are_one_line_errors(model_workdir):
    """The command line's path: catches `--tree ''` quietly decoding with another tree (it means
    nothing: 'chain' is a chain), and a flag the strategy ignores reaching the decode."""
    for flags, error in [(["--tree="], "error: --tree is empty: give 'chain' for a chain"),
                         (["--strategy=calm", "--tree=2,2"],
                          "error: --tree is not used by strategy calm")]:
        result = run_script("infer/generate.py", f"--workdir={model_workdir}", "--prompt=x",
                            *flags)
        assert result.returncode == 1 and result.stderr.strip().startswith(error), result.stderr


@pytest.mark.parametrize("script, flags, error", [
    ("infer/generate.py", ["--prompt=x", "--draft_workdir={workdir}"],
     "--draft_workdir: the chosen strategies draft without weights of their own (kangaroo, "
     "specdec, draft and calm's classifier use them)"),
    ("infer/bench.py", ["--prompts_file={prompts}", "--num_prompts=5"],
     "--num_prompts and --prompts_file do not go together: --num_prompts shapes held-out "
     "prompts, --prompts_file gives its own; drop one"),
    ("infer/calibrate.py", ["--strategy=selfspec", "--consistency=risk"],
     "--consistency applies to --strategy calm only"),
    ("infer/convert.py", ["--hf_dir={workdir}", "--max_shard_gb=1"],
     "--max_shard_gb applies to an export (--to_hf) only"),
    ("infer/convert.py", ["--to_hf", "--hf_dir={tmp}/hf", "--tokenizer=bytes"],
     "--tokenizer applies to an import only"),
    ("infer/convert.py", ["--to_hf", "--hf_dir={tmp}/hf", "--max_shard_gb=0"],
     "--max_shard_gb=0 must be > 0"),
    ("infer/convert.py", ["--hf_dir={workdir}", "--workdir={prompts}"],
     "--workdir {prompts} is a file, not a directory"),
    ("infer/calibrate.py", ["--strategy=selfspec", "--grid=1,0.5"],
     "--grid='1,0.5': expected thresholds in [0, 1), descending from the safest"),
    ("infer/calibrate.py", ["--strategy=selfspec", "--tree=2,2"],
     "--tree: selfspec's eta is a chain's confidence stop, which a tree does not have; drop "
     "--tree"),
    ("infer/calibrate.py", ["--grid="],
     "--grid='': expected thresholds in [0, 1], descending from the safest"),
    ("infer/generate.py", ["--prompt=x", "--output={tmp}"], "--output {tmp} is a directory: "
     "give a file name"),
    ("infer/convert.py", ["--hf_dir={tmp}/nope", "--workdir={tmp}/w"],
     "'{tmp}/nope' does not exist: a Hugging Face checkpoint directory is expected"),
    ("train/train.py", ["--config=configs/tiny_code.py", "--config.decoding.ngram_max=x",
                        "--workdir={tmp}/t"],
     "--config.decoding.ngram_max=x: expected a whole number"),
    ("train/train.py", ["--config=configs/tiny_code.py", "--config.decoding.tree=abc",
                        "--workdir={tmp}/t"],
     "decoding.tree='abc' is not a tree: expected children per depth like 2,2,1,1, a parents "
     "list, a JSON file of parents, 'dynamic' or 'auto'"),
], ids=["draft-workdir-unused", "num-prompts-with-a-file", "consistency-with-selfspec",
        "shard-size-on-import", "tokenizer-on-export", "zero-shard-size", "import-into-a-file",
        "selfspec-grid-at-one", "selfspec-eta-for-a-tree", "empty-grid", "output-a-directory",
        "import-from-nowhere", "config-int-not-a-number", "config-tree-not-a-tree"])
def test_flags_the_run_would_ignore_are_one_line_errors(model_workdir, tmp_path, script, flags,
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
    values = {"workdir": model_workdir, "prompts": prompts, "tmp": tmp_path}
    args = [flag.format(**values) for flag in flags]
    if not any(arg.startswith("--workdir") for arg in args):
        args.append(f"--workdir={model_workdir}")
    result = run_script(script, *args)
    assert result.returncode == 1 and result.stderr.strip() == f"error: {error.format(**values)}", \
        result.stderr[-2000:]


def test_the_skip_search_refuses_to_write_over_its_workdir(model_workdir):
    """Catches `search_skip.py --output_json W/metrics.jsonl` replacing the run's metrics (a
    second probe: the one writer that did not declare what it reads)."""
    metrics = os.path.join(model_workdir, "metrics.jsonl")
    with open(metrics, "w", encoding="utf-8") as f:
        f.write('{"step": 1}\n')
    try:
        result = run_script("infer/search_skip.py", "--workdir", model_workdir,
                            "--output_json", metrics)
        assert result.returncode == 1 and "would overwrite a file of" in result.stderr
        with open(metrics, encoding="utf-8") as f:
            assert f.read() == '{"step": 1}\n'
    finally:
        os.remove(metrics)


@pytest.mark.parametrize("thresholds", ["2", "-1", "1,0.5,1.5"])
def test_calm_bench_refuses_thresholds_outside_zero_one(model_workdir, thresholds):
    """Catches λ = 2 swept and plotted as if it were a threshold (generate refuses it)."""
    result = run_script("infer/calm_bench.py", "--workdir", model_workdir,
                        f"--thresholds={thresholds}")
    assert result.returncode == 1
    assert result.stderr.strip().endswith("each must lie in [0, 1]")


def test_compare_hf_settings_are_refused_before_timing(model_workdir, tmp_path):
    """Catches a bad transformers budget (`--hf_budget_s 0`, or one given without
    --compare_hf, which would be ignored) refused only after every strategy was timed (about
    9 s of work on the tiny model, minutes on a real one)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f("}\n')
    for args, message in ((["--compare_hf", "--hf_budget_s", "0"], "--hf_budget_s=0 must be > 0"),
                          (["--hf_budget_s", "60"], "give --compare_hf too")):
        result = run_script("infer/bench.py", "--workdir", model_workdir, "--strategies", "ar",
                            "--prompts_file", str(prompts), *args)
        assert result.returncode == 1 and "[bench]" not in result.stderr
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_import_into_its_own_checkpoint_folder_is_refused(hf_dir):
    """Catches `convert.py --hf_dir D --workdir D` writing checkpoints/ into the Hugging Face
    folder it reads (a second probe)."""
    before = sorted(os.listdir(hf_dir))
    result = run_script("infer/convert.py", "--hf_dir", hf_dir, "--workdir", hf_dir)
    assert result.returncode == 1 and "is --hf_dir" in result.stderr
    assert sorted(os.listdir(hf_dir)) == before
