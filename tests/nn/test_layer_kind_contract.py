"""A layer kind is one `LayerKind` entry: a toy kind registered here, in a test file, trains,
decodes losslessly, is laid out on a mesh, survives a checkpoint and round-trips through
Hugging Face safetensors without a change to the package."""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from specjax import model as M
from specjax import sharding
from specjax.convert.hf_weights import load_hf_params, save_hf_params
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import Generator
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.io.checkpoint import load_params
from specjax.nn.hf_layout import HfLeaf, same, same_to_hf, transpose, transpose_to_hf
from specjax.nn.layer_kinds import LAYER_KINDS, LayerKind
from specjax.training.trainer import Trainer
from tests.support.models import TINY_MODEL, tiny_run

PATTERN = ("attention", "toy", "attention", "toy")
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 52))]
NEW = 10


class ToyCache(NamedTuple):
    """A cache leaf per row that the toy layer never changes (it mixes no tokens)."""

    rows: jax.Array

    def commit(self, before: jax.Array, after: jax.Array, path: jax.Array | None) -> "ToyCache":
        return self


def _toy_init(cfg, key):
    up, down = jax.random.split(key)
    return {"norm": {"scale": jnp.ones((cfg.d_model,))},
            "toy": {"up": 0.3 * jax.random.normal(up, (cfg.d_model, cfg.mlp_dim)),
                    "down": 0.3 * jax.random.normal(down, (cfg.mlp_dim, cfg.d_model))}}


def _toy_mlp(params, hidden):
    """A residual gated MLP on each token alone: RMS norm, up, SiLU, down."""
    normed = hidden * jax.lax.rsqrt(jnp.mean(hidden**2, -1, keepdims=True) + 1e-5)
    up = jax.nn.silu((normed * params["norm"]["scale"]) @ params["toy"]["up"])
    return hidden + up @ params["toy"]["down"]


TOY = LayerKind(
    params_key="toy_layers", init=_toy_init,
    forward=lambda cfg, params, hidden, rope, mask: _toy_mlp(params, hidden),
    cached=lambda cfg, params, hidden, cache, step: (_toy_mlp(params, hidden), cache),
    propagate=lambda cfg, params, hidden, cache, step: cache,
    allocate=lambda cfg, batch, max_len, window: ToyCache(jnp.zeros((batch, 1))),
    step_bytes=lambda cfg, context: 0.0, mixing_flops=lambda cfg, seq_len: 0.0,
    param_axes={("toy", "up"): ("embed", "mlp"), ("toy", "down"): ("mlp", "embed")},
    cache_axes={"rows": ("batch", None)},
    hf_leaves=lambda cfg: (
        HfLeaf(("norm", "scale"), ("{layer}toy_norm.weight",), same, same_to_hf),
        HfLeaf(("toy", "up"), ("{layer}toy.up_proj.weight",), transpose, transpose_to_hf),
        HfLeaf(("toy", "down"), ("{layer}toy.down_proj.weight",), transpose, transpose_to_hf)))


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(LAYER_KINDS, "toy", TOY)
    return M.ModelConfig(**{**TINY_MODEL, "layer_pattern": PATTERN, "exit_layers": (1, 2, 4)})


def test_a_toy_kind_trains_and_survives_a_checkpoint(toy, tmp_path):
    """Catches a layer table that is not the one place a kind is declared: training, its
    checkpoint and the stacks it saves reach only the kinds the package names."""
    run = tiny_run(model={"layer_pattern": PATTERN, "exit_layers": (1, 2, 4)},
                   train=dict(total_steps=6, eval_every=6, save_every=6))
    result = Trainer(run, str(tmp_path)).fit()
    assert np.isfinite(result.report.final_loss)
    params, cfg, _ = load_params(str(tmp_path))
    assert cfg.layer_kinds == PATTERN and params["toy_layers"]["toy"]["up"].shape[0] == 2
    fresh = M.init_params(cfg, jax.random.PRNGKey(0))
    assert not np.allclose(params["toy_layers"]["toy"]["up"], fresh["toy_layers"]["toy"]["up"])


def test_a_toy_kind_decodes_as_a_per_step_argmax_of_the_model(toy):
    """Catches a decode path that skips or mis-orders a registered kind's cached pass: greedy
    `ar`, a chain and a tree through the toy layers equal the whole-sequence model's argmax."""
    params = M.init_params(toy, jax.random.PRNGKey(1))
    forward = jax.jit(functools.partial(M.forward, cfg=toy))
    rows = [list(p) for p in PROMPTS]
    width = max(map(len, PROMPTS)) + NEW
    for _ in range(NEW):
        logits = forward(params, tokens=jnp.asarray([r + [0] * (width - len(r)) for r in rows]))
        for i, row in enumerate(rows):
            row.append(int(jnp.argmax(logits[i, len(row) - 1])))
    expected = [row[len(p):] for row, p in zip(rows, PROMPTS, strict=True)]
    generator = Generator(params, toy)
    for strategy in (None, SelfSpeculative(2, Chain(3)),
                     SelfSpeculative(1, StaticTree.from_branching((2, 1)))):
        kwargs = {} if strategy is None else {"strategy": strategy}
        assert generator.generate(PROMPTS, max_new_tokens=NEW, **kwargs).tokens == expected


def test_a_toy_kind_is_laid_out_by_what_it_declares(toy):
    """Catches layout tables that name the package's kinds only (a new kind's weights silently
    replicated, its cache leaves a KeyError)."""
    assert sharding.param_axes(["toy_layers", "toy", "up"], 3) == ("layers", "embed", "mlp")
    assert sharding.param_axes(["toy_layers", "norm", "scale"], 2) == ("layers", "embed")
    mesh = jax.sharding.AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"))
    cache = M.allocate_cache(toy, 4, 32)
    specs = sharding.cache_specs(mesh, cache, 4)
    assert specs.layers[1] == ToyCache(PartitionSpec(("data", "fsdp"), None))
    assert specs.layers[0].k[0][:2] == ("data", "fsdp")  # the built-in kinds: unchanged


def test_two_kinds_may_not_disagree_on_a_parameter_layout(toy, monkeypatch):
    """Catches a second kind silently overriding the first's layout of a shared key."""
    clash = LayerKind(**{**TOY.__dict__, "param_axes": {("toy", "up"): ("mlp", "embed")}})
    monkeypatch.setitem(LAYER_KINDS, "clash", clash)
    with pytest.raises(ValueError, match="declares param_axes"):
        sharding.param_axes(["toy_layers", "toy", "up"], 3)


def test_a_toy_kind_round_trips_through_hugging_face_safetensors(toy, tmp_path):
    """Catches Hugging Face tables that name only the package's kinds (`convert` refusing a
    kind that declares its tensors), or leaves written under one name and read under another."""
    params = M.init_params(toy, jax.random.PRNGKey(3))
    save_hf_params(params, toy, str(tmp_path), "LlamaForCausalLM")
    back = load_hf_params(str(tmp_path), toy, "LlamaForCausalLM")
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(got, want)
