"""LayerSkip layer dropout: per-layer rates on the host, per-sample masks on the device."""

import jax
import numpy as np

from specjax.training.config import LayerSkipConfig


def depth_scale(num_layers: int) -> np.ndarray:
    """D(l) = exp(l ln2 / (L-1)) - 1 for l = 0..L-1: 0 at the first layer, 1 at the last."""
    if num_layers == 1:
        return np.zeros(1, np.float32)
    layers = np.arange(num_layers, dtype=np.float64)
    return (np.exp(layers * np.log(2) / (num_layers - 1)) - 1).astype(np.float32)


def time_scale(cfg: LayerSkipConfig, step: int, total_steps: int) -> float:
    """S(t): 1 ("constant") or exp(t ln2 / (T-1)) - 1 ("exp"), rising from 0 to 1."""
    if cfg.dropout_schedule == "constant" or total_steps <= 1:
        return 1.0
    return float(np.exp(step * np.log(2) / (total_steps - 1)) - 1)


def dropout_rates(cfg: LayerSkipConfig, num_layers: int, step: int,
                  total_steps: int) -> np.ndarray:
    """p_l(t) = S(t) * D(l) * p_max, [num_layers] float32."""
    return (time_scale(cfg, step, total_steps) * depth_scale(num_layers) * cfg.p_max).astype(
        np.float32)


def sample_keep_mask(key: jax.Array, rates: jax.Array, batch: int) -> jax.Array:
    """[L, batch] bool: layer l runs for sample b with probability 1 - rates[l]."""
    return jax.random.uniform(key, (rates.shape[0], batch)) >= rates[:, None]
