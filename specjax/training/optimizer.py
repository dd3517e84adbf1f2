"""AdamW with linear warmup, cosine decay and global-norm clipping (optax)."""

import jax
import optax

from specjax.nn.layer_kinds import LAYER_KINDS
from specjax.training.config import TrainConfig

# Parameters that weight decay leaves alone, besides norm scales (Mamba-2's A_log, D, dt_bias).
NO_DECAY = frozenset(name for kind in LAYER_KINDS.values() for name in kind.no_decay)


def learning_rate_schedule(cfg: TrainConfig) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.total_steps, end_value=cfg.learning_rate * cfg.min_lr_ratio)


def _decay_mask(params):
    """Weight decay on matrices and embeddings, not on norm scales nor on `NO_DECAY`."""
    def decays(path, _):
        keys = [str(getattr(p, "key", "")) for p in path]
        return not any("norm" in key or key in NO_DECAY for key in keys)
    return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """AdamW on every parameter but the top-level groups `cfg.frozen` names, which never change
    and hold no optimizer state (gradient clipping sees the trained parameters only)."""
    adamw = optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2,
                    weight_decay=cfg.weight_decay, mask=_decay_mask))
    if not cfg.frozen:
        return adamw

    def labels(params):
        missing = sorted(set(cfg.frozen) - set(params))
        if missing:
            raise ValueError(f"train.frozen names {missing}, which this model does not have "
                             f"(its groups: {sorted(params)})")
        return {key: jax.tree.map(lambda _, key=key: "frozen" if key in cfg.frozen else "train",
                                  value) for key, value in params.items()}

    return optax.multi_transform({"train": adamw, "frozen": optax.set_to_zero()}, labels)
