"""Training CALM's confidence classifier on a frozen base model.

At every corpus position and every trained exit, the label is whether the shared head's argmax
there equals the final layer's: a token leaving at that exit would be the one the full model
emits. The classifier (`specjax.heads.calm`, one for all exits, on the exit's hidden
state and three numbers about its distribution) learns it by binary
cross-entropy, class-balanced per exit (each class weighted by half over its frequency in the
batch, so the rare class counts as much as the common one; CALM §3.3) and averaged over the
exits; the base runs forward only. Evaluation compares it, per exit, with CALM's softmax
response (top-1 minus top-2 probability), the measure that needs no training: AUC, how well
each ranks exits that agree above exits that do not. It is the one head two strategies read
(`calm` and `calmdraft`: `HeadOnBase.strategies`).
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
from specjax.heads.calm import (
    abstract_confidence_head,
    confidence_logits,
    init_confidence_head,
    softmax_response,
)
from specjax.model import Params, exit_logits
from specjax.training.frozen_base import Features, HeadOnBase, base_features
from specjax.training.ranking import auc
from specjax.training.train_step import TrainState


@dataclasses.dataclass(frozen=True)
class CalmConfig:
    """CALM's confidence classifier (`specjax.heads.calm`) on the frozen model in
    `base_workdir`, trained at the exits `exits` (empty: every exit below the last) to predict
    whether an exit's argmax equals the final layer's (class-balanced binary cross-entropy,
    averaged over the exits). Decoding with it: `--strategy calm --calm_measure classifier` on
    the head's workdir."""

    exits: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        exits = tuple(self.exits)
        check(all(isinstance(e, int) and e >= 1 for e in exits)
               and list(exits) == sorted(set(exits)), "calm.exits", self.exits,
               "must be distinct exits >= 1 in ascending order (empty: every exit below the "
               "last)")
        object.__setattr__(self, "exits", exits)


@dataclasses.dataclass(frozen=True)
class ConfidenceReport:
    """Validation metrics: the classifier's class-balanced cross-entropy (its training loss),
    and per exit how often it agrees with the final layer and the AUC of the classifier and of
    the softmax response at telling agreeing exits from the rest."""

    loss: float
    exits: tuple[int, ...]
    agreement: tuple[float, ...]
    auc: tuple[float, ...]
    auc_softmax: tuple[float, ...]
    tokens: int

    def table(self) -> str:
        lines = [f"{'exit':>4}  {'agree':>6}  {'AUC head':>8}  {'AUC softmax':>11}"]
        for row in zip(self.exits, self.agreement, self.auc, self.auc_softmax, strict=True):
            lines.append(f"{row[0]:>4}  {row[1]:6.3f}  {row[2]:8.3f}  {row[3]:11.3f}")
        return "\n".join([*lines, f"class-balanced cross-entropy {self.loss:.4f} over "
                                  f"{self.tokens} validation tokens per exit"])

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def trained_exits(section: CalmConfig, num_layers: int) -> tuple[int, ...]:
    """The exits a classifier trains at: the section's, or every exit below the last."""
    exits = section.exits or tuple(range(1, num_layers))
    if exits[-1] >= num_layers:
        raise ValueError(f"calm.exits={list(exits)} must lie below num_layers={num_layers}")
    return exits


def exit_labels(base: Params, cfg: ModelConfig, exits: tuple[int, ...], inputs: jax.Array,
                features: Features | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """For every exit in `exits` and position of `inputs` [B, T]: its hidden state
    [X, B, T, D], its logits [X, B, T, V] and whether its argmax equals the final layer's
    [X, B, T] (`features`: see `base_features`)."""
    hidden, final_logits = base_features(base, cfg, exits, inputs, features)
    final = jnp.argmax(final_logits, axis=-1)
    hidden = jnp.stack(hidden)
    logits = exit_logits(base, cfg, hidden)
    return hidden, logits, (jnp.argmax(logits, axis=-1) == final).astype(jnp.float32)


def balanced_bce(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Binary cross-entropy over the last two axes of [X, ...], each class weighted by 0.5 /
    its frequency at its exit, averaged over the exits."""
    axes = tuple(range(1, labels.ndim))
    positive = jnp.mean(labels, axis=axes, keepdims=True)
    weights = jnp.where(labels > 0, 0.5 / jnp.maximum(positive, 1e-6),
                        0.5 / jnp.maximum(1 - positive, 1e-6))
    return jnp.mean(weights * optax.sigmoid_binary_cross_entropy(logits, labels))


class ConfidenceClassifier(HeadOnBase):
    """CALM's confidence classifier at the exits `calm.exits` of the frozen `base`."""

    name: ClassVar[str] = "calm"
    config_class: ClassVar[type] = CalmConfig
    record_key: ClassVar[str] = "confidence_head"

    @property
    def exits(self) -> tuple[int, ...]:
        return trained_exits(self.section, self.run.model.num_layers)

    def make_train_step(self) -> Callable:
        return _make_train_step(self.run.model, self.exits, self.optimizer)

    def make_eval_step(self) -> Callable:
        return _make_eval_step(self.run.model, self.exits)

    @classmethod
    def strategies(cls) -> tuple[str, ...]:
        return ("calm", "calmdraft")

    @classmethod
    def on_base(cls, config: dict[str, Any]) -> dict[str, Any]:
        """Decoding from the head's workdir exits early with its measure by default."""
        config["decoding"] = {**config["decoding"], "calm_measure": "classifier"}
        return config

    def settings(self) -> dict[str, Any]:
        return {"exits": list(self.exits)}

    @staticmethod
    def abstract_params(cfg: ModelConfig, settings: Mapping[str, Any]) -> Params:
        return abstract_confidence_head(cfg)

    def initial_params(self) -> Params:
        return init_confidence_head(self.run.model, jax.random.PRNGKey(self.run.train.seed))

    def evaluate(self, state: TrainState, batches: Sequence[np.ndarray]) -> ConfidenceReport:
        parts = [jax.device_get(self.eval_batch(state, batch)) for batch in batches]
        logit, label, softmax = (np.concatenate([p[name].reshape(len(self.exits), -1)
                                                 for p in parts], axis=1)
                                 for name in ("logit", "label", "softmax"))
        return ConfidenceReport(
            loss=float(balanced_bce(jnp.asarray(logit), jnp.asarray(label))), exits=self.exits,
            agreement=tuple(float(x) for x in label.mean(axis=1)),
            auc=tuple(auc(s, y) for s, y in zip(logit, label, strict=True)),
            auc_softmax=tuple(auc(s, y) for s, y in zip(softmax, label, strict=True)),
            tokens=label.shape[1])


def _make_train_step(cfg: ModelConfig, exits: tuple[int, ...],
                     optimizer: optax.GradientTransformation) -> Callable:
    def train_step(state: TrainState, base: Params, batch: jax.Array,
                   features: Features | None) -> tuple[TrainState, dict[str, jax.Array]]:
        hidden, logits, label = exit_labels(base, cfg, exits, batch[:, :-1], features)

        def loss_fn(head):
            return balanced_bce(confidence_logits(head, cfg, hidden, logits), label)

        state, metrics = state.descend(loss_fn, optimizer)
        return state, {**metrics, "agreement": jnp.mean(label)}

    return train_step


def _make_eval_step(cfg: ModelConfig, exits: tuple[int, ...]) -> Callable:
    def eval_step(head: Params, base: Params, batch: jax.Array) -> dict[str, jax.Array]:
        hidden, logits, label = exit_labels(base, cfg, exits, batch[:, :-1])
        return {"logit": confidence_logits(head, cfg, hidden, logits), "label": label,
                "softmax": softmax_response({}, cfg, hidden, hidden, logits)}

    return eval_step


HEADS = {"calm": ConfidenceClassifier}
