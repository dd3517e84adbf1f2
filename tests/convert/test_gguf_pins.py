"""GGUF import pinned where the fresh audit's plants got past tests/test_gguf.py: metadata
every test file wrote with Llama-2's default value."""

import jax
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

from specjax import model as M  # noqa: E402
from specjax.convert.gguf import GgufCheckpoint  # noqa: E402
from specjax.convert.hf import import_checkpoint  # noqa: E402
from specjax.io.checkpoint import load_params  # noqa: E402
from tests.convert import test_gguf  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_rope_base_is_read_from_the_file(tmp_path, monkeypatch):
    """Catches `llama.rope.freq_base` ignored (the base fixed at Llama-2's 10,000, where
    SmolLM2's is 100,000 and Llama-3's 500,000): a file written with a base of 500,000 imports
    with that rope_theta, and its logits over 11 positions equal transformers' on the model it
    was written from (the base changes every position after the first)."""
    monkeypatch.setitem(test_gguf.SIZES, "rope_theta", 500000.0)
    hf_model = test_gguf.hf_llama(initializer_range=0.2)
    path = tmp_path / "theta.gguf"
    test_gguf.write_gguf(path, hf_model, {})
    assert GgufCheckpoint(str(path)).hf_config()["rope_theta"] == 500000.0
    tokens = np.random.default_rng(0).integers(0, test_gguf.SIZES["vocab_size"], (2, 11))
    with torch.no_grad():
        expected = hf_model(torch.tensor(tokens)).logits.numpy()
    cfg = import_checkpoint(str(path), str(tmp_path / "w"))
    assert cfg.rope_theta == 500000.0
    params, _, _ = load_params(str(tmp_path / "w"))
    logits = jax.jit(M.forward, static_argnames="cfg")(params, cfg, tokens)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=2e-4)
