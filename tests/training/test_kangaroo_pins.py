"""Pins of Kangaroo's adapter training and evaluation (`training.heads.kangaroo`) against
direct computations."""

import jax
import jax.numpy as jnp
import optax
import pytest

from specjax import model as M
from specjax.config import ModelConfig
from specjax.heads.kangaroo import adapter_logits, init_adapter
from specjax.training.heads.kangaroo import make_adapter_eval_step
from tests.support.models import TINY_MODEL, damped_params

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
EXIT = 1


def test_the_evaluation_compares_each_draft_with_the_final_layers_argmax():
    """Per draft (the shared head at the exit, the adapter), the evaluation's sums are the
    soft cross-entropy to the final layer, the count of positions whose argmax equals the
    final layer's argmax (the greedy acceptance rate) and sum_v min(p, q), each computed here
    directly from the exit's hidden state. Catches agreement counted against the corpus's
    next token instead of the final layer (a draft is accepted when it agrees with the
    target, not with the text)."""
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
    adapter = jax.tree.map(lambda w: w + 0.05 * jax.random.normal(jax.random.PRNGKey(3),
                                                                   w.shape),
                           init_adapter(params, CFG, EXIT))
    batch = jax.random.randint(jax.random.PRNGKey(2), (2, 10), 0, CFG.vocab_size)
    inputs = batch[:, :-1]
    hidden = M.run_layers(params, CFG, M.embed(params, CFG, inputs), layers=(0, EXIT))[-1]
    final = M.forward(params, CFG, inputs)
    sums = make_adapter_eval_step(CFG, EXIT)(adapter, params, batch)
    teacher = jax.nn.softmax(final)
    for i, draft in enumerate([M.exit_logits(params, CFG, hidden),
                               adapter_logits(params, adapter, CFG, hidden)]):
        agree = int(jnp.sum(jnp.argmax(draft, -1) == jnp.argmax(final, -1)))
        assert int(sums["agree"][i]) == agree, i
        assert float(sums["soft_ce"][i]) == pytest.approx(
            float(jnp.sum(optax.softmax_cross_entropy(draft, teacher))), rel=1e-4)
        assert float(sums["accept"][i]) == pytest.approx(
            float(jnp.sum(jnp.minimum(jax.nn.softmax(draft), teacher))), rel=1e-4)
    corpus = int(jnp.sum(jnp.argmax(M.exit_logits(params, CFG, hidden), -1) == batch[:, 1:]))
    assert corpus != int(sums["agree"][0])  # the batch tells the two readings apart
