"""The LayerSkip train step against independent references: the exit losses of truncated
models, a dropped layer as a zeroed one, float32 numbers for a bfloat16 step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specjax.config import ModelConfig
from specjax.model import forward
from specjax.training.config import parse_run_config
from specjax.training.optimizer import make_optimizer
from specjax.training.train_step import StepSchedule, init_train_state, make_train_step
from tests.support.models import tiny_run

EXITS = jnp.array([1, 2, 4])


@pytest.fixture(scope="module")
def setup(tiny_cfg):
    optimizer = make_optimizer(parse_run_config(tiny_run()).train)
    state = init_train_state(tiny_cfg, optimizer, jax.random.PRNGKey(0))
    batch = jax.random.randint(jax.random.PRNGKey(1), (4, 17), 0, tiny_cfg.vocab_size)
    return optimizer, state, batch


def _schedule(drop_rates, weights):
    return StepSchedule(drop_rates=jnp.asarray(drop_rates, jnp.float32), exit_layers=EXITS,
                        exit_weights=jnp.asarray(weights, jnp.float32))


def _truncated_logits(params, cfg, batch, num_layers):
    """Logits of a model cut after `num_layers` layers, through `model.forward`."""
    cut = ModelConfig(**{**cfg.to_dict(), "num_layers": num_layers})
    cut_params = {**params, "layers": jax.tree.map(lambda w: w[:num_layers], params["layers"])}
    return forward(cut_params, cut, batch[:, :-1])


def _truncated_loss(params, cfg, batch, num_layers):
    """Cross-entropy of a model cut after `num_layers` layers."""
    logits = _truncated_logits(params, cfg, batch, num_layers)
    return float(optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean())


def _layers_changed(new, old):
    """Per layer: whether any of its weights differ between the two params."""
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.any(a != b, axis=tuple(
        range(1, a.ndim))), new["layers"], old["layers"]))
    return np.any(changed, axis=0).tolist()


def test_loss_is_the_weighted_sum_of_independent_exit_losses(tiny_cfg, setup):
    """Catches a train step that ignores the exit weights (e.g. loss = mean of the exits'
    cross-entropies), reads the wrong layer for an exit, or supervises exits it was not given."""
    optimizer, state, batch = setup
    step = jax.jit(make_train_step(tiny_cfg, optimizer))
    weights = [0.7, 0.2, 0.1]
    _, metrics = step(state, batch, jax.random.PRNGKey(2), _schedule(np.zeros(4), weights))
    reference = [_truncated_loss(state.params, tiny_cfg, batch, int(e)) for e in EXITS]
    np.testing.assert_allclose(metrics["exit_ce"], reference, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], np.dot(weights, reference), rtol=1e-5)
    # Only exit 1 weighted: layers 2..4 get no gradient, so plain SGD leaves them as they were.
    sgd = optax.sgd(0.1)
    plain = init_train_state(tiny_cfg, sgd, jax.random.PRNGKey(0))
    new_state, _ = jax.jit(make_train_step(tiny_cfg, sgd))(
        plain, batch, jax.random.PRNGKey(2), _schedule(np.zeros(4), [1, 0, 0]))
    assert _layers_changed(new_state.params, plain.params) == [True, False, False, False]


def test_self_distilled_exits_learn_the_last_layer_held_constant(tiny_cfg, setup):
    """Catches `layerskip.exit_distill` computed wrongly: a mixture other than (1 - a) * next
    token + a * the last layer's distribution, the last exit distilled into itself, or the
    last layer's distribution not held constant (its gradient would pull the deep layers
    toward the shallow exit, so weighting exit 1 alone would change layers 2..4)."""
    optimizer, state, batch = setup
    alpha, weights = 0.6, [0.5, 0.3, 0.2]
    step = jax.jit(make_train_step(tiny_cfg, optimizer, exit_distill=alpha))
    _, metrics = step(state, batch, jax.random.PRNGKey(2), _schedule(np.zeros(4), weights))
    last = jax.nn.softmax(forward(state.params, tiny_cfg, batch[:, :-1]))
    reference = []
    for e in map(int, EXITS):
        logits = _truncated_logits(state.params, tiny_cfg, batch, e)
        hard = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
        soft = optax.softmax_cross_entropy(logits, last).mean()
        a = alpha if e < tiny_cfg.num_layers else 0.0
        reference.append(float((1 - a) * hard + a * soft))
    np.testing.assert_allclose(metrics["exit_ce"], reference, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], np.dot(weights, reference), rtol=1e-5)
    sgd = optax.sgd(0.1)
    plain = init_train_state(tiny_cfg, sgd, jax.random.PRNGKey(0))
    new_state, _ = jax.jit(make_train_step(tiny_cfg, sgd, exit_distill=1.0))(
        plain, batch, jax.random.PRNGKey(2), _schedule(np.zeros(4), [1, 0, 0]))
    assert _layers_changed(new_state.params, plain.params) == [True, False, False, False]


def _without_layer(params, index):
    """The same model with layer `index` writing nothing into the residual stream."""
    layers = params["layers"]
    attn = dict(layers["attn"], out=layers["attn"]["out"].at[index].set(0))
    mlp = dict(layers["mlp"], down=layers["mlp"]["down"].at[index].set(0))
    return {**params, "layers": {**layers, "attn": attn, "mlp": mlp}}


def test_a_dropped_layer_passes_its_input_through(tiny_cfg, setup):
    """Catches a train step that ignores the layer-dropout mask (or drops the wrong layer): a
    layer dropped with rate 1 must equal that layer zeroed out, and differ from keeping it."""
    optimizer, state, batch = setup
    step = jax.jit(make_train_step(tiny_cfg, optimizer))
    key, weights = jax.random.PRNGKey(3), [0.2, 0.3, 0.5]
    _, dropped = step(state, batch, key, _schedule([0, 1, 0, 0], weights))
    zeroed = state.replace(params=_without_layer(state.params, 1))
    _, reference = step(zeroed, batch, key, _schedule(np.zeros(4), weights))
    _, kept = step(state, batch, key, _schedule(np.zeros(4), weights))
    np.testing.assert_allclose(dropped["exit_ce"], reference["exit_ce"], rtol=1e-5)
    assert dropped["exit_ce"][0] == kept["exit_ce"][0]  # exit 1 is below the dropped layer
    assert np.all(np.asarray(dropped["exit_ce"][1:]) != np.asarray(kept["exit_ce"][1:]))


def test_bfloat16_step_matches_float32_on_a_model_that_has_learned(tiny_cfg):
    """Catches a bfloat16 path that computes nonsense, e.g. uniform logits: at initialisation
    every model's loss is about log(V), so the comparison is made after the float32 model has
    memorised a batch (loss far below log V), on the loss and on the gradient norm."""
    adam = optax.adam(1e-2)
    state = init_train_state(tiny_cfg, adam, jax.random.PRNGKey(0))
    batch = jnp.tile(jnp.arange(40, 47), (4, 3))[:, :17]  # a pattern a tiny model learns
    schedule = _schedule(np.zeros(4), [0.25, 0.25, 0.5])
    step = jax.jit(make_train_step(tiny_cfg, adam))
    key = jax.random.PRNGKey(4)
    for _ in range(30):
        state, _ = step(state, batch, key, schedule)
    _, fp32 = step(state, batch, key, schedule)
    assert fp32["loss"] < 0.6 * np.log(tiny_cfg.vocab_size)
    bf16 = ModelConfig(**{**tiny_cfg.to_dict(), "dtype": "bfloat16"})
    new_state, metrics = jax.jit(make_train_step(bf16, adam))(state, batch, key, schedule)
    np.testing.assert_allclose(metrics["exit_ce"], fp32["exit_ce"], rtol=0.03)
    np.testing.assert_allclose(metrics["grad_norm"], fp32["grad_norm"], rtol=0.1)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(new_state.params))
