"""The train step's model FLOPs and `bench/step_bench.py`, which turns them into model-FLOPs
utilisation; the 1B bfloat16 config it is meant to run on a GPU."""

import math

import jax
import jax.numpy as jnp
import pytest

from specjax.config import ModelConfig, SsmConfig
from specjax.configs.tiny_code import get_config
from specjax.model import forward, init_params
from specjax.training.flops import train_flops_per_token
from tests.support.models import TINY_MODEL, tiny_run
from tests.support.scripts import run_script

SSM = SsmConfig(num_heads=4, head_dim=16, state_size=8, groups=2, chunk_size=16)


@pytest.mark.parametrize("extra", [{}, dict(layer_pattern=("mamba2",), ssm=SSM)],
                         ids=["attention", "mamba2"])
def test_the_counted_flops_are_what_xla_counts_for_a_forward_pass(extra):
    """One layer (XLA counts a scanned loop's body once) and one exit: a third of the training
    count per token, times the tokens, is XLA's count of `forward` less its elementwise work
    (norms, softmax, activations: 5-10% here). Catches a dropped attention or scan term (-20%
    here), a weight counted twice or skipped, a forward pass not counted as 2 FLOPs a weight."""
    cfg = ModelConfig(**{**TINY_MODEL, "num_layers": 1, "exit_layers": (1,), **extra})
    tokens = jnp.zeros((2, 64), jnp.int32)
    cost = jax.jit(forward, static_argnames="cfg").lower(
        init_params(cfg, jax.random.PRNGKey(0)), cfg, tokens).cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    counted = train_flops_per_token(cfg, 64) / 3 * tokens.size
    assert 1.0 <= cost["flops"] / counted <= 1.15


def test_the_gpu_config_is_a_one_billion_parameter_bfloat16_model():
    cfg = ModelConfig.from_dict(get_config("gpu1b").model)
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    assert 1.0e9 < sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes)) < 1.1e9
    assert {leaf.dtype for leaf in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.bfloat16)}


def test_step_bench_reports_step_times_and_utilisation(tmp_path):
    """The README's command on a tiny config, with a made-up peak: both programs' step times,
    their ratio, TFLOP/s and the utilisation."""
    config = tmp_path / "config.py"
    run = tiny_run(train=dict(batch_size=4))
    config.write_text("import ml_collections\n\n\ndef get_config():\n    return "
                      f"ml_collections.ConfigDict({run!r})\n")
    result = run_script("bench/step_bench.py", f"--config={config}", "--steps=2",
                        "--peak_tflops=0.001")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if "ms/step" in line]
    assert len(lines) == 2 and lines[0].startswith("plain jit")
    assert all("TFLOP/s per device = " in line and "% of the 0.001 peak" in line for line in lines)
