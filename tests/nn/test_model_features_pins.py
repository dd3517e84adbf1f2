"""Model features pinned where the fresh audit's plants got past tests/convert/
test_hf_families.py (which imports trained weights, never starts from init): a fresh model's
(1 + w) norms, by hand."""

import jax
import numpy as np

from specjax.config import ModelConfig
from specjax.model import init_params
from specjax.nn.norm import apply_rms_norm
from tests.support.models import TINY_MODEL


def test_a_fresh_models_norms_start_as_the_plain_rms_norm():
    """Every RMSNorm of a freshly initialised model scales by 1: a weight of 1 (w), or of 0
    where the norm scales by 1 + w (Gemma's `norm_offset`, with its post norms). Catches the
    offset added instead of subtracted in the initial weight (Gemma-style models training from
    scratch start with every norm doubling its input: a different model than configured)."""
    x = np.random.default_rng(0).normal(size=(2, 3, TINY_MODEL["d_model"])).astype(np.float32)
    plain = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    for offset in (0.0, 1.0):
        cfg = ModelConfig(**TINY_MODEL, norm_offset=offset, post_norms=True, norm_eps=1e-6)
        params = init_params(cfg, jax.random.PRNGKey(0))
        scales = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)
                  if "scale" in jax.tree_util.keystr(path)]
        assert len(scales) == 5  # stacked: before and after attention and MLP; the final norm
        for scale in scales:
            np.testing.assert_array_equal(np.asarray(scale), 1.0 - offset)
            normed = apply_rms_norm(x, np.asarray(scale).reshape(-1, x.shape[-1])[-1], cfg)
            np.testing.assert_allclose(np.asarray(normed), plain, rtol=1e-5, atol=1e-6)

