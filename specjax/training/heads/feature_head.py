"""Training a feature head (EAGLE-3, MTP; `specjax.heads.feature_head`) on a frozen base with
training-time test: the head is unrolled `steps` depths on its own outputs, as it drafts.

The base runs forward only. Step j at position s is what a chain drafted from the pending token
at s gives at depth j + 1 (`feature_head.unrolled_logits`); it is distilled to the base's
distribution at s + j (soft cross-entropy: acceptance is agreement with the base, not with the
corpus), positions 1..T - 1 - j, the steps' losses weighted by decay**j (EAGLE-3: 0.8).
Evaluation reports, per depth, the loss and the top-1 agreement with the base: the greedy
acceptance rate of that depth's draft when every earlier one was right.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.config import ModelConfig
from specjax.heads.feature_head import FeatureHeadKind, unrolled_logits
from specjax.model import Params, init_params
from specjax.training.evaluate import sum_over_batches
from specjax.training.frozen_base import Features, HeadOnBase, base_features
from specjax.training.train_step import TrainState


@dataclasses.dataclass(frozen=True)
class DepthReport:
    """Validation soft cross-entropy and top-1 agreement with the base per drafted depth."""

    loss: tuple[float, ...]
    agreement: tuple[float, ...]
    tokens: int

    def table(self) -> str:
        lines = [f"{'depth':<6}  {'soft CE':>7}  {'agree w/ base':>13}"]
        for j, (loss, agree) in enumerate(zip(self.loss, self.agreement, strict=True)):
            lines.append(f"{j + 1:<6}  {loss:7.4f}  {agree:13.3f}")
        lines.append(f"over {self.tokens} validation positions")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"depth_loss": list(self.loss), "depth_agreement": list(self.agreement),
                "tokens": self.tokens}


def depth_sums(kind: FeatureHeadKind, base: Params, head: Params, cfg: ModelConfig,
               exits: Sequence[int], batch: jax.Array, steps: int,
               features: Features | None = None) -> dict[str, jax.Array]:
    """Per drafted depth [steps]: summed soft cross-entropy to the base, top-1 agreements and
    scored positions, over a batch [B, T + 1] (`features`: see `base_features`)."""
    width = batch.shape[1] - 1
    hidden, target_logits = base_features(base, cfg, exits, batch[:, :-1], features)
    target_logits = jax.lax.stop_gradient(target_logits)
    logits = unrolled_logits(kind, base, head, cfg, batch, hidden, steps)   # [S, B, T, V]
    base_at = jnp.arange(width)
    ce, agree, count = [], [], []
    for j in range(steps):
        target = jnp.roll(target_logits, -j, axis=1)       # the base at s + j
        valid = jnp.broadcast_to((base_at >= 1) & (base_at + j <= width - 1),
                                 target.shape[:2])
        soft = optax.softmax_cross_entropy(logits[j], jax.nn.softmax(target, axis=-1))
        same = jnp.argmax(logits[j], axis=-1) == jnp.argmax(target, axis=-1)
        ce.append(jnp.sum(jnp.where(valid, soft, 0.0)))
        agree.append(jnp.sum(valid & same))
        count.append(jnp.sum(valid))
    return {"ce": jnp.stack(ce), "agree": jnp.stack(agree), "count": jnp.stack(count)}


class UnrolledHead(HeadOnBase):
    """A feature head trained with training-time test; a head sets `kind`, `name`,
    `config_class` (a section with `steps`/`decay` properties or fields, and what
    `kind.init` reads) and `record_key`."""

    kind: ClassVar[FeatureHeadKind]

    @property
    def exits(self) -> tuple[int, ...]:
        return self.kind.exits(self.run.model, self.settings())

    def make_train_step(self) -> Callable:
        kind, cfg, exits, optimizer = self.kind, self.run.model, self.exits, self.optimizer
        steps, decay = self.section.steps, self.section.decay
        weights = decay ** jnp.arange(steps)

        def train_step(state: TrainState, base: Params, batch: jax.Array,
                       features: Features | None) -> tuple[TrainState, dict[str, jax.Array]]:
            def loss_fn(head):
                sums = depth_sums(kind, base, head, cfg, exits, batch, steps, features)
                per_depth = sums["ce"] / jnp.maximum(sums["count"], 1)
                return (jnp.sum(weights * per_depth) / jnp.sum(weights),
                        {f"depth{j + 1}_loss": per_depth[j] for j in range(steps)})

            return state.descend(loss_fn, optimizer, has_aux=True)

        return train_step

    def make_eval_step(self) -> Callable:
        kind, cfg, exits, steps = self.kind, self.run.model, self.exits, self.section.steps
        return lambda head, base, batch: depth_sums(kind, base, head, cfg, exits, batch, steps)

    def initial_params(self) -> Params:
        return self.kind.init(self.base.params, self.run.model, self.settings())

    def evaluate(self, state: TrainState, batches: Sequence[np.ndarray]) -> DepthReport:
        totals, _ = sum_over_batches(lambda batch: self.eval_batch(state, batch), batches)
        count = np.maximum(np.asarray(totals["count"], np.float64), 1)
        return DepthReport(tuple(float(x) for x in totals["ce"] / count),
                           tuple(float(x) for x in totals["agree"] / count),
                           int(totals["count"][0]))

    def settings(self) -> dict[str, Any]:
        return recorded(self.kind, self.section, self.run.model)

    @classmethod
    def abstract_params(cls, cfg: ModelConfig, settings: Mapping[str, Any]) -> Params:
        """Shapes and dtypes of the head a checkpoint's `settings` describe (restore
        targets)."""
        return jax.eval_shape(lambda: cls.kind.init(init_params(cfg, jax.random.PRNGKey(0)),
                                                    cfg, settings))


def recorded(kind: FeatureHeadKind, section: Any, cfg: ModelConfig) -> dict[str, Any]:
    """What a head's checkpoint records: its section and the exits it fuses
    (`DraftWeights.settings["exits"]`, read by the drafter)."""
    settings = dataclasses.asdict(section)
    return {**settings, "exits": list(kind.exits(cfg, settings))}

