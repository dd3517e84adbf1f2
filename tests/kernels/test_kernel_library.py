"""Building the CPU kernels (`specjax.kernels.library`): each is built where a compiler exists,
and decoding falls back to XLA's ops when a kernel is switched off or its build fails."""

import os
import shutil
import subprocess
import sys

import pytest

from specjax.kernels import KERNELS, cpu_attention, cpu_matmul, library

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out


@pytest.mark.parametrize("name", KERNELS)
def test_each_kernel_builds_where_a_compiler_exists(name):
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler on this machine")
    assert KERNELS[name].available()


@pytest.mark.parametrize("env,expected", [
    ({cpu_matmul.SWITCH: "0"}, ["False", "True"]),
    ({cpu_attention.SWITCH: "0"}, ["True", "False"]),
    ({"CXX": "false"}, ["False", "False"]),
], ids=["matmul-off", "attention-off", "failing-compiler"])
def test_without_a_kernel_decoding_falls_back_to_xla(env, expected, tmp_path):
    """Switched off, or when the build fails (a 'compiler' that exits 1): that kernel is not
    used, each failed build logs one warning, and decoding still runs (XLA's ops)."""
    probe = ("import jax; from specjax.kernels import cpu_attention, cpu_matmul; "
             "from specjax.config import ModelConfig; from specjax.model import init_params; "
             "from specjax.decoding.engine import Generator; "
             "cfg = ModelConfig(vocab_size=16, d_model=32, num_layers=2, num_heads=2, "
             "num_kv_heads=1, mlp_dim=32); "
             "out = Generator(init_params(cfg, jax.random.PRNGKey(0)), cfg).generate("
             "[[1, 2, 3]], max_new_tokens=4); "
             "print(cpu_matmul.available(), cpu_attention.available(), len(out.tokens[0]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "SPECJAX_KERNEL_CACHE": str(tmp_path), **env})
    assert out.stdout.split() == [*expected, "4"]
    for kernel in KERNELS.values():
        assert (f"{kernel.SOURCE} unavailable" in out.stderr) == ("CXX" in env)


def test_xla_only_names_the_kernels_it_knows():
    known = "kernels: cpu_attention.cc, cpu_matmul.cc$"
    with pytest.raises(ValueError, match=f"unknown kernel 'cpu_conv.cc'; {known}"):
        with library.xla_only("cpu_conv.cc"):
            pass
    with library.xla_only(cpu_attention.SOURCE):
        assert not cpu_attention.available()
        assert cpu_matmul.available() == (shutil.which(os.environ.get("CXX", "c++")) is not None)
    assert cpu_attention.available() == cpu_matmul.available()
