"""DeepSeek-style MTP modules trained with the model (`model.mtp_depth`, `layerskip.mtp_weight`):
the loss against a direct computation, the modules drafting for the model from its own workdir
(greedy output against a per-step argmax), continual training adding them, and an export
leaving them out with a note."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specjax import model as M
from specjax.config import ModelConfig
from specjax.decoding.registry import DecodingConfig, make_strategy
from specjax.loading import load_model
from specjax.nn.cache import LayerKV
from specjax.nn.mtp import MtpModule
from specjax.nn.rope import rope_tables
from specjax.training.loss import mtp_cross_entropies
from specjax.training.objective import with_mtp
from specjax.training.train_step import StepSchedule, TrainState, make_train_step
from specjax.training.trainer import Trainer
from tests.support.decoding import per_step_argmax
from tests.support.models import TINY_MODEL, tiny_run
from tests.support.scripts import run_script

CFG = ModelConfig(**{**TINY_MODEL, "mtp_depth": 2})


def test_the_joint_loss_adds_the_weighted_mtp_cross_entropy():
    """Catches MTP labels off by a depth, the position without a parent counted, the modules'
    loss left out of the model's gradient (or counted unweighted), and depth 1 read from
    anything but the last layer's hidden state and the token's embedding."""
    params = M.init_params(CFG, jax.random.PRNGKey(0))
    batch = jax.random.randint(jax.random.PRNGKey(1), (2, 11), 0, CFG.vocab_size)
    optimizer = optax.sgd(1.0)  # (the run's schedule warms up from a zero step size)
    schedule = StepSchedule(drop_rates=jnp.zeros((CFG.num_layers,)),
                            exit_layers=jnp.asarray([CFG.num_layers]),
                            exit_weights=jnp.asarray([1.0]))
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                       opt_state=optimizer.init(params))
    step = jax.jit(make_train_step(CFG, optimizer, mtp_weight=0.5))
    _, metrics = step(state, batch, jax.random.PRNGKey(2), schedule)
    # Depth 1 directly: module 0 over slots 1..T-1 (the last layer's state at s - 1, the
    # token at s), causal, no cache; its logits through the model's own head.
    hidden = M.run_layers(params, CFG, M.embed(params, CFG, batch[:, :-1]))[-1]
    cell = jax.tree.map(lambda w: w[0], params["mtp"]["cells"])
    width = batch.shape[1] - 1
    out, _ = MtpModule(CFG).apply({"params": cell}, M.embed(params, CFG, batch[:, 1:width]),
                                  hidden[:, :width - 1],
                                  rope_tables(CFG, jnp.broadcast_to(jnp.arange(width - 1),
                                                                    (2, width - 1))),
                                  M.causal_mask(width - 1))
    logits = M.exit_logits(params, CFG, out)
    depth1 = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 2:]).mean()
    assert float(metrics["mtp_ce"][0]) == pytest.approx(float(depth1), rel=1e-4)
    assert float(metrics["loss"]) == pytest.approx(
        float(metrics["final_ce"]) + 0.5 * float(np.mean(metrics["mtp_ce"])), rel=1e-5)
    updated, _ = step(state, batch, jax.random.PRNGKey(2), schedule)
    unweighted, _ = jax.jit(make_train_step(CFG, optimizer, mtp_weight=0.0))(
        state, batch, jax.random.PRNGKey(2), schedule)
    # the model itself learns from the modules' loss, not only the modules
    assert not np.allclose(updated.params["embed"], unweighted.params["embed"])


@jax.jit
def _chain_logits(params, tokens, base):
    """Logits [depth, B, V] of the chain drafted from the pending token at `base` (traced),
    run one depth at a time through a plain cache: module 0 writes slots 1..T - 1 (the last
    layer's state at p - 1 and the token at p, seeing slots 1..p); module j then writes slot
    base + j from module j - 1's output and the token base + j, seeing slots 1..base + j."""
    cfg = dataclasses.replace(CFG, mtp_depth=3)
    batch, width = tokens.shape[0], tokens.shape[1] - 1
    hidden = M.run_layers(params, cfg, M.embed(params, cfg, tokens[:, :-1]))[-1]
    slots = jnp.arange(width + cfg.mtp_depth)

    def run(j, feature, write, kv):
        cell = jax.tree.map(lambda w: w[j], params["mtp"]["cells"])
        mask = (slots[None, :] <= write[:, None]) & (slots[None, :] >= 1)
        where = jnp.broadcast_to(write, (batch, write.shape[0]))
        return MtpModule(cfg).apply({"params": cell}, M.embed(params, cfg, tokens[:, write]),
                                    feature, rope_tables(cfg, where),
                                    jnp.broadcast_to(mask, (batch, *mask.shape)), kv, where)

    out, kv = run(0, hidden[:, :width - 1], jnp.arange(1, width),
                  LayerKV.allocate(cfg, batch, len(slots)))
    feature = jax.lax.dynamic_slice_in_dim(out, base - 1, 1, axis=1)
    logits = [M.exit_logits(params, cfg, feature)[:, 0]]
    for j in range(1, cfg.mtp_depth):
        feature, kv = run(j, feature, (base + j)[None], kv)
        logits.append(M.exit_logits(params, cfg, feature)[:, 0])
    return jnp.stack(logits)


def test_the_mtp_loss_past_the_first_depth_is_a_direct_cross_entropy():
    """Each depth's MTP cross-entropy (3 modules) is the mean over rows and positions
    s = 1..T - 1 - j of -log q_j(tokens[s + j + 1]), q_j the depth-(j + 1) draft of a chain run
    one depth at a time from the pending token at s. Catches labels or scored positions
    wrong only past the first depth (labels one depth off, positions whose label lies past the
    sequence counted), which the joint-loss test, comparing depth 1 only, lets through."""
    cfg = dataclasses.replace(CFG, mtp_depth=3)
    params = M.init_params(cfg, jax.random.PRNGKey(4))
    batch = jax.random.randint(jax.random.PRNGKey(5), (2, 11), 0, cfg.vocab_size)
    width = batch.shape[1] - 1
    hidden = M.run_layers(params, cfg, M.embed(params, cfg, batch[:, :-1]))[-1]
    got = jax.jit(mtp_cross_entropies, static_argnums=1)(params, cfg, hidden, batch)
    chains = {s: np.asarray(_chain_logits(params, batch, s), np.float64)
              for s in range(1, width)}
    tokens = np.asarray(batch)
    for j in range(cfg.mtp_depth):
        ces = []
        for s in range(1, width - j):
            log_q = chains[s][j] - np.log(np.sum(np.exp(chains[s][j]), -1, keepdims=True))
            ces += [-log_q[b, tokens[b, s + j + 1]] for b in range(2)]
        assert float(got[j]) == pytest.approx(np.mean(ces), rel=1e-4), j


def test_init_draws_the_same_model_with_or_without_modules_and_sources_get_them():
    """Catches MTP modules that change the model's own initial weights (a model with them
    must be the model without them plus modules), and continual training from a checkpoint
    without modules that fails instead of adding fresh ones (or keeps them when not asked)."""
    plain = M.init_params(dataclasses.replace(CFG, mtp_depth=0), jax.random.PRNGKey(3))
    joint = M.init_params(CFG, jax.random.PRNGKey(3))
    assert jax.tree.all(jax.tree.map(np.array_equal, plain,
                                     {k: v for k, v in joint.items() if k != "mtp"}))
    added = with_mtp(plain, CFG, seed=0)
    assert jax.tree.map(np.shape, added["mtp"]) == jax.tree.map(np.shape, joint["mtp"])
    assert "mtp" not in with_mtp(joint, dataclasses.replace(CFG, mtp_depth=0), seed=0)


@pytest.mark.slow
def test_a_model_trained_with_mtp_drafts_with_its_own_modules(tmp_path):
    """Catches modules that are not saved with the model, not restored for decoding, or not
    offered as its `mtp` drafter; and an export that fails on them or drops them silently."""
    workdir = str(tmp_path / "run")
    Trainer(tiny_run(model={"mtp_depth": 2}, train=dict(total_steps=4, eval_every=4,
                                                        save_every=4)), workdir).fit()
    loaded = load_model(workdir)
    assert set(loaded.draft_weights) == {"mtp"}
    prompts = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]
    generator = loaded.generator()
    out = generator.generate(prompts, max_new_tokens=12, strategy=make_strategy(
        "mtp", DecodingConfig(num_draft=3)))
    assert out.tokens == per_step_argmax(generator, prompts, 12)
    result = run_script("tools/convert.py", "--to_hf", "--workdir", workdir, "--hf_dir",
                        str(tmp_path / "hf"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "MTP module(s) are not exported" in result.stderr
