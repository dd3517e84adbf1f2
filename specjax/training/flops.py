"""Model FLOPs of training, for model-FLOPs utilisation (MFU): what the model needs, counted from
its shapes, not what the compiled program happens to run (rematerialisation is not counted)."""

from __future__ import annotations

import math

import jax

from specjax.config import ModelConfig
from specjax.model import init_params, matmul_weights, unstack_layers
from specjax.nn.layer_kinds import LAYER_KINDS


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """FLOPs to train on one token of sequences of `seq_len`: 3 forward passes' worth (the
    backward pass costs two), a forward pass being 2 per weight multiplied (the head once per
    supervised exit, as the early-exit loss computes each exit's logits) plus each layer's
    sequence mixing (`LayerKind.mixing_flops`)."""
    shapes = jax.eval_shape(lambda: unstack_layers(init_params(cfg, jax.random.PRNGKey(0)), cfg))
    head = "embed" if cfg.tie_embeddings else "unembed"
    weights = sum(math.prod(leaf.shape) * (len(cfg.supervised_exits) if top == head else 1)
                  for top, leaf in matmul_weights(shapes, cfg))
    mixing = sum(LAYER_KINDS[name].mixing_flops(cfg, seq_len) for name in cfg.layer_kinds)
    return 3 * (2 * weights + mixing)
