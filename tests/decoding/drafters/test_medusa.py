"""Medusa heads (strategy `medusa`): the heads' math and training labels against direct
computations, greedy output against a per-step argmax of `model.forward` (chains, static and
dynamic trees, batch 3 with ragged prompts), the drafter's state kept at the last accepted
position, EOS inside a draft, export, and training then decoding from the CLIs. The sampled
law is in test_decoding_sampling."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from specjax import model as M
from specjax.config import ModelConfig
from specjax.decoding.acceptance import Acceptance
from specjax.decoding.drafter import DraftWeights, Round
from specjax.decoding.drafters.medusa import Medusa
from specjax.decoding.engine import Generator
from specjax.decoding.registry import DecodingConfig, make_strategy
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.heads.medusa import init_medusa, medusa_logits
from specjax.loading import load_model
from specjax.training.config import parse_run_config
from specjax.training.heads.medusa import (
    MedusaConfig,
    MedusaObjective,
    make_medusa_eval_step,
    make_medusa_step,
    medusa_targets,
)
from specjax.training.optimizer import make_optimizer
from specjax.training.train_step import TrainState
from tests.support.decoding import check_eos_mid_draft, export_decode_loop, per_step_argmax
from tests.support.models import TINY_MODEL, damped_params, model_workdir, tiny_run
from tests.support.scripts import check_import_refusals, run_script

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]
NEW, HEADS = 20, 3


def _noisy_heads(params, scale, seed=1):
    heads = init_medusa(params, CFG, HEADS)
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    return {name: w + scale * jax.random.normal(key, w.shape)
            for (name, w), key in zip(sorted(heads.items()), keys, strict=True)}


@pytest.fixture(scope="module")
def params():
    return damped_params(CFG, jax.random.PRNGKey(0), 0.5)


def _generator(params, heads):
    unstacked = M.unstack_layers(params, CFG)
    return Generator(unstacked, CFG, draft_weights={"medusa": DraftWeights(
        heads, exit_layer=CFG.num_layers, settings={"num_heads": HEADS})})


def test_head_logits_and_training_labels_match_a_direct_computation(params):
    """Catches a head reading the wrong hidden state (before the final norm, another layer),
    a residual or SiLU left out, labels shifted by one (head k trained on the token k + 1, not
    k + 2, places ahead) or a loss that counts positions past the batch."""
    heads = _noisy_heads(params, 0.2)
    batch = jax.random.randint(jax.random.PRNGKey(2), (2, 9), 0, CFG.vocab_size)
    labels, valid = medusa_targets(batch, HEADS)
    for t in range(8):
        for k in range(HEADS):
            assert bool(valid[0, t, k]) == (t + 2 + k <= 8)
            if valid[0, t, k]:
                assert labels[:, t, k].tolist() == batch[:, t + 2 + k].tolist()
    hidden = M.run_layers(params, CFG, M.embed(params, CFG, batch[:, :-1]))[-1]
    h = np.asarray(hidden, np.float64)
    x = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + CFG.norm_eps)
    x = x * np.asarray(params["final_norm"]["scale"], np.float64)
    w, b, out = (np.asarray(heads[name], np.float64) for name in ("w", "b", "out"))
    pre = np.einsum("btd,kde->btke", x, w) + b
    expected = np.einsum("btkd,kdv->btkv", x[:, :, None] + pre / (1 + np.exp(-pre)), out)
    got = medusa_logits(params, heads, CFG, hidden)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-4, atol=2e-4)
    # The train step's loss: each head's mean cross-entropy over its labelled positions,
    # weighted by decay**k.
    settings = MedusaConfig(num_heads=HEADS, decay=0.5)
    optimizer = make_optimizer(parse_run_config(tiny_run()).train)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=heads,
                       opt_state=optimizer.init(heads))
    _, metrics = make_medusa_step(CFG, settings, optimizer)(state, params, batch, None)
    log_probs = expected - np.log(np.sum(np.exp(expected - expected.max(-1, keepdims=True)),
                                         -1, keepdims=True)) - expected.max(-1, keepdims=True)
    per_head = [np.mean([-log_probs[r, t, k, int(batch[r, t + 2 + k])] for r in range(2)
                         for t in range(8) if t + 2 + k <= 8]) for k in range(HEADS)]
    weights = 0.5 ** np.arange(HEADS)
    assert float(metrics["loss"]) == pytest.approx(np.sum(weights * per_head) / weights.sum(),
                                                   rel=1e-4)


def test_the_evaluation_accuracy_counts_each_head_within_the_sequence_only(params):
    """Each head's evaluation accuracy is a direct count: head k's top-1 prediction at t
    equals batch[t + 2 + k], over t = 0..T - 2 - k only, divided by that many positions. The
    batch's last token is set to what head 0 predicts past the end in row 0 (its label there
    if it were counted) and within it in row 1. Catches positions past the sequence end
    counted as correct (their labels clamped to the last token) or the accuracy divided by
    every position instead of the head's labelled ones."""
    heads = _noisy_heads(params, 0.2)
    batch = np.array(jax.random.randint(jax.random.PRNGKey(3), (2, 9), 0, CFG.vocab_size))
    steps = batch.shape[1] - 1
    hidden = M.run_layers(params, CFG, M.embed(params, CFG, jnp.asarray(batch[:, :-1])))[-1]
    predicted = np.asarray(jnp.argmax(medusa_logits(params, heads, CFG, hidden), -1))
    batch[0, steps] = predicted[0, steps - 1, 0]   # head 0 at T - 1: past the end
    batch[1, steps] = predicted[1, steps - 2, 0]   # head 0 at T - 2: its last labelled token
    eval_step = jax.jit(make_medusa_eval_step(CFG, HEADS))
    objective = object.__new__(MedusaObjective)
    objective.eval_batch = lambda state, b: eval_step(heads, params, jnp.asarray(b))
    report = objective.evaluate(None, [batch])
    for k in range(HEADS):
        positions = [(r, t) for r in range(2) for t in range(steps - 1 - k)]
        correct = sum(predicted[r, t, k] == batch[r, t + 2 + k] for r, t in positions)
        assert report.accuracy[k] == pytest.approx(correct / len(positions)), k
    assert report.accuracy[0] > 0
    assert report.tokens == 2 * steps


@pytest.mark.parametrize("shape", [Chain(3), StaticTree.from_branching((2, 2, 1)),
                                   DynamicTree(6, 2, 3)], ids=["chain", "static", "dynamic"])
def test_greedy_medusa_is_a_per_step_argmax_of_the_model(params, shape):
    """Catches drafts accepted that the model would not emit, on every shape Medusa drafts."""
    generator = _generator(params, _noisy_heads(params, 0.05))
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=Medusa(shape))
    assert out.tokens == per_step_argmax(generator, PROMPTS, NEW)
    assert 0 < out.total.accepted < out.total.drafted


@pytest.mark.parametrize("shape", [Chain(3), StaticTree.from_branching((2, 2, 1))],
                         ids=["chain", "tree"])
def test_the_state_is_the_hidden_state_before_the_pending_token(params, shape):
    """Catches a commit that keeps the state of another position (the pending token's own,
    one too far; a stale one; a tree's node taken in window order, not along the accepted
    path). With heads equal to the model's own head, head 1 drafts the argmax at the state's
    position: at the right one, the pending token again. So the token after a round's
    pending token is an accepted first draft exactly when it repeats the pending token (a
    chain's one draft per depth; a tree may also accept its second child)."""
    generator = _generator(params, init_medusa(params, CFG, HEADS))
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=Medusa(shape))
    assert out.tokens == per_step_argmax(generator, PROMPTS, NEW)
    repeats = 0
    for tokens, trace in zip(out.tokens, out.trace, strict=True):
        depth = trace["depth"][:len(tokens)]
        for i in range(len(tokens) - 1):
            if depth[i] != 0:  # not a round's pending token
                continue
            repeat = tokens[i + 1] == tokens[i]
            repeats += repeat
            if repeat or shape.is_chain:
                assert (depth[i + 1] == 1) == repeat, (i, tokens, depth)
    assert repeats > 0


def test_commit_keeps_the_hidden_state_of_the_last_node_on_the_accepted_path():
    """Catches a tree's accepted nodes taken in window order instead of along the path (node
    4 is the window's position 3, the path's second node), the pending token's state not kept
    when nothing is accepted, and a row that is done losing its state."""
    drafter = Medusa(StaticTree.from_branching((2, 2)), exit_layer=CFG.num_layers)
    features = jnp.arange(3 * 7, dtype=jnp.float32).reshape(3, 7, 1) * jnp.ones((1, 1, 2))
    accepted = Acceptance(num_accepted=jnp.asarray([2, 0, 1]), emitted=jnp.zeros((3, 3), int),
                          path=jnp.asarray([[1, 4], [0, 1], [0, 1]]))
    done = Round(pending=jnp.zeros(3, int), proposal=None, acceptance=accepted,
                 reused_hidden=None, lengths_before=jnp.asarray([5, 5, 5]),
                 lengths_after=jnp.asarray([8, 6, 5]), features={CFG.num_layers: features})
    state = drafter.commit(None, -jnp.ones((3, 2)), done)
    assert state[:, 0].tolist() == [5.0, 7.0, -1.0]  # row 0: position 1 + 4; row 1: 0


def test_an_eos_inside_a_draft_ends_the_row_as_plain_decoding_does(params):
    """Catches tokens committed past an EOS that arrived as an accepted head draft."""
    generator = _generator(params, _noisy_heads(params, 0.05))
    check_eos_mid_draft(generator, PROMPTS, Medusa(Chain(3)), NEW)


def test_medusa_is_registered_and_refuses_a_proposal_deeper_than_its_heads(params):
    """Catches a drafter that needs edits outside its file, and a chain deeper than the heads
    drafted from a clipped (repeated) last head instead of a one-line error."""
    assert make_strategy("medusa", DecodingConfig(num_draft=3)) == Medusa(Chain(3))
    generator = _generator(params, _noisy_heads(params, 0.05))
    with pytest.raises(ValueError, match="4 deep but the model has 3 Medusa heads"):
        generator.generate(PROMPTS, max_new_tokens=4, strategy=Medusa(Chain(4)))
    with pytest.raises(ValueError, match="needs weights of its own"):
        Generator(M.unstack_layers(params, CFG), CFG).generate(
            PROMPTS, max_new_tokens=4, strategy=Medusa(Chain(2)))


def test_the_medusa_loop_exports_for_tpu_and_cuda(params):
    """Catches host-side work in the drafter: the sampled tree loop must trace into one
    program that exports for both accelerators."""
    drafter = Medusa(StaticTree.from_branching((2, 1)), exit_layer=CFG.num_layers)
    export_decode_loop(M.unstack_layers(params, CFG), init_medusa(params, CFG, HEADS), CFG,
                       drafter)


@pytest.mark.slow
def test_heads_trained_from_the_cli_decode_from_their_workdir(trained_workdir, tmp_path):
    """Catches a head objective that is not reachable from the shipped medusa config, heads whose
    checkpoint does not load for decoding (the layer they read, their count), and a chain
    deeper than the heads accepted from the CLI."""
    heads = str(tmp_path / "medusa")
    result = run_script("train/train.py", "--config", "medusa",
                        f"--config.base_workdir={trained_workdir}", "--workdir", heads,
                        "--config.medusa.num_heads=2", "--config.train.total_steps=3",
                        "--config.train.warmup_steps=1", "--config.train.eval_every=3",
                        "--config.train.save_every=3", "--config.train.eval_batches=1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "head" in result.stdout and "top1 acc" in result.stdout
    result = run_script("infer/generate.py", "--workdir", heads, "--strategy", "medusa",
                        "--prompt", "def f(", "--max_new_tokens", "8")
    assert result.returncode == 0 and "tau=" in result.stdout, result.stderr[-2000:]
    result = run_script("infer/generate.py", "--workdir", heads, "--strategy", "medusa",
                        "--prompt", "def f(", "--max_new_tokens", "8", "--num_draft", "3")
    assert result.returncode == 1 and "3 deep but the model has 2 Medusa heads" in result.stderr


def _published_medusa(folder, cfg, heads, seed=7, **config):
    """A random Medusa-1 checkpoint in FasterDecoding/Medusa's layout (PyTorch's out-by-in
    linear weights), and its tensors."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(heads):
        tensors[f"{i}.0.linear.weight"] = rng.normal(0, 0.2, (cfg.d_model, cfg.d_model))
        tensors[f"{i}.0.linear.bias"] = rng.normal(0, 0.2, (cfg.d_model,))
        tensors[f"{i}.1.weight"] = rng.normal(0, 0.3, (cfg.vocab_size, cfg.d_model))
    tensors = {name: value.astype(np.float32) for name, value in tensors.items()}
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "medusa_lm_head.safetensors"))
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"medusa_num_heads": heads, "medusa_num_layers": 1,
                   "base_model_name_or_path": "tiny", **config}, f)
    return tensors


def test_published_medusa_heads_import_and_match_a_reference_forward(params, tmp_path):
    """Catches an import that forgets PyTorch's out-by-in layout (a transpose missed), swaps a
    head's block and projection, reads heads in another order, or writes a workdir that
    decoding cannot load; and the bad checkpoints (two residual blocks, a size the base does
    not have, a model's checkpoint given for heads, a config.json that is not an object)
    reaching a traceback, a half-made workdir or a cryptic line. The reference applies Medusa's
    ResBlock + Linear to the base's final-normed hidden states in float64, with the published
    tensors as they are."""
    base = model_workdir(str(tmp_path / "base"), params, CFG)
    published = _published_medusa(str(tmp_path / "hub"), CFG, HEADS)
    result = run_script("tools/convert.py", "--hf_dir", str(tmp_path / "hub"),
                        "--base_workdir", base, "--workdir", str(tmp_path / "heads"))
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = load_model(str(tmp_path / "heads"))
    heads = loaded.draft_weights["medusa"].params
    tokens = jnp.asarray([[5, 9, 2, 7, 1, 3]])
    hidden = M.run_layers(params, CFG, M.embed(params, CFG, tokens))[-1]
    h = np.asarray(hidden[0], np.float64)
    x = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + CFG.norm_eps)
    x = x * np.asarray(params["final_norm"]["scale"], np.float64)
    for i in range(HEADS):
        w, b, out = (published[f"{i}{s}"].astype(np.float64)
                     for s in (".0.linear.weight", ".0.linear.bias", ".1.weight"))
        pre = x @ w.T + b
        reference = (x + pre / (1 + np.exp(-pre))) @ out.T
        np.testing.assert_allclose(np.asarray(medusa_logits(params, heads, CFG, hidden)[0, :, i]),
                                   reference, rtol=2e-4, atol=2e-4)
    out = loaded.generator().generate(PROMPTS, max_new_tokens=8, strategy=make_strategy(
        "medusa", DecodingConfig(num_draft=HEADS)))
    assert out.tokens == per_step_argmax(loaded.generator(), PROMPTS, 8)
    _published_medusa(str(tmp_path / "deep"), CFG, 2, medusa_num_layers=2)
    wide = dataclasses.replace(CFG, d_model=48, num_heads=4, head_dim=12)
    _published_medusa(str(tmp_path / "wide"), wide, 2)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[]")
    check_import_refusals(tmp_path, base, (
        ("deep", "medusa_num_layers=2; specjax's heads have one residual"),
        ("wide", "0.0.linear.weight is (48, 48), but the base model"),
        ("model", "has no medusa_num_heads: not a Medusa checkpoint"),
        ("list", "config.json holds no JSON object"),
    ))
