"""Continual training of an existing model (`init.source`), and what real sizes need: gradient
accumulation, bf16 compute on an fp32 master copy, frozen groups, the memory estimate."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.config import ModelConfig
from specjax.convert.hf import export_checkpoint
from specjax.data import BatchSampler, Corpus
from specjax.io.checkpoint import Checkpointer, CheckpointError, load_params
from specjax.model import init_params
from specjax.tokenizer import get_tokenizer
from specjax.training.config import parse_run_config
from specjax.training.init_source import resolve_init
from specjax.training.optimizer import make_optimizer
from specjax.training.train_step import StepSchedule, init_train_state, make_train_step
from specjax.training.trainer import Trainer
from tests.support import ROOT
from tests.support.models import TINY_MODEL, tiny_run
from tests.support.scripts import run_script
from tests.training.test_token_cache import write_bpe_tokenizer

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

SOURCE_MODEL = dict(TINY_MODEL, vocab_size=320)  # room for the BPE tokenizer's ids


HYBRID = dict(layer_pattern=("mamba2", "attention", "mamba2", "attention"),
              partial_rotary_factor=0.5,
              ssm=dict(num_heads=4, head_dim=8, state_size=8, groups=1, chunk_size=8))


def _weights_only_workdir(workdir, cfg, tokenizer):
    checkpoints = Checkpointer(workdir)
    checkpoints.save(0, init_params(cfg, jax.random.PRNGKey(7)), None, {
        "step": 0, "data_position": 0, "model": cfg.to_dict(), "tokenizer": tokenizer.spec()})
    checkpoints.close()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Weights-only workdirs (as an import leaves them) with a BPE tokenizer, an attention
    model and a Mamba-2/attention hybrid, and their Hugging Face exports (Llama, Bamba)."""
    root = tmp_path_factory.mktemp("sources")
    found = {}
    for name, model in (("", SOURCE_MODEL), ("hybrid_", {**SOURCE_MODEL, **HYBRID})):
        workdir = str(root / f"{name}imported")
        tokenizer = write_bpe_tokenizer(workdir, vocab_size=300)
        _weights_only_workdir(workdir, ModelConfig.from_dict(model), tokenizer)
        export_checkpoint(workdir, str(root / f"{name}hf"))
        found.update({f"{name}workdir": workdir, f"{name}hf": str(root / f"{name}hf")})
    return found


def _run(source, **sections):
    return tiny_run(init={"source": source}, **{"train": dict(total_steps=6, eval_every=6,
                                                               save_every=6), **sections})


@pytest.mark.parametrize("kind", ["hf", "workdir", "hybrid_hf", "hybrid_workdir"])
def test_step_zero_weights_are_the_sources(sources, kind, tmp_path):
    """Catches a run on a source that re-initialises the weights (or loads another model), and
    one that keeps the file's byte tokenizer instead of the source's; attention and hybrid
    models, from Hugging Face (Llama, Bamba) and from workdirs."""
    trainer = Trainer(_run(sources[kind]), str(tmp_path / "run"))
    expected, cfg, _ = load_params(sources[kind.replace("hf", "workdir")])
    state = trainer.fresh_state()
    assert int(state.step) == 0
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(got, want)
    assert trainer.run.model == cfg and trainer.tokenizer.vocab_size == 300
    assert trainer.corpus.train.max() >= 259  # BPE ids, not bytes


@pytest.mark.parametrize("kind", ["hf", "workdir"])
def test_step_zero_weights_are_the_sources_in_the_master_dtype(sources, kind, tmp_path):
    """With model.dtype=bfloat16 and model.param_dtype=float32 set on an fp32 source, the
    step-0 params are float32 and equal the source's bit for bit. Catches the source's weights
    loaded in the compute dtype instead of the weight dtype (rounded to bf16, then widened):
    the fp32 test above cannot tell the two apart."""
    trainer = Trainer(_run(sources[kind], model=dict(SOURCE_MODEL, dtype="bfloat16",
                                                     param_dtype="float32")),
                      str(tmp_path / "run"), ("model.dtype", "model.param_dtype"))
    assert (trainer.run.model.dtype, trainer.run.model.param_dtype) == ("bfloat16", "float32")
    expected, _, _ = load_params(sources["workdir"])
    state = trainer.fresh_state()
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected), strict=True):
        assert got.dtype == want.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_source_run_resumes_exactly_without_the_source(sources, tmp_path):
    """Catches a resume that starts from the source again (or reads it at all: it was moved
    away), and a workdir that cannot decode without the source's tokenizer file."""
    source = str(tmp_path / "source")
    shutil.copytree(sources["workdir"], source)
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    Trainer(_run(source), straight).fit()
    assert Trainer(_run(source), resumed).fit(stop_requested=lambda step: step == 3).interrupted
    shutil.move(source, str(tmp_path / "moved"))
    Trainer(_run(source), resumed).fit()
    a, _, meta = load_params(straight)
    b, _, _ = load_params(resumed)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert meta["init"]["source"] == os.path.abspath(source)
    tokenizer = get_tokenizer(meta["tokenizer"], straight)  # the workdir's own copy
    assert tokenizer.decode(tokenizer.encode("def f(x):")) == "def f(x):"


def test_a_run_started_from_a_relative_source_resumes_by_either_path(sources, tmp_path,
                                                                      monkeypatch):
    """A run started from `init.source` given relative to the working directory records the
    source's absolute path, and resumes (the checkpoint's model, no source read again) given
    the same relative path, or the absolute one; another source is refused. Catches the
    recorded path compared with the source as given rather than its absolute path (every
    resume of a run started from a relative path refused as "started from" another source)."""
    shutil.copytree(sources["workdir"], str(tmp_path / "source"))
    monkeypatch.chdir(tmp_path)
    workdir = str(tmp_path / "run")
    run = _run("source", train=dict(total_steps=2, warmup_steps=1, eval_every=2, save_every=2))
    assert Trainer(run, workdir).fit(stop_requested=lambda step: step == 1).interrupted
    assert not Trainer(run, workdir).fit().interrupted  # resumed from the relative path
    meta = Checkpointer(workdir, create=False).read_meta()
    assert meta["step"] == 2 and meta["init"]["source"] == str(tmp_path / "source")
    for given in ("source", str(tmp_path / "source"), "./source"):
        resolved, source = resolve_init(_run(given), (), workdir)
        assert source is None and resolved["model"] == meta["model"], given
    with pytest.raises(CheckpointError, match="continues a run started from .* not from"):
        resolve_init(_run(sources["workdir"]), (), workdir)


def test_the_source_fixes_the_model_and_the_exits_it_lacks_are_dropped(sources, tmp_path):
    """Catches a file's model section winning over the source, an explicit flag that
    contradicts the source passing silently, and supervised exits past the source's depth."""
    file_model = dict(TINY_MODEL, num_layers=8, exit_layers=(1, 2, 8), d_model=64)
    config = {**_run(sources["hf"]), "model": file_model}
    resolved, source = resolve_init(config, (), str(tmp_path / "w"))
    assert resolved["model"]["num_layers"] == 4 and resolved["model"]["d_model"] == 32
    assert resolved["model"]["exit_layers"] == [1, 2, 4] and source.kind == "hf"
    chosen = {**config, "model": {**file_model, "dtype": "bfloat16", "exit_layers": (1, 4)}}
    resolved, _ = resolve_init(chosen, ("model.dtype", "model.exit_layers"), "unused")
    assert resolved["model"]["dtype"] == "bfloat16" and resolved["model"]["exit_layers"] == [1, 4]
    with pytest.raises(ValueError, match="model.num_layers=8 contradicts init.source"):
        resolve_init(config, ("model.num_layers",), "unused")
    agreeing = {**config, "model": {**file_model, "num_layers": 4}}
    resolve_init(agreeing, ("model.num_layers",), "unused")  # the same value is no contradiction


def test_bad_sources_and_data_are_one_line_errors_with_nothing_written(sources, tmp_path):
    """Catches each bad input reaching a traceback or leaving a half-made workdir behind."""
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    shutil.copy(os.path.join(sources["hf"], "config.json"), weightless / "config.json")
    text = tmp_path / "notes.txt"
    text.write_text("not a tokenizer")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    small = tmp_path / "small"  # a source whose vocabulary the tokenizer exceeds
    cfg = ModelConfig(**TINY_MODEL)
    Checkpointer(str(small)).save(0, init_params(cfg, jax.random.PRNGKey(0)), None, {
        "step": 0, "data_position": 0, "model": cfg.to_dict(),
        "tokenizer": {"kind": "hf", "file": "../imported/tokenizer.json", "bos_id": 0,
                      "eos_id": 1}})
    os.makedirs(tmp_path / "imported", exist_ok=True)
    shutil.copy(os.path.join(sources["workdir"], "tokenizer.json"), tmp_path / "imported")
    cases = [
        (_run(str(tmp_path / "missing")), (), "does not exist"),
        (_run(str(weightless)), (), "no \\*.safetensors weights"),
        (_run(str(small)), (), "has 300 ids, more than the model's vocabulary of 259"),
        (_run(sources["hf"], data=dict(tokenizer=str(text))), ("data.tokenizer",),
         "is not a Hugging Face tokenizer.json"),
        (_run(sources["hf"], data=dict(source="files", files=(str(empty),))), (), "is empty"),
    ]
    for number, (config, explicit, message) in enumerate(cases):
        workdir = tmp_path / f"run{number}"
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            Trainer(config, str(workdir), explicit)
        assert not workdir.exists(), message


def test_a_contradicting_flag_is_one_line_from_the_command_line(sources, tmp_path):
    """Catches train.py passing no explicit overrides (the contradiction would go unnoticed)."""
    workdir = tmp_path / "run"
    result = run_script("train/train.py", "--config", os.path.join(ROOT, "tests", "configs",
                                                                    "tiny.py"),
                        "--workdir", str(workdir), f"--config.init.source={sources['hf']}",
                        "--config.model.d_model=64")
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: --config.model.d_model=64 contradicts init.source, whose model has d_model=32; "
        "the source fixes the model (a run may set only dtype, param_dtype, exit_layers, "
        "mtp_depth)"]
    assert not workdir.exists()


def _steps(cfg, run, steps, **options):
    """Losses and final params of `steps` train steps from one initialisation, same batches."""
    optimizer = make_optimizer(run.train)
    state = init_train_state(cfg, optimizer, jax.random.PRNGKey(0))
    step_fn = jax.jit(make_train_step(cfg, optimizer, **options))
    sampler = BatchSampler(Corpus.build(run.data).train, 8, seed=0)
    schedule = StepSchedule(drop_rates=jnp.full((4,), 0.2), exit_layers=jnp.array([1, 2, 4]),
                            exit_weights=jnp.array([0.25, 0.25, 0.5]))
    losses = []
    for step in range(steps):
        state, metrics = step_fn(state, sampler.batch(8 * step), jax.random.PRNGKey(step),
                                 schedule)
        losses.append((float(metrics["loss"]), float(metrics["grad_norm"])))
    return np.asarray(losses), state.params


def test_accumulating_micro_batches_equals_one_batch_in_fp32(tiny_cfg):
    """Catches micro-batches that sum instead of averaging (Adam would hide it in the weights:
    the gradient norm shows it), draw their own layer-dropout masks, or drop a micro-batch."""
    run = parse_run_config(tiny_run())
    whole, params_whole = _steps(tiny_cfg, run, 3)
    micro, params_micro = _steps(tiny_cfg, run, 3, grad_accum=4)
    np.testing.assert_allclose(micro, whole, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(params_micro), jax.tree.leaves(params_whole), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-6)


def test_bf16_compute_on_an_fp32_master_stays_within_half_a_percent_of_fp32(tiny_cfg):
    """Measured: 0.07% at most over 40 steps with bf16 compute on fp32 weights, 1.7% with
    bf16 weights too. Catches a master copy kept in bf16 (updates rounded away)."""
    run = parse_run_config(tiny_run())
    fp32, _ = _steps(tiny_cfg, run, 40)
    mixed, params = _steps(ModelConfig(**TINY_MODEL, dtype="bfloat16"), run, 40)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    assert np.max(np.abs(mixed[:, 0] - fp32[:, 0]) / fp32[:, 0]) < 0.005


def test_frozen_groups_never_change_and_hold_no_optimizer_state(tmp_path):
    """Catches frozen parameters that still move (weight decay included) or still carry Adam
    moments (their memory is the point of freezing)."""
    trainer = Trainer(tiny_run(train=dict(total_steps=3, eval_every=3, save_every=3,
                                          frozen="embed,final_norm")), str(tmp_path))
    before = trainer.fresh_state()
    trainer.fit()
    after, _, _ = load_params(str(tmp_path))
    np.testing.assert_array_equal(after["embed"], before.params["embed"])
    np.testing.assert_array_equal(after["final_norm"]["scale"],
                                  before.params["final_norm"]["scale"])
    assert not np.array_equal(after["layers"]["attn"]["qkv"],
                              before.params["layers"]["attn"]["qkv"])
    moments = sum(leaf.size for leaf in jax.tree.leaves(before.opt_state))
    trained = sum(leaf.size for leaf in jax.tree.leaves(before.params["layers"]))
    assert moments <= 2 * trained + 8  # mu and nu of the trained weights, a few counters


def test_the_memory_estimate_counts_the_state_exactly(tmp_path):
    """Catches an estimate that misses the optimizer state or XLA's temporaries."""
    trainer = Trainer(tiny_run(train=dict(total_steps=1, warmup_steps=0, eval_every=1,
                                          save_every=1)),
                      str(tmp_path))
    trainer.fit()
    memory = trainer.objective.memory
    state = trainer.fresh_state()
    params = sum(x.nbytes for x in jax.tree.leaves(state.params))
    assert memory.params == params and memory.optimizer >= 2 * params
    assert memory.arguments >= memory.params + memory.optimizer
    assert memory.peak == memory.arguments + memory.outputs + memory.temporaries
    assert "peak about" in memory.line()


def test_memory_check_prints_the_estimate(tmp_path):
    """Catches the memory check's command failing (on a CPU it prints the estimate alone: the
    CPU reports no peak) or writing no record."""
    out = tmp_path / "memory.json"
    result = run_script("bench/memory_check.py", "--config",
                        os.path.join(ROOT, "tests", "configs", "tiny.py"), "--steps=1",
                        "--config.train.grad_accum=2", f"--output_json={out}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "memory per device (estimate)" in result.stdout
    record = json.loads(out.read_text())
    assert record["grad_accum"] == 2 and record["estimate"]["peak"] > 0


def test_metrics_log_each_supervised_exits_loss(tmp_path):
    """Catches per-exit training losses computed and dropped (only their weighted sum was
    logged), and the curriculum's zero-weight padding logged as an exit."""
    from specjax.training.metrics_log import MetricsLog

    Trainer(tiny_run(train=dict(total_steps=4, log_every=1, eval_every=4, save_every=4)),
            str(tmp_path)).fit()
    records = [r for r in MetricsLog(str(tmp_path)).read() if r["split"] == "train"]
    # rotational curriculum, interval 2: exits 1 and 3 on even steps, 2 on odd ones; 4 always
    assert [sorted(r["exit_ce"]) for r in records] == [["1", "3", "4"], ["2", "4"]] * 2
    assert all(r["exit_ce"]["4"] == r["final_ce"] for r in records)
