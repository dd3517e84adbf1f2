"""LayerSkip steps, heads and distillation on a frozen base, and greedy decoding on a mesh,
shared by tests/training/test_sharding.py and the 8-device subprocess it starts (`python -m
tests.support.mesh_training OUT_JSON CHECKPOINT_DIR`)."""

import dataclasses
import json
import sys
from typing import Any

import jax
import numpy as np
import optax

from specjax.config import ModelConfig, SsmConfig
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.drafters.draft_model import DraftModel
from specjax.decoding.drafters.kangaroo import Kangaroo
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import AUTOREGRESSIVE, Generator
from specjax.decoding.loop import generate_tokens
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.heads.kangaroo import init_adapter
from specjax.io.checkpoint import Checkpointer, abstract_tree
from specjax.model import allocate_cache, init_params, unstack_layers
from specjax.sharding import (
    MeshConfig,
    batch_sharding,
    make_mesh,
    tree_shardings,
    with_shardings,
)
from specjax.training.config import parse_run_config
from specjax.training.distill import Distill
from specjax.training.frozen_base import FrozenBase
from specjax.training.heads.kangaroo import KangarooAdapter
from specjax.training.objective import LayerSkip, Objective, step_schedule
from specjax.training.registry import make_objective
from tests.support.models import tiny_run

MESHES = {"8,1,1": (8, 1, 1), "2,2,2": (2, 2, 2), "1,4,2": (1, 4, 2)}
STEPS, MORE = 3, 2  # steps before the checkpoint, steps after restoring it
BATCHES = np.random.default_rng(0).integers(0, 259, (STEPS + MORE, 8, 33))
MODEL = dict(num_kv_heads=2, num_heads=4, d_model=32, mlp_dim=64, vocab_size=260)


def objective(mesh: tuple[int, int, int]) -> LayerSkip:
    return make_objective(tiny_run(model=MODEL, train=dict(batch_size=8, total_steps=10),
                                   mesh=dict(zip(("data", "fsdp", "tensor"), mesh,
                                                 strict=True))))


DECODE_MESH = (4, 1, 2)  # 8 prompts' rows over data, heads / MLP / vocabulary over tensor
PROMPTS = [[1, 5, 9, 3], [7], [4, 8, 15, 16, 23, 42], [3, 3]] * 2
ATTENTION = ModelConfig(**MODEL, num_layers=4, init_std=0.3)
HYBRID = ModelConfig(**MODEL, num_layers=4, init_std=0.3,
                     layer_pattern=("mamba2", "attention", "mamba2", "attention"),
                     ssm=SsmConfig(num_heads=4, head_dim=8, state_size=8, groups=2, chunk_size=8))
DRAFT = dataclasses.replace(ATTENTION, num_layers=2)  # the draft model's config
DECODINGS = {  # name: (model, strategy)
    "ar": (ATTENTION, AUTOREGRESSIVE),
    "selfspec chain eta": (ATTENTION, SelfSpeculative(1, Chain(4, 0.3))),
    "kangaroo tree": (ATTENTION, Kangaroo(1, StaticTree.from_branching((2, 1)))),
    "draft model chain": (ATTENTION, DraftModel(Chain(3))),
    "hybrid static tree": (HYBRID, SelfSpeculative(1, StaticTree.from_branching((2, 2, 1)))),
}


def decode(mesh: tuple[int, int, int] | None) -> dict[str, list[list[int]]]:
    """Greedy tokens of each decoding of 6 prompts (a batch bucket of 8: two padding rows), on
    one device (None) or on a mesh of all devices."""
    mesh = None if mesh is None else make_mesh(MeshConfig(*mesh))
    tokens = {}
    for name, (cfg, strategy) in DECODINGS.items():
        params = init_params(cfg, jax.random.PRNGKey(0))
        weights = {"kangaroo": DraftWeights(init_adapter(params, cfg, 1), exit_layer=1),
                   "draft": DraftWeights(unstack_layers(init_params(
                       DRAFT, jax.random.PRNGKey(1)), DRAFT), cfg=DRAFT)}
        generator = Generator(params, cfg, mesh=mesh, draft_weights=weights)
        tokens[name] = generator.generate(PROMPTS[:6], max_new_tokens=10,
                                          strategy=strategy).tokens
    return tokens


def cache_layout(mesh: tuple[int, int, int]) -> dict[str, str]:
    """The layout of an attention layer's K/V and a Mamba-2 layer's state, allocated for 4
    rows inside a program jitted on `mesh` (`Generator(mesh=)` runs its loop so)."""
    cfg = dataclasses.replace(HYBRID, num_layers=2, layer_pattern=("attention", "mamba2"))
    with jax.set_mesh(make_mesh(MeshConfig(*mesh))):
        cache = jax.jit(lambda: allocate_cache(cfg, 4, 32, 4))()
    return {"k": _spec(cache.layers[0].k), "state": _spec(cache.layers[1].state)}


def heads(mesh: tuple[int, int, int]) -> dict[str, Any]:
    """Losses of a Kangaroo adapter and a distilled draft model trained on a frozen random base
    (the teacher) on `mesh`, and the layouts of the adapter, the base and the teacher there."""
    config = tiny_run(model=MODEL, train=dict(batch_size=8, total_steps=10),
                      mesh=dict(zip(("data", "fsdp", "tensor"), mesh, strict=True)))
    cfg = ModelConfig.from_dict(config["model"])
    base = FrozenBase("base", 0, init_params(cfg, jax.random.PRNGKey(1)), cfg,
                      {"tokenizer": "bytes"}, "random")
    on_base = {**config, "kangaroo": {"exit_layer": 1}}
    objectives = {
        "kangaroo": KangarooAdapter(parse_run_config(on_base, "kangaroo"), on_base, base),
        "distill": Distill(parse_run_config(config), config, base)}
    results = {}
    for name, obj in objectives.items():
        state, results[name] = train(obj, obj.init_state(), 0, STEPS)
        frozen = obj.base_params if name == "kangaroo" else obj.teacher_params
        results[f"{name} frozen mlp.down"] = _spec(frozen["layers"]["mlp"]["down"])
        results[f"{name} trained qkv"] = _spec(
            (state.params["attn"] if name == "kangaroo" else state.params["layers"]["attn"])["qkv"])
    return results


def _spec(array: jax.Array) -> str:
    return str(getattr(array.sharding, "spec", type(array.sharding).__name__))


def train(obj: Objective, state, first: int, count: int):
    """(state, losses) after `count` steps from step `first`."""
    losses = []
    for step in range(first, first + count):
        state, metrics = obj.train_step(state, BATCHES[step], step)
        losses.append(float(metrics["loss"]))
    return state, losses


def save(directory: str, state) -> None:
    checkpoints = Checkpointer(directory)
    checkpoints.save(STEPS, state.params, state.opt_state, {"step": STEPS})
    checkpoints.close()


def restore(obj: LayerSkip, directory: str):
    """The checkpoint restored straight onto `obj`'s mesh."""
    abstract = with_shardings(jax.eval_shape(obj.init_state), obj.state_shardings)
    checkpoints = Checkpointer(directory, create=False)
    params, opt_state, _ = checkpoints.restore(abstract_tree(abstract.params),
                                               abstract_tree(abstract.opt_state))
    checkpoints.close()
    return abstract.replace(step=np.int32(STEPS), params=params, opt_state=opt_state)


def export_step(obj: LayerSkip) -> list[str]:
    """The sharded train step exported for TPU and GPU from its sharded shapes alone."""
    state = with_shardings(jax.eval_shape(obj.init_state), obj.state_shardings)
    batch = jax.ShapeDtypeStruct(BATCHES.shape[1:], np.int32, sharding=batch_sharding(obj.mesh))
    exported = jax.export.export(obj.jitted_step, platforms=("tpu", "cuda"))(
        state, batch, jax.random.PRNGKey(0), step_schedule(obj.run, 0))
    return [*exported.platforms, f"{exported.nr_devices} devices"]


def export_decoding(mesh: tuple[int, int, int]) -> list[str]:
    """A selfspec tree's greedy and sampled generate loops on `mesh`, exported for TPU and GPU
    from the shapes and layouts `Generator(mesh=...)` gives their inputs."""
    mesh = make_mesh(MeshConfig(*mesh))
    params = jax.eval_shape(lambda: unstack_layers(init_params(ATTENTION, jax.random.PRNGKey(0)),
                                                   ATTENTION))
    params = with_shardings(params, tree_shardings(mesh, params))
    rows = [jax.ShapeDtypeStruct(shape, np.int32, sharding=batch_sharding(mesh, len(shape)))
            for shape in ((len(PROMPTS), 16), (len(PROMPTS),))]
    platforms = []
    for sampling in (None, SamplingParams.create(temperature=0.8, top_p=0.9)):
        fn = jax.jit(lambda p, prompts, lengths, key, sp: generate_tokens(
            p, {}, prompts, lengths, key, sp, np.int32(-1), cfg=ATTENTION,
            drafter=SelfSpeculative(1, StaticTree.from_branching((2, 1))), max_new_tokens=8,
            cache_len=32))
        exported = jax.export.export(fn, platforms=("tpu", "cuda"))(
            params, *rows, jax.random.PRNGKey(0), sampling)
        platforms.append(f"{'sampled' if sampling else 'greedy'}: "
                         f"{','.join(exported.platforms)} on {exported.nr_devices} devices")
    return platforms


def main(out_path: str, directory: str) -> None:
    results = {"devices": jax.device_count(), "losses": {}, "specs": {}}
    for name, mesh in MESHES.items():
        obj = objective(mesh)
        state, results["losses"][name] = train(obj, obj.init_state(), 0, STEPS)
        if name == "2,2,2":
            save(directory, state)
            layers = state.params["layers"]
            mu = optax.tree_utils.tree_get(state.opt_state, "mu")["layers"]
            results["specs"] = {
                "mlp.down": str(layers["mlp"]["down"].sharding.spec),
                "attn.qkv": str(layers["attn"]["qkv"].sharding.spec),
                "embed": str(state.params["embed"].sharding.spec),
                "mu mlp.down": str(mu["mlp"]["down"].sharding.spec)}
            results["exported for"] = export_step(obj)
    obj = objective((1, 8, 1))
    state = restore(obj, directory)
    results["restored spec"] = str(state.params["layers"]["mlp"]["down"].sharding.spec)
    _, results["continued"] = train(obj, state, STEPS, MORE)
    results["decoded"] = decode(DECODE_MESH)
    results["cache specs"] = cache_layout(DECODE_MESH)
    results["heads"] = heads((2, 2, 2))
    results["decoding exported for"] = export_decoding(DECODE_MESH)
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
