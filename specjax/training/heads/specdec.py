"""Training SpecDec++'s acceptance head on a frozen base model.

Every corpus position is a draft: the shared head at exit E proposes a token (drawn from its
distribution q at the configured temperature / top-p, or its argmax when greedy), the base's
final layer is the target p. The label is the probability that speculative sampling accepts
that token, min(1, p(y) / q(y)) (greedy: 1 if the target's argmax is the token, else 0); the
head (`specjax.heads.specdec`) learns it by binary cross-entropy, the base runs forward
only.
For dynamic trees (`children` = k) every position proposes q's top k tokens instead, the
children a tree node gets; the top-k rule accepts child x exactly when the target's own draw
at the node is x, so x's label is p(x) (greedy: 1 if x is the target's argmax).
Evaluation compares the head with a constant predictor and with the signal η reads, q(y):
cross-entropy, calibration and AUC (how well each ranks accepted drafts above rejected ones).
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
from specjax.decoding.sampling import SamplingParams, probabilities, sample
from specjax.heads.specdec import (
    abstract_acceptance_head,
    acceptance_logits,
    init_acceptance_head,
)
from specjax.model import Params, exit_logits
from specjax.training.frozen_base import Features, HeadOnBase, base_features
from specjax.training.ranking import auc
from specjax.training.train_step import TrainState


@dataclasses.dataclass(frozen=True)
class SpecDecConfig:
    """SpecDec++'s acceptance head (`specjax.heads.specdec`) on exit `exit_layer` of the
    frozen model in `base_workdir`: an MLP of hidden `width` trained (binary cross-entropy) to
    predict whether the target accepts a draft drawn at `temperature` / `top_p` (temperature 0:
    greedy drafts and exact-match acceptance). Decoding with it: `--strategy specdec --draft_risk h`
    on the head's workdir. `children` = k >= 1 trains it for dynamic trees instead
    (`--strategy specdec --tree dynamic`): on the draft's top k tokens at every position, each
    labelled with the probability that the target's own choice is that token."""

    exit_layer: int = 1
    width: int = 128
    temperature: float = 0.8
    top_p: float = 0.95
    children: int = 0

    def __post_init__(self) -> None:
        check(isinstance(self.exit_layer, int) and self.exit_layer >= 1, "specdec.exit_layer",
               self.exit_layer, "must be an int >= 1")
        check(isinstance(self.width, int) and self.width >= 1, "specdec.width", self.width,
               "must be an int >= 1")
        check(isinstance(self.temperature, (int, float)) and self.temperature >= 0,
               "specdec.temperature", self.temperature, "must be >= 0 (0: greedy)")
        check(isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1, "specdec.top_p",
               self.top_p, "must lie in (0, 1]")
        check(self.temperature > 0 or self.top_p == 1, "specdec.top_p", self.top_p,
               "filters sampled drafts: set specdec.temperature > 0 (0 is greedy)")
        check(isinstance(self.children, int) and self.children >= 0, "specdec.children",
               self.children, "must be an int >= 0 (0: a chain's drafts)")


@dataclasses.dataclass(frozen=True)
class AcceptanceReport:
    """Validation metrics per draft token: the acceptance rate (mean label), the head's mean
    prediction, binary cross-entropy of the head and of a constant (the rate), and the AUC of
    the head and of q(y)."""

    exit_layer: int
    acceptance: float
    predicted: float
    bce: float
    bce_constant: float
    auc: float
    auc_draft_prob: float
    tokens: int

    def table(self) -> str:
        return "\n".join([
            f"acceptance head at exit {self.exit_layer}: acceptance {self.acceptance:.3f}, "
            f"predicted {self.predicted:.3f}",
            f"{'predictor':<17}  {'BCE':>7}  {'AUC':>6}",
            f"{'head':<17}  {self.bce:7.4f}  {self.auc:6.3f}",
            f"{'constant':<17}  {self.bce_constant:7.4f}  {0.5:6.3f}",
            f"{'q(y) (eta)':<17}  {'':>7}  {self.auc_draft_prob:6.3f}",
            f"over {self.tokens} validation tokens"])

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def sampling_of(section: SpecDecConfig) -> SamplingParams | None:
    """The draft distribution the head is trained for (None: greedy)."""
    if not section.temperature:
        return None
    return SamplingParams.create(section.temperature, top_p=section.top_p)


def draft_labels(base: Params, cfg: ModelConfig, exit_layer: int,
                 sampling: SamplingParams | None, inputs: jax.Array, key: jax.Array,
                 children: int = 0, features: Features | None = None
                 ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """For every position of `inputs` [B, T]: exit E's hidden state [B, T, D], the draft
    distribution [B, T, V], a drawn draft token [B, T] and its acceptance probability [B, T];
    with `children` = k, q's top k tokens [B, T, k] and their labels [B, T, k], the hidden
    state and distribution repeated for each [B, T, k, ...]. `features`: see `base_features`."""
    (hidden,), final_logits = base_features(base, cfg, (exit_layer,), inputs, features)
    draft_logits = exit_logits(base, cfg, hidden)
    if sampling is None:
        q, p = jax.nn.softmax(draft_logits, axis=-1), None
    else:
        q, p = probabilities(draft_logits, sampling), probabilities(final_logits, sampling)
    if children:
        return _children_labels(hidden, q, p, final_logits, children)
    if p is None:
        token = jnp.argmax(draft_logits, axis=-1)
        label = (jnp.argmax(final_logits, axis=-1) == token).astype(jnp.float32)
    else:
        token = sample(key, q)
        p_y, q_y = (jnp.take_along_axis(x, token[..., None], axis=-1)[..., 0] for x in (p, q))
        label = jnp.minimum(1.0, p_y / q_y)
    return hidden, q, token.astype(jnp.int32), label


def _children_labels(hidden: jax.Array, q: jax.Array, p: jax.Array | None,
                     final_logits: jax.Array,
                     k: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """`draft_labels` for a dynamic tree's children: q's top k tokens, each labelled with the
    target's probability p of drawing it (greedy, p None: whether it is the target's argmax)."""
    token = jax.lax.top_k(q, k)[1]
    if p is None:
        label = (jnp.argmax(final_logits, axis=-1)[..., None] == token).astype(jnp.float32)
    else:
        label = jnp.take_along_axis(p, token, axis=-1)
    repeat = lambda x: jnp.broadcast_to(x[..., None, :], (*token.shape, x.shape[-1]))  # noqa: E731
    return repeat(hidden), repeat(q), token.astype(jnp.int32), label


class AcceptanceHeadObjective(HeadOnBase):
    """SpecDec++'s acceptance head at exit `specdec.exit_layer` of the frozen `base`."""

    name: ClassVar[str] = "specdec"
    config_class: ClassVar[type] = SpecDecConfig
    record_key: ClassVar[str] = "acceptance_head"

    def make_train_step(self) -> Callable:
        return _make_train_step(self.run.model, self.exit_layer, sampling_of(self.section),
                                self.section.children, self.optimizer)

    def make_eval_step(self) -> Callable:
        return _make_eval_step(self.run.model, self.exit_layer, sampling_of(self.section),
                               self.section.children)

    def step_inputs(self, step: int) -> tuple:
        """The step's key for drawing drafts."""
        return (jax.random.fold_in(jax.random.PRNGKey(self.run.train.seed + 1), step),)

    def eval_inputs(self, index: int) -> tuple:
        """The same drafts at every evaluation."""
        return (jax.random.fold_in(jax.random.PRNGKey(self.run.train.seed + 2), index),)

    @staticmethod
    def abstract_params(cfg: ModelConfig, settings: Mapping[str, Any]) -> Params:
        return abstract_acceptance_head(cfg, settings["width"])

    def initial_params(self) -> Params:
        return init_acceptance_head(self.run.model, self.section.width,
                                    jax.random.PRNGKey(self.run.train.seed))

    def evaluate(self, state: TrainState, batches: Sequence[np.ndarray]) -> AcceptanceReport:
        parts = [jax.device_get(self.eval_batch(state, batch, i))
                 for i, batch in enumerate(batches)]
        logit, label, draft_prob = (np.concatenate([p[name].ravel() for p in parts])
                                    for name in ("logit", "label", "draft_prob"))
        rate = float(label.mean())
        constant = np.full_like(label, np.log(rate / (1 - rate)) if 0 < rate < 1 else 0.0)
        bce = lambda x: float(np.mean(optax.sigmoid_binary_cross_entropy(x, label)))  # noqa: E731
        return AcceptanceReport(
            exit_layer=self.exit_layer, acceptance=rate,
            predicted=float(np.mean(1 / (1 + np.exp(-logit)))), bce=bce(logit),
            bce_constant=bce(constant), auc=auc(logit, label),
            auc_draft_prob=auc(draft_prob, label), tokens=label.size)


def _make_train_step(cfg: ModelConfig, exit_layer: int, sampling: SamplingParams | None,
                     children: int, optimizer: optax.GradientTransformation) -> Callable:
    def train_step(state: TrainState, base: Params, batch: jax.Array, features: Features | None,
                   key: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
        hidden, q, token, label = draft_labels(base, cfg, exit_layer, sampling, batch[:, :-1],
                                               key, children, features)

        def loss_fn(head):
            logits = acceptance_logits(head, cfg, hidden, q, token)
            return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, label))

        state, metrics = state.descend(loss_fn, optimizer)
        return state, {**metrics, "acceptance": jnp.mean(label)}

    return train_step


def _make_eval_step(cfg: ModelConfig, exit_layer: int, sampling: SamplingParams | None,
                    children: int) -> Callable:
    def eval_step(head: Params, base: Params, batch: jax.Array,
                  key: jax.Array) -> dict[str, jax.Array]:
        hidden, q, token, label = draft_labels(base, cfg, exit_layer, sampling, batch[:, :-1],
                                               key, children)
        return {"logit": acceptance_logits(head, cfg, hidden, q, token), "label": label,
                "draft_prob": jnp.take_along_axis(q, token[..., None], axis=-1)[..., 0]}

    return eval_step


HEADS = {"specdec": AcceptanceHeadObjective}
