"""Which exits the early-exit loss supervises at each step, and with what weight.

The host builds, for every step, `exit_layers` [M] (exit numbers, 1..L) and `exit_weights` [M]
(normalised, zero for padding). M is fixed for a run (`max_active_exits`), so the compiled train
step never changes; only these arrays do.
"""

import numpy as np

from specjax.training.config import LayerSkipConfig


def curriculum_mask(cfg: LayerSkipConfig, exits: tuple[int, ...], num_layers: int, step: int,
                    total_steps: int) -> np.ndarray:
    """Bool over `exits`: which are enabled at `step`. The final exit, if listed, is always on.

    - "none": every exit.
    - "rotational": every R-th early exit, the pattern shifted by one layer each step
      (exit e is on when (e - 1 - step) mod R == 0).
    - "gradual": exits switch on from the top down; exit e is on once
      step / total_steps >= (L - e) / (2L).
    """
    exits_arr = np.asarray(exits)
    if cfg.curriculum == "none":
        mask = np.ones(len(exits), bool)
    elif cfg.curriculum == "rotational":
        mask = (exits_arr - 1 - step) % cfg.rotation_interval == 0
    else:
        mask = step / total_steps >= (num_layers - exits_arr) / (2 * num_layers)
    return mask | (exits_arr == num_layers)


def max_active_exits(cfg: LayerSkipConfig, exits: tuple[int, ...], num_layers: int) -> int:
    """The most exits any step enables: the static size M of the per-step arrays."""
    if cfg.curriculum != "rotational":
        return len(exits)
    return max(int(curriculum_mask(cfg, exits, num_layers, shift, 1).sum())
               for shift in range(cfg.rotation_interval))


def raw_exit_weights(cfg: LayerSkipConfig, exits: tuple[int, ...], num_layers: int,
                     step: int) -> np.ndarray:
    """e_scale * s(e) for early exits (ramped from 0 over `e_scale_warmup` steps), s(L) for the
    final exit (see LayerSkipConfig)."""
    e = np.asarray(exits, np.float64)
    scale = {"uniform": np.ones_like(e), "linear": e, "sum": e * (e + 1) / 2}[cfg.exit_scale]
    ramp = min(1.0, step / cfg.e_scale_warmup) if cfg.e_scale_warmup else 1.0
    return np.where(e == num_layers, scale, cfg.e_scale * ramp * scale)


def exit_schedule(cfg: LayerSkipConfig, exits: tuple[int, ...], num_layers: int, step: int,
                  total_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(exit_layers [M] int32, exit_weights [M] float32) for `step`; weights sum to 1."""
    size = max_active_exits(cfg, exits, num_layers)
    mask = curriculum_mask(cfg, exits, num_layers, step, total_steps)
    weights = raw_exit_weights(cfg, exits, num_layers, step) * mask
    if weights.sum() <= 0:
        raise ValueError(f"no exit has positive loss weight at step {step}: exits={exits}, "
                         f"curriculum={cfg.curriculum!r}, e_scale={cfg.e_scale}")
    active = np.flatnonzero(mask)
    layers = np.full(size, exits[active[-1]], np.int32)
    chosen = np.zeros(size, np.float32)
    layers[:len(active)] = np.asarray(exits)[active]
    chosen[:len(active)] = weights[active] / weights.sum()
    return layers, chosen
