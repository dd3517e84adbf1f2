"""The families' config.json reading pinned where the fresh audit's plants got past
tests/test_hf_families.py (whose configs are written by transformers 5, with `layer_types`):
a config.json of an older transformers, read against transformers' own derivation (Qwen's
windows) or by hand (Gemma-3's two RoPE bases)."""

import pytest

transformers = pytest.importorskip("transformers")

from specjax.convert.hf_config import model_config_from_hf  # noqa: E402

SIZES = dict(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=64)


@pytest.mark.parametrize("family", ["Qwen2", "Qwen3"])
@pytest.mark.parametrize("first", [1, 2, 3])
def test_qwens_sliding_layers_without_layer_types_start_at_max_window_layers(family, first):
    """A Qwen2/Qwen3 config.json without `layer_types` (transformers 4 wrote none) slides
    from layer `max_window_layers` on, as transformers derives `layer_types` from it. Catches
    the boundary off by one (sliding from max_window_layers + 1: one layer attending past
    its window, logits unlike the checkpoint's from the window's end on)."""
    config = getattr(transformers, f"{family}Config")(
        **SIZES, use_sliding_window=True, sliding_window=5, max_window_layers=first)
    expected = tuple(i for i, kind in enumerate(config.layer_types) if kind == "sliding_attention")
    hf = {**config.to_dict(), "architectures": [f"{family}ForCausalLM"]}
    del hf["layer_types"]
    cfg = model_config_from_hf(hf)
    assert cfg.sliding_layers == expected == tuple(range(first, SIZES["num_hidden_layers"]))
    assert cfg.sliding_window == 5


def test_a_gemma3_config_of_transformers_4_rotates_sliding_layers_at_its_local_base():
    """Gemma-3's config.json as transformers 4 wrote it (no `rope_parameters`; `rope_theta`
    for the global layers, `rope_local_base_freq` for the sliding ones, by hand) imports both
    bases. Catches the local base's key misread (the sliding layers rotated at the default
    10,000 whatever the checkpoint says: logits unlike its own from the first position on)."""
    config = transformers.Gemma3TextConfig(**SIZES, head_dim=8)
    hf = {**config.to_dict(), "architectures": ["Gemma3ForCausalLM"],
          "rope_theta": 500000.0, "rope_local_base_freq": 25000.0}
    del hf["rope_parameters"]
    cfg = model_config_from_hf(hf)
    assert (cfg.rope_theta, cfg.local_rope_theta) == (500000.0, 25000.0)
