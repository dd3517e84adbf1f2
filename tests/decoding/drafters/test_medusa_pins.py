"""Pins of Medusa's training side that the main tests leave open, each against a direct
computation."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import model as M
from specjax.config import ModelConfig
from specjax.heads.medusa import init_medusa
from specjax.training.heads.medusa import MedusaObjective, import_medusa, make_medusa_eval_step
from tests.decoding.drafters.test_medusa import _published_medusa
from tests.support.models import TINY_MODEL, damped_params

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
HEADS = 2


def test_the_base_heads_accuracy_is_its_argmax_against_the_next_token():
    """The report's base row (the ceiling the heads fall from) is the base head's top-1
    accuracy on the next token and its mean cross-entropy, counted by hand. The batch is the
    base's own greedy continuation, so every next token is right (accuracy 1). Catches the
    base scored against the current token (`batch[:, :-1]`), which reports near 0."""
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
    rows = [[5], [40]]
    for _ in range(8):  # greedy: token t + 1 is the base's argmax at t
        logits = M.forward(params, CFG, jnp.asarray(rows))
        for row, nxt in zip(rows, np.asarray(jnp.argmax(logits[:, -1], -1)), strict=True):
            row.append(int(nxt))
    batch = np.asarray(rows)
    logits = np.asarray(M.forward(params, CFG, jnp.asarray(batch[:, :-1])), np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    targets = batch[:, 1:]
    expected_loss = -np.mean(np.take_along_axis(log_probs, targets[..., None], -1))
    heads = init_medusa(params, CFG, HEADS)
    eval_step = jax.jit(make_medusa_eval_step(CFG, HEADS))
    objective = object.__new__(MedusaObjective)
    objective.eval_batch = lambda state, b: eval_step(heads, params, jnp.asarray(b))
    report = objective.evaluate(None, [batch])
    assert report.base_accuracy == 1.0
    assert report.base_loss == pytest.approx(expected_loss, rel=1e-4)


def test_a_medusa_checkpoint_lacking_a_heads_tensor_is_refused(base_workdir, tmp_path):
    """config.json's medusa_num_heads (3) names more heads than the weights hold (2): one
    line naming the missing tensor, nothing written. Catches the check dropped: safetensors'
    raw error on the missing name, or heads silently fewer than the config says."""
    _published_medusa(str(tmp_path / "hub"), CFG, 2, medusa_num_heads=3)
    with pytest.raises(ValueError, match=r"medusa_lm_head\.safetensors lacks 2\.0\.linear\.weight "
                                         r"\(medusa_num_heads=3\)$"):
        import_medusa(str(tmp_path / "hub"), base_workdir, str(tmp_path / "heads"))
    assert not os.path.exists(tmp_path / "heads" / "checkpoints")
