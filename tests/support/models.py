"""Tiny models and runs: every test model compiles in seconds on a 2-core CPU."""

import copy
import dataclasses

import jax

from specjax.config import ModelConfig
from specjax.model import init_params, unstack_layers

TINY_MODEL = dict(vocab_size=259, d_model=32, num_layers=4, num_heads=4, num_kv_heads=2,
                  mlp_dim=64)


TINY_RUN = {
    "model": TINY_MODEL,
    "data": dict(source="stdlib", seq_len=32, val_fraction=0.1, max_documents=60),
    "train": dict(batch_size=4, total_steps=12, learning_rate=3e-3, warmup_steps=2,
                  eval_every=6, eval_batches=2, save_every=6, keep_checkpoints=2, log_every=3),
    "layerskip": dict(p_max=0.1, dropout_schedule="constant", e_scale=1.0,
                      exit_scale="uniform", curriculum="rotational", rotation_interval=2),
}


def tiny_run(**sections) -> dict:
    """A copy of TINY_RUN with the given sections' fields overridden."""
    run = copy.deepcopy(TINY_RUN)
    for section, values in sections.items():
        run.setdefault(section, {}).update(values)
    return run


def damped_params(cfg: ModelConfig, key: jax.Array, deep_scale: float):
    """Random parameters whose layers after the first write less into the residual stream, so
    shallow exits agree with the final layer part of the time: speculation tests then see
    rejections, long accepted runs and bonus tokens. Every projection into the residual stream
    (attention `out`, MLP `down`, Mamba-2 `out_proj`) of every kind's stack is scaled."""
    from specjax.nn.layer_kinds import LAYER_KINDS

    params = dict(init_params(cfg, key))
    for name, kind in LAYER_KINDS.items():
        if kind.params_key not in params:
            continue
        layers = [i for i, k in enumerate(cfg.layer_kinds) if k == name]
        scale = jax.numpy.asarray([1.0 if i == 0 else deep_scale for i in layers])

        def damp(path, w, scale=scale):
            if path[-1].key in ("out", "down", "out_proj"):
                return w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
            return w

        params[kind.params_key] = jax.tree_util.tree_map_with_path(damp, params[kind.params_key])
    return params


def first_layers(params, cfg: ModelConfig, count: int):
    """A draft model made of a model's first `count` layers (of whichever kinds) and its head:
    (its decoding params, its config). On damped params it agrees with the model part of the
    time."""
    draft_cfg = dataclasses.replace(cfg, num_layers=count, layer_pattern=(
        None if cfg.layer_pattern is None else cfg.layer_kinds[:count]))
    params = unstack_layers(params, cfg)
    return {**params, "layers": params["layers"][:count]}, draft_cfg


def model_workdir(path: str, params, cfg: ModelConfig, **meta) -> str:
    """A workdir holding `params` of `cfg` as step 0 (a base for imported heads), its
    checkpoint's metadata added to or replaced by `meta`."""
    from specjax.io.checkpoint import Checkpointer

    checkpoints = Checkpointer(path)
    checkpoints.save(0, params, None, {"step": 0, "data_position": 0, "model": cfg.to_dict(),
                                       "tokenizer": "bytes", **meta})
    checkpoints.close()
    return path


def noisy(tree, scale: float, seed: int = 3):
    """`tree` with Gaussian noise of std `scale` added to every leaf (a key per leaf from
    `seed`): a drafter's weights that agree with the target only in part."""
    leaves, structure = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return jax.tree.unflatten(structure, [w + scale * jax.random.normal(k, w.shape)
                                          for w, k in zip(leaves, keys, strict=True)])
