"""Training Medusa heads on a frozen base model (Medusa-1), and importing published ones.

The base runs forward only; head k (0-based) reads its last-layer hidden state at position t
and is trained with cross-entropy on the corpus token at t + 2 + k (the base's own head
predicts t + 1), the heads' losses weighted by decay**k. Evaluation reports each head's loss
and top-1 accuracy beside the base head's, the ceiling a head drafting further ahead falls
from.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from safetensors import safe_open

from specjax.config import ModelConfig, check
from specjax.convert.hf_config import read_config_json
from specjax.heads.medusa import abstract_medusa, init_medusa, medusa_logits
from specjax.model import Params
from specjax.training.evaluate import sum_over_batches
from specjax.training.frozen_base import (
    Features,
    HeadOnBase,
    base_features,
    load_base,
    save_imported_head,
)
from specjax.training.train_step import TrainState


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
    """Medusa heads (`specjax.heads.medusa`) on the last hidden state of the frozen model in
    `base_workdir`: `num_heads` heads, head k trained (cross-entropy on the corpus) to predict
    the token k + 1 places after the next, its loss weighted by `decay`**k as in Medusa-1.
    Decoding with them: `--strategy medusa` on the heads' workdir (a chain or a tree at most
    `num_heads` deep)."""

    num_heads: int = 4
    decay: float = 0.8

    def __post_init__(self) -> None:
        check(isinstance(self.num_heads, int) and self.num_heads >= 1, "medusa.num_heads",
               self.num_heads, "must be an int >= 1")
        check(isinstance(self.decay, (int, float)) and 0 < self.decay <= 1, "medusa.decay",
               self.decay, "must lie in (0, 1]")


@dataclasses.dataclass(frozen=True)
class MedusaReport:
    """Validation loss and top-1 accuracy per head (index k: the token k + 2 ahead), and the
    base head's (the next token)."""

    loss: tuple[float, ...]
    accuracy: tuple[float, ...]
    base_loss: float
    base_accuracy: float
    tokens: int

    def table(self) -> str:
        lines = [f"{'head':<6}  {'ahead':>5}  {'loss':>7}  {'top1 acc':>8}",
                 f"{'base':<6}  {1:>5}  {self.base_loss:7.4f}  {self.base_accuracy:8.3f}"]
        for k, (loss, acc) in enumerate(zip(self.loss, self.accuracy, strict=True)):
            lines.append(f"{k + 1:<6}  {k + 2:>5}  {loss:7.4f}  {acc:8.3f}")
        lines.append(f"over {self.tokens} validation positions")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"head_loss": list(self.loss), "head_accuracy": list(self.accuracy),
                "base_loss": self.base_loss, "base_accuracy": self.base_accuracy,
                "tokens": self.tokens}


def medusa_targets(batch: jax.Array, num_heads: int) -> tuple[jax.Array, jax.Array]:
    """Labels [B, T, K] of the inputs batch[:, :-1] (T positions): head k at position t is
    labelled batch[t + 2 + k]; `valid` [B, T, K] is False where that lies past the batch."""
    steps = batch.shape[1] - 1
    at = jnp.arange(steps)[:, None] + 2 + jnp.arange(num_heads)[None, :]        # [T, K]
    labels = jnp.take(batch, jnp.minimum(at, steps), axis=1)                    # [B, T, K]
    return labels, jnp.broadcast_to(at <= steps, labels.shape)


def head_losses(logits: jax.Array, labels: jax.Array,
                valid: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per head [K]: summed cross-entropy, correct top-1 predictions and labelled positions."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = jnp.argmax(logits, axis=-1) == labels
    return (jnp.sum(jnp.where(valid, ce, 0.0), axis=(0, 1)),
            jnp.sum(valid & correct, axis=(0, 1)), jnp.sum(valid, axis=(0, 1)))


def make_medusa_step(cfg: ModelConfig, settings: MedusaConfig,
                     optimizer: optax.GradientTransformation) -> Callable:
    """Returns train_step(state, base params, batch [B, T+1], features) -> (state, metrics)."""
    weights = settings.decay ** jnp.arange(settings.num_heads)

    def train_step(state: TrainState, base: Params, batch: jax.Array,
                   features: Features | None) -> tuple[TrainState, dict[str, jax.Array]]:
        (hidden,), _ = base_features(base, cfg, (cfg.num_layers,), batch[:, :-1], features)
        labels, valid = medusa_targets(batch, settings.num_heads)

        def loss_fn(heads):
            ce, _, count = head_losses(medusa_logits(base, heads, cfg, hidden), labels, valid)
            per_head = ce / count
            return (jnp.sum(weights * per_head) / jnp.sum(weights),
                    {f"head{k + 1}_loss": per_head[k] for k in range(settings.num_heads)})

        return state.descend(loss_fn, optimizer, has_aux=True)

    return train_step


def make_medusa_eval_step(cfg: ModelConfig, num_heads: int) -> Callable:
    """Returns eval_step(heads, base, batch) -> sums over the batch: each head's and the base
    head's cross-entropy, correct predictions and positions."""

    def eval_step(heads: Params, base: Params, batch: jax.Array) -> dict[str, jax.Array]:
        (hidden,), own = base_features(base, cfg, (cfg.num_layers,), batch[:, :-1])
        labels, valid = medusa_targets(batch, num_heads)
        ce, correct, count = head_losses(medusa_logits(base, heads, cfg, hidden), labels, valid)
        return {"ce": ce, "correct": correct, "count": count,
                "base_ce": jnp.sum(optax.softmax_cross_entropy_with_integer_labels(
                    own, batch[:, 1:])),
                "base_correct": jnp.sum(jnp.argmax(own, axis=-1) == batch[:, 1:])}

    return eval_step


class MedusaObjective(HeadOnBase):
    """`medusa.num_heads` heads on the last layer of the frozen `base`."""

    name: ClassVar[str] = "medusa"
    config_class: ClassVar[type] = MedusaConfig
    record_key: ClassVar[str] = "medusa"

    def make_train_step(self) -> Callable:
        return make_medusa_step(self.run.model, self.section, self.optimizer)

    def make_eval_step(self) -> Callable:
        return make_medusa_eval_step(self.run.model, self.section.num_heads)

    @staticmethod
    def abstract_params(cfg: ModelConfig, settings: Mapping[str, Any]) -> Params:
        return abstract_medusa(cfg, settings["num_heads"])

    def settings(self) -> dict[str, Any]:
        return _recorded(self.section, self.run.model)

    @classmethod
    def on_base(cls, config: dict[str, Any]) -> dict[str, Any]:
        """Decoding from the heads' workdir drafts a chain no deeper than the heads."""
        heads = cls.read_section(config)
        drafts = config["decoding"].get("num_draft", heads.num_heads)
        config["decoding"] = {**config["decoding"], "num_draft": min(drafts, heads.num_heads)}
        return config

    def initial_params(self) -> Params:
        return init_medusa(self.base.params, self.run.model, self.section.num_heads)

    def evaluate(self, state: TrainState, batches: Sequence[np.ndarray]) -> MedusaReport:
        totals, tokens = sum_over_batches(
            lambda batch: self.eval_batch(state, batch), batches)
        count = np.asarray(totals["count"], np.float64)
        return MedusaReport(
            tuple(float(x) for x in totals["ce"] / count),
            tuple(float(x) for x in totals["correct"] / count),
            float(totals["base_ce"]) / tokens, float(totals["base_correct"]) / tokens, tokens)


def _recorded(section: MedusaConfig, cfg: ModelConfig) -> dict[str, Any]:
    """What a heads checkpoint records of them: the section and the layer the heads read (the
    model's last: `DraftWeights.exit_layer`)."""
    return {**dataclasses.asdict(section), "exit_layer": cfg.num_layers}


HEADS = {"medusa": MedusaObjective}


MEDUSA_WEIGHTS = "medusa_lm_head.safetensors"


def import_medusa(medusa_dir: str, base_workdir: str, workdir: str) -> int:
    """Writes a heads workdir (step 0, like a trained one: decode it with --strategy medusa)
    from a Medusa-1 checkpoint as FasterDecoding/Medusa publishes it for the model in
    `base_workdir`: config.json (`medusa_num_heads`, `medusa_num_layers` = 1) and
    medusa_lm_head.safetensors, head i's `{i}.0.linear.weight` [D, D] and `.bias` [D] (its
    residual block) and `{i}.1.weight` [V, D] (its projection), in PyTorch's out-by-in layout.
    One-line errors, before anything is written, for a file or size that does not fit the
    base. Returns the number of heads."""
    settings = _published_settings(medusa_dir)
    base = load_base(base_workdir)
    cfg, heads = base.cfg, settings["medusa_num_heads"]
    path = os.path.join(medusa_dir, MEDUSA_WEIGHTS)
    if not os.path.isfile(path):
        raise ValueError(f"{medusa_dir!r} has no {MEDUSA_WEIGHTS}")
    d, v = cfg.d_model, cfg.vocab_size
    expected = {".0.linear.weight": (d, d), ".0.linear.bias": (d,), ".1.weight": (v, d)}
    with safe_open(path, framework="numpy") as f:
        names = set(f.keys())
        tensors = {}
        for i in range(heads):
            for suffix, shape in expected.items():
                name = f"{i}{suffix}"
                if name not in names:
                    raise ValueError(f"{path} lacks {name} (medusa_num_heads={heads})")
                tensors[name] = f.get_tensor(name)
                if tensors[name].shape != shape:
                    raise ValueError(f"{path}: {name} is {tensors[name].shape}, but the base "
                                     f"model ({base_workdir}: hidden_size {d}, vocab_size {v}) "
                                     f"needs {shape}")
    dtype = jnp.dtype(cfg.param_dtype)
    params = {name: jnp.asarray(np.stack(arrays).astype(dtype)) for name, arrays in (
        ("w", [tensors[f"{i}.0.linear.weight"].T for i in range(heads)]),
        ("b", [tensors[f"{i}.0.linear.bias"] for i in range(heads)]),
        ("out", [tensors[f"{i}.1.weight"].T for i in range(heads)]))}
    section = MedusaConfig(num_heads=heads)
    save_imported_head(MedusaObjective, section, params, base, workdir, _recorded(section, cfg),
                       {"medusa_dir": os.path.abspath(medusa_dir)})
    return heads


def _published_settings(medusa_dir: str) -> dict[str, Any]:
    path = os.path.join(medusa_dir, "config.json")
    settings = read_config_json(medusa_dir, "a Medusa checkpoint")
    heads, layers = settings.get("medusa_num_heads"), settings.get("medusa_num_layers", 1)
    if "medusa_num_heads" not in settings:
        raise ValueError(f"{path} has no medusa_num_heads: not a Medusa checkpoint")
    if not isinstance(heads, int) or heads < 1:
        raise ValueError(f"{path}: medusa_num_heads={heads!r} must be an int >= 1")
    if layers != 1:
        raise ValueError(f"{path}: medusa_num_layers={layers!r}; specjax's heads have one "
                         "residual block (Medusa-1's default)")
    return settings
