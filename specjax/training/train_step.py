"""The jit-compiled LayerSkip train step.

Everything that varies from step to step (layer-dropout rates, which exits the loss supervises and
their weights, the PRNG key) is an array argument, so one compiled program serves the whole run.
"""

from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from specjax.config import ModelConfig
from specjax.model import Params, embed, init_params, run_layers
from specjax.training.layer_dropout import sample_keep_mask
from specjax.training.loss import exit_cross_entropies, mtp_cross_entropies


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Params
    opt_state: optax.OptState

    def apply_gradients(self, grads: Params,
                        optimizer: optax.GradientTransformation) -> "TrainState":
        """The state one optimizer step later."""
        updates, opt_state = optimizer.update(grads, self.opt_state, self.params)
        return TrainState(step=self.step + 1, params=optax.apply_updates(self.params, updates),
                          opt_state=opt_state)

    def descend(self, loss_fn: Callable, optimizer: optax.GradientTransformation, *,
                has_aux: bool = False) -> tuple["TrainState", dict[str, jax.Array]]:
        """One optimizer step down `loss_fn(params)` (the loss, or with `has_aux` the loss and
        a dict of metrics): the state after it, and the metrics with the loss and the
        gradient's norm."""
        out, grads = jax.value_and_grad(loss_fn, has_aux=has_aux)(self.params)
        loss, metrics = out if has_aux else (out, {})
        return (self.apply_gradients(grads, optimizer),
                {"loss": loss, "grad_norm": optax.tree.norm(grads), **metrics})


@flax.struct.dataclass
class StepSchedule:
    """Host-built per-step inputs: dropout rates [L], exit numbers [M], exit weights [M]."""

    drop_rates: jax.Array
    exit_layers: jax.Array
    exit_weights: jax.Array


def init_train_state(cfg: ModelConfig, optimizer: optax.GradientTransformation,
                     key: jax.Array) -> TrainState:
    params = init_params(cfg, key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params))


def make_train_step(cfg: ModelConfig, optimizer: optax.GradientTransformation, *,
                    remat: str = "none", grad_accum: int = 1,
                    mtp_weight: float = 0.0, exit_distill: float = 0.0) -> Callable:
    """Returns train_step(state, batch [B, T+1], key, schedule) -> (state, metrics).

    `grad_accum` = k splits the batch into k micro-batches of B/k rows run one after another
    (`lax.scan`), their gradients summed in float32: the same update as one batch of B (the
    layer-dropout masks are drawn for the whole batch) with a k-th of the activations live.
    A model with MTP modules (`cfg.mtp_depth`) adds `mtp_weight` times their mean
    cross-entropy over the depths (DeepSeek-V3's λ), its gradient reaching the model too.
    `exit_distill` > 0 mixes the last layer's distribution into the early exits' targets
    (`loss.exit_cross_entropies`)."""

    def loss_fn(params, inputs, targets, keep, schedule):
        per_layer = run_layers(params, cfg, embed(params, cfg, inputs), keep=keep, remat=remat)
        ce = exit_cross_entropies(params, cfg, per_layer, schedule.exit_layers, targets,
                                  exit_distill)
        loss = jnp.sum(ce * schedule.exit_weights)
        mtp = jnp.zeros((cfg.mtp_depth,))
        if cfg.mtp_depth:
            tokens = jnp.concatenate([inputs, targets[:, -1:]], axis=1)
            mtp = mtp_cross_entropies(params, cfg, per_layer[-1], tokens)
            loss = loss + mtp_weight * jnp.mean(mtp)
        return loss, (ce, mtp)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def accumulated(params, inputs, targets, keep, schedule):
        """grad_fn's ((loss, exit_ce), grads) averaged over the micro-batches."""
        def micro(x, axis):
            shape = x.shape[:axis] + (grad_accum, x.shape[axis] // grad_accum) + x.shape[axis + 1:]
            return jnp.moveaxis(x.reshape(shape), axis, 0)

        def body(totals, xs):
            (loss, aux), grads = grad_fn(params, *xs, schedule)
            update = (loss, aux, jax.tree.map(lambda g: g.astype(jnp.float32), grads))
            return jax.tree.map(jnp.add, totals, update), None

        zeros = (jnp.zeros(()), (jnp.zeros(schedule.exit_layers.shape),
                                 jnp.zeros((cfg.mtp_depth,))),
                 jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params))
        (loss, aux, grads), _ = jax.lax.scan(
            body, zeros, (micro(inputs, 0), micro(targets, 0), micro(keep, 1)))
        grads = jax.tree.map(lambda g, p: (g / grad_accum).astype(p.dtype), grads, params)
        return (loss / grad_accum, jax.tree.map(lambda x: x / grad_accum, aux)), grads

    def train_step(state: TrainState, batch: jax.Array, key: jax.Array,
                   schedule: StepSchedule) -> tuple[TrainState, dict[str, jax.Array]]:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        keep = sample_keep_mask(key, schedule.drop_rates, inputs.shape[0])
        compute = grad_fn if grad_accum == 1 else accumulated
        (loss, (exit_ce, mtp_ce)), grads = compute(state.params, inputs, targets, keep, schedule)
        final_ce = exit_ce[jnp.argmax(schedule.exit_layers == cfg.num_layers)]
        metrics = {"loss": loss, "final_ce": final_ce, "exit_ce": exit_ce,
                   "exit_layers": schedule.exit_layers, "exit_weights": schedule.exit_weights,
                   "grad_norm": optax.tree.norm(grads),
                   **({"mtp_ce": mtp_ce} if cfg.mtp_depth else {})}
        return state.apply_gradients(grads, optimizer), metrics

    return train_step
