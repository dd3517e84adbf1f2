"""Training Kangaroo's adapter on a frozen base model.

The base runs forward only; the adapter reads its exit-E hidden states and is distilled to the
base's final distribution (soft cross-entropy, as Kangaroo's `train.py`). Evaluation compares
the adapter with the draft it replaces, the shared head at exit E: soft cross-entropy, top-1
agreement with the final layer (the greedy acceptance rate) and the expected acceptance of a
sampled draft at temperature 1, sum_v min(p, q) (Kangaroo's "Accept").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.config import ModelConfig, check
from specjax.heads.kangaroo import abstract_adapter, adapter_logits, init_adapter
from specjax.model import Params, exit_logits
from specjax.training.evaluate import sum_over_batches
from specjax.training.frozen_base import Features, HeadOnBase, base_features
from specjax.training.train_step import TrainState

DRAFTS = ("shared head", "adapter")


@dataclasses.dataclass(frozen=True)
class KangarooConfig:
    """Kangaroo's adapter (Liu et al. 2024; `specjax.heads.kangaroo`) on exit `exit_layer` of the
    frozen model in `base_workdir`, distilled to the base's final distribution (soft
    cross-entropy). Decoding with it: `--strategy kangaroo` on the adapter's workdir."""

    exit_layer: int = 1

    def __post_init__(self) -> None:
        check(isinstance(self.exit_layer, int) and self.exit_layer >= 1, "kangaroo.exit_layer",
               self.exit_layer, "must be an int >= 1")


@dataclasses.dataclass(frozen=True)
class AdapterReport:
    """Validation metrics of the two drafts at exit `exit_layer` (index 0: the shared head,
    1: the adapter), per token."""

    exit_layer: int
    soft_ce: tuple[float, float]
    agreement: tuple[float, float]
    expected_accept: tuple[float, float]
    tokens: int

    def table(self) -> str:
        lines = [f"draft at exit {self.exit_layer:<4}  {'soft CE':>7}  {'agree w/ final':>14}  "
                 f"{'E[accept] T=1':>13}"]
        for i, name in enumerate(DRAFTS):
            lines.append(f"{name:<17}  {self.soft_ce[i]:7.4f}  {self.agreement[i]:14.3f}  "
                         f"{self.expected_accept[i]:13.3f}")
        lines.append(f"over {self.tokens} validation tokens")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"exit_layer": self.exit_layer, "tokens": self.tokens,
                **{f"{metric}_{name.replace(' ', '_')}": values[i]
                   for metric, values in (("soft_ce", self.soft_ce),
                                          ("agreement", self.agreement),
                                          ("expected_accept", self.expected_accept))
                   for i, name in enumerate(DRAFTS)}}


def make_adapter_step(cfg: ModelConfig, exit_layer: int,
                      optimizer: optax.GradientTransformation) -> Callable:
    """Returns train_step(state, base params, batch [B, T+1], features) -> (state, metrics)."""

    def train_step(state: TrainState, base: Params, batch: jax.Array,
                   features: Features | None) -> tuple[TrainState, dict[str, jax.Array]]:
        (hidden,), final_logits = base_features(base, cfg, (exit_layer,), batch[:, :-1],
                                                features)
        teacher = jax.nn.softmax(final_logits)

        def loss_fn(adapter):
            logits = adapter_logits(base, adapter, cfg, hidden)
            return jnp.mean(optax.softmax_cross_entropy(logits, teacher))

        return state.descend(loss_fn, optimizer)

    return train_step


def make_adapter_eval_step(cfg: ModelConfig, exit_layer: int) -> Callable:
    """Returns eval_step(adapter, base, batch) -> sums over the batch, [2] each (head, adapter)."""

    def eval_step(adapter: Params, base: Params, batch: jax.Array) -> dict[str, jax.Array]:
        (hidden,), final_logits = base_features(base, cfg, (exit_layer,), batch[:, :-1])
        teacher = jax.nn.softmax(final_logits)
        drafts = jnp.stack([exit_logits(base, cfg, hidden),
                            adapter_logits(base, adapter, cfg, hidden)])
        target = jnp.argmax(final_logits, axis=-1)
        return {"soft_ce": jnp.sum(optax.softmax_cross_entropy(drafts, teacher), axis=(1, 2)),
                "agree": jnp.sum(jnp.argmax(drafts, axis=-1) == target, axis=(1, 2)),
                "accept": jnp.sum(jnp.minimum(jax.nn.softmax(drafts), teacher), axis=(1, 2, 3))}

    return eval_step


class KangarooAdapter(HeadOnBase):
    """The adapter at exit `kangaroo.exit_layer` of the frozen `base`."""

    name: ClassVar[str] = "kangaroo"
    config_class: ClassVar[type] = KangarooConfig
    record_key: ClassVar[str] = "adapter"

    def make_train_step(self) -> Callable:
        return make_adapter_step(self.run.model, self.exit_layer, self.optimizer)

    def make_eval_step(self) -> Callable:
        return make_adapter_eval_step(self.run.model, self.exit_layer)

    @staticmethod
    def abstract_params(cfg: ModelConfig, settings: Mapping[str, Any]) -> Params:
        return abstract_adapter(cfg)

    def initial_params(self) -> Params:
        return init_adapter(self.base.params, self.run.model, self.exit_layer)

    def evaluate(self, state: TrainState, batches: Sequence[np.ndarray]) -> AdapterReport:
        totals, tokens = sum_over_batches(
            lambda batch: self.eval_batch(state, batch), batches)
        per_token = {k: tuple(float(x) / tokens for x in v) for k, v in totals.items()}
        return AdapterReport(self.exit_layer, per_token["soft_ce"], per_token["agree"],
                             per_token["accept"], tokens)


HEADS = {"kangaroo": KangarooAdapter}
