"""Hugging Face interop for the attention families beyond Llama, Mistral and Qwen2: for each,
a tiny random checkpoint imports with logits and greedy generation identical to transformers,
exports back bit for bit (in its own layout), and exits early through its own final norm.
Needs the `hf` extra; the reference models are created locally, in float32."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

from specjax import model as M  # noqa: E402
from specjax.convert.hf import export_checkpoint, import_checkpoint  # noqa: E402
from specjax.convert.hf_config import ConversionError, model_config_from_hf  # noqa: E402
from specjax.decoding.drafters.calm import CalmDraft  # noqa: E402
from specjax.decoding.drafters.calm_exit import EarlyExit  # noqa: E402
from specjax.decoding.drafters.layerskip import SelfSpeculative  # noqa: E402
from specjax.decoding.engine import Generator  # noqa: E402
from specjax.decoding.shapes.chain import Chain  # noqa: E402
from specjax.decoding.shapes.static_tree import StaticTree  # noqa: E402
from specjax.io.checkpoint import load_params  # noqa: E402

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

# GQA 4:2 with head_dim 12 (not d_model / heads), 3 layers, untied: every size differs.
BASE = dict(hidden_size=40, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=12, intermediate_size=56, vocab_size=97, tie_word_embeddings=False,
            initializer_range=0.2, pad_token_id=None, bos_token_id=None, eos_token_id=None)
# name: (config class, model class, options); windows of 5 < the 11 to 26 tokens tested
CONFIGS = {
    # layers 1 and 2 slide (from max_window_layers on)
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(use_sliding_window=True, sliding_window=5, max_window_layers=1)),
    # Mistral-7B-v0.1's window on every layer
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=5)),
    # layers 0 and 2 rotate, layer 1 is NoPE (the default interval would make only the 4th)
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(no_rope_layers=[1, 0, 1])),
    # RoPE on the first half of each head, as Phi-4-mini's 0.75 rotates part of it; a window
    # on every layer, as Phi-3-mini-4k's 2047
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(partial_rotary_factor=0.5, sliding_window=5)),
    # layers 0 and 2 slide, 1 is global; both soft-caps low enough to bite
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(query_pre_attn_scalar=16, sliding_window=5, attn_logit_softcapping=5.0,
                    final_logit_softcapping=10.0)),
    # a local theta far from the global one, so that swapping them shows; the global one
    # linearly scaled, as Gemma-3 4B-27B scale theirs (factor 8)
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(query_pre_attn_scalar=16, sliding_window=5,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    rope_parameters={
                        "full_attention": {"rope_type": "linear", "factor": 8.0,
                                           "rope_theta": 1e4},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
}
PROMPT = [5, 17, 3, 90, 42, 7]


def _hf_model(name, **extra):
    config_class, model_class, options = CONFIGS[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**{**BASE, **options, **extra})
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # norms start at one (or zero): make every norm weight matter
        for param_name, param in model.named_parameters():
            if "norm" in param_name:
                param.add_(0.3 * torch.randn_like(param))
    return model


def _damped(hf_model):
    """Gemma with the layers after the first contributing a tenth (their post-norms' 1 + w at
    0.1): exit 1 then drafts what the model decodes often enough for trees to be accepted."""
    with torch.no_grad():
        for layer in hf_model.model.layers[1:]:
            for norm in (layer.post_attention_layernorm, layer.post_feedforward_layernorm):
                norm.weight.fill_(-0.9)
    return hf_model


def _imported(name, tmp_path, damped=False):
    hf_model = _damped(_hf_model(name)) if damped else _hf_model(name)
    hf_model.save_pretrained(str(tmp_path / "hf"))
    import_checkpoint(str(tmp_path / "hf"), str(tmp_path / "workdir"))
    params, cfg, _ = load_params(str(tmp_path / "workdir"))
    return hf_model, params, cfg


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_and_greedy_tokens_match_transformers(name, tmp_path):
    """Catches each family's own math missing or misplaced (Qwen3: the per-head Q/K RMSNorm
    left out, applied after RoPE, or over the whole projection; SmolLM3: its NoPE layer
    rotated, or the wrong layer left unrotated; Phi-3: fused q/k/v or gate/up split at the
    wrong rows or in the wrong order, a partial rotation applied to the whole head; Gemma: any
    of its options left out; Mistral, Qwen3, Phi-3 and Gemma: a window on the wrong layers, or
    one key too many or too few), and a mis-mapped tensor: the logits would differ by far more
    than fp32 rounding and greedy decoding would diverge."""
    hf_model, params, cfg = _imported(name, tmp_path)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 11))
    with torch.no_grad():
        expected = hf_model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(jax.jit(M.forward, static_argnames="cfg")(params, cfg, tokens),
                               expected, atol=5e-5)
    with torch.no_grad():
        greedy = hf_model.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False,
                                   min_new_tokens=12)[0, len(PROMPT):].tolist()
    assert Generator(params, cfg).generate([PROMPT], max_new_tokens=12).tokens[0] == greedy
    assert len(set(greedy)) > 3  # a real continuation, not one repeated token


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_export_round_trip_is_bit_identical_in_the_familys_layout(name, tmp_path):
    """Catches a config.json naming another architecture than the imported one (a Qwen3
    read back as Llama drops its Q/K norms), a leaf written back transposed or split wrongly,
    and keys that make transformers compute another model (its logits would differ)."""
    hf_model, _, _ = _imported(name, tmp_path)
    exported = str(tmp_path / "exported")
    export_checkpoint(str(tmp_path / "workdir"), exported)
    original = load_file(os.path.join(tmp_path / "hf", "model.safetensors"))
    again = load_file(os.path.join(exported, "model.safetensors"))
    assert set(original) == set(again)
    for key, tensor in original.items():
        assert torch.equal(tensor, again[key]), key
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    assert type(reloaded) is type(hf_model)
    tokens = torch.tensor([PROMPT])
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, hf_model(tokens).logits)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_exit_at_layer_one_is_the_truncated_models_output(name, tmp_path):
    """Exit 1 (layer 1's hidden state through the shared head) equals transformers' model cut
    to its first layer (the same weights, num_hidden_layers=1), final norm and head included.
    Catches an exit head that skips the family's final norm or its logit transform, and a
    layer-1 output that depends on the layers after it."""
    _, params, cfg = _imported(name, tmp_path)
    truncated = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "hf"), num_hidden_layers=1).eval()
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, 9))
    with torch.no_grad():
        expected = truncated(torch.tensor(tokens)).logits.numpy()
    per_layer = M.run_layers(params, cfg, M.embed(params, cfg, jnp.asarray(tokens)))
    np.testing.assert_allclose(M.exit_logits(params, cfg, per_layer[0]), expected, atol=5e-5)


def test_what_specjax_does_not_compute_is_refused_in_one_line(tmp_path):
    """Catches Phi-3's longrope scaling and a dynamically scaled RoPE imported as plain RoPE,
    SmolLM3's sliding window as full attention, Gemma's bidirectional variant as a causal
    decoder (models that decode, but not as transformers does), and a fused qkv_proj that does not
    split into config.json's heads reaching a traceback instead of naming both."""
    gemma = _hf_model("gemma3")
    gemma.save_pretrained(str(tmp_path / "gemma"))
    hf = json.loads((tmp_path / "gemma" / "config.json").read_text())
    dynamic = {**hf, "rope_parameters": {**hf["rope_parameters"], "full_attention": {
        "rope_type": "dynamic", "factor": 8.0, "rope_theta": 1e6}}}
    with pytest.raises(ConversionError, match="^rope type 'dynamic' is not supported"):
        model_config_from_hf(dynamic)
    with pytest.raises(ConversionError, match="^Gemma with use_bidirectional_attention=true"):
        model_config_from_hf({**hf, "use_bidirectional_attention": True})
    hf_model = _hf_model("phi3")
    source = str(tmp_path / "hf")
    hf_model.save_pretrained(source)
    hf = json.loads(open(os.path.join(source, "config.json")).read())
    longrope = {**hf, "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4,
                                          "short_factor": [1.0] * 3, "long_factor": [2.0] * 3}}
    with pytest.raises(ConversionError, match="^rope type 'longrope' is not supported"):
        model_config_from_hf(longrope)
    with pytest.raises(ConversionError, match="^SmolLM3ForCausalLM with sliding_window=2047 is "
                                              "not supported"):
        model_config_from_hf({**hf, "architectures": ["SmolLM3ForCausalLM"],
                              "sliding_window": 2047, "use_sliding_window": True})
    with open(os.path.join(source, "config.json"), "w") as f:
        json.dump({**hf, "num_key_value_heads": 1}, f)
    with pytest.raises(ConversionError, match=r"model.layers.0.self_attn.qkv_proj.weight "
                                              r"\(96, 40\) does not split into the \(48, 12, 12\)"):
        import_checkpoint(source, str(tmp_path / "workdir"))


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_speculation_over_sliding_windows_equals_autoregressive_decoding(name, tmp_path):
    """Self-speculative chains and trees and CALM's state propagation on Gemma's windows of 5
    (as wide as a round: the pending token and 4 drafts; the tree's depth-2 nodes sit in slots
    past their positions), 20 tokens past a 6-token prompt, equal `ar` token for token; a round
    wider than the window is refused in one line (the damped model: drafts are accepted, deep
    nodes included). Catches a tree node's window taken from its slot instead of its position
    (a verified node seeing one key fewer than `ar` does)."""
    _, params, cfg = _imported(name, tmp_path, damped=True)
    generator = Generator(params, cfg)
    reference = generator.generate([PROMPT], max_new_tokens=20).tokens
    strategies = [SelfSpeculative(1, Chain(4)),
                  SelfSpeculative(1, StaticTree.from_branching((2, 1))),
                  CalmDraft(EarlyExit((1, 2)), 0.3, 4.0, Chain(3))]
    for strategy in strategies:
        out = generator.generate([PROMPT], max_new_tokens=20, strategy=strategy)
        assert out.tokens == reference and out.total.accepted > 0, strategy
    with pytest.raises(ValueError, match=r"^ModelConfig.sliding_window=5 is narrower than a "
                                         r"decoding round's 6 tokens \(1 \+ the drafts\): "
                                         r"draft fewer$"):
        generator.generate([PROMPT], max_new_tokens=20, strategy=SelfSpeculative(1, Chain(5)))


@pytest.mark.parametrize("name, config_class, derived, layers", [
    ("smollm3", "SmolLM3Config", ("no_rope_layers",), 8),
    ("gemma2", "Gemma2Config", ("layer_types", "query_pre_attn_scalar"), 5),
    ("gemma3", "Gemma3TextConfig", ("layer_types", "query_pre_attn_scalar"), 13),
])
def test_what_config_json_leaves_out_is_derived_as_transformers_derives_it(
        name, config_class, derived, layers):
    """Catches SmolLM3's NoPE layers counted from layer 0 (`no_rope_layer_interval`), Gemma's
    global layers off by one (`sliding_window_pattern`) and Gemma's score scale falling back
    to head_dim instead of 256, in a config.json without the derived keys (older files, hand
    written ones): the NoPE layers, sliding layers and scale equal those of transformers'
    config class built from the same keys."""
    base = dict(hidden_size=40, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, head_dim=12, intermediate_size=56, vocab_size=97,
                sliding_window=5)
    reference = getattr(transformers, config_class)(**base)
    hf = {**reference.to_dict(), "architectures": [{
        "smollm3": "SmolLM3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
        "gemma3": "Gemma3ForCausalLM"}[name]]}
    for key in derived:
        hf.pop(key, None)
    cfg = model_config_from_hf(hf)
    if name == "smollm3":
        assert cfg.nope_layers == tuple(i for i, r in enumerate(reference.no_rope_layers) if not r)
        assert cfg.nope_layers  # the interval leaves some layers without RoPE
        return
    assert cfg.sliding_layers == tuple(i for i, kind in enumerate(reference.layer_types)
                                       if kind == "sliding_attention")
    assert 0 < len(cfg.sliding_layers) < layers
    assert cfg.query_pre_attn_scalar == reference.query_pre_attn_scalar == 256
