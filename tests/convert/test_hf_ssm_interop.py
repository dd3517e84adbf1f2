"""Hugging Face interop for state-space models: Mamba2ForCausalLM (Mamba-2 layers only) and
BambaForCausalLM (Mamba-2 and attention layers, each with an MLP; attention rotates half of each
head). Golden logits at every exit against transformers' torch path, greedy generation token for
token, bit-identical export round trips and clear errors for what cannot be converted. Needs the
`hf` extra; the reference models are created locally with odd sizes."""

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
from specjax.convert.hf_config import ConversionError  # noqa: E402
from specjax.decoding.engine import Generator  # noqa: E402
from specjax.io.checkpoint import load_params  # noqa: E402
from tests.support.models import tiny_run  # noqa: E402

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

CONFIGS = {
    # 10 heads of 8 in 2 groups, state 6, conv 3, chunks of 4: every size differs from the others
    "mamba2": ("Mamba2", dict(hidden_size=40, num_hidden_layers=3, num_heads=10, head_dim=8,
                              n_groups=2, state_size=6, conv_kernel=3, chunk_size=4,
                              vocab_size=101, tie_word_embeddings=False)),
    # Mamba-2, attention, Mamba-2, attention; 6 SSM heads of 16 in 3 groups; GQA 4:2 of 12
    "bamba": ("Bamba", dict(hidden_size=48, num_hidden_layers=4, attn_layer_indices=[1, 3],
                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=72,
                            mamba_n_heads=6, mamba_d_head=16, mamba_n_groups=3, mamba_d_state=10,
                            mamba_d_conv=4, mamba_chunk_size=8, vocab_size=101,
                            tie_word_embeddings=True)),
}


def _hf_model(name, seed=0, **extra):
    family, options = CONFIGS[name]
    torch.manual_seed(seed)
    config = getattr(transformers, f"{family}Config")(**{**options, **extra})
    model = getattr(transformers, f"{family}ForCausalLM")(config).eval()
    with torch.no_grad():  # HF's init leaves D = 1 and dt_bias shared; make every leaf matter
        for name_, p in model.named_parameters():
            if name_.endswith(("dt_bias", ".D", "A_log", "conv1d.bias")):
                p.add_(0.3 * torch.randn_like(p))
    return model


def _imported(name, tmp_path, **extra):
    hf_model = _hf_model(name, **extra)
    hf_model.save_pretrained(str(tmp_path / "hf"))
    workdir = str(tmp_path / "workdir")
    import_checkpoint(str(tmp_path / "hf"), workdir)
    params, cfg, _ = load_params(workdir)
    return hf_model, params, cfg


def _layer_outputs(hf_model, tokens):
    """Each decoder layer's output hidden state, captured with forward hooks."""
    layers = (hf_model.backbone if hasattr(hf_model, "backbone") else hf_model.model).layers
    captured = []
    hooks = [layer.register_forward_hook(
        lambda _m, _i, out: captured.append(out[0] if isinstance(out, tuple) else out))
        for layer in layers]
    with torch.no_grad():
        logits = hf_model(torch.tensor(tokens)).logits.numpy()
    for hook in hooks:
        hook.remove()
    return logits, [h.numpy() for h in captured]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_of_the_model_and_every_exit_match_transformers(name, tmp_path):
    """Catches a mis-mapped tensor (in_proj's z/xBC/dt split, the conv's [C, 1, K] layout,
    A_log vs A, the gated norm's groups), Bamba's half rotation done on the whole head, a layer
    kind placed at the wrong index, and a final norm or head read from the wrong tensor."""
    hf_model, params, cfg = _imported(name, tmp_path)
    assert cfg.layer_kinds == tuple(
        "attention" if t == "full_attention" else "mamba2" for t in hf_model.config.layer_types)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 13))
    logits, hidden = _layer_outputs(hf_model, tokens)
    per_layer = jax.jit(M.run_layers, static_argnames="cfg")(
        params, cfg, M.embed(params, cfg, jnp.asarray(tokens)))
    np.testing.assert_allclose(M.exit_logits(params, cfg, per_layer[-1]), logits, atol=5e-5)
    final_norm = (hf_model.backbone.norm_f if name == "mamba2"
                  else hf_model.model.final_layernorm)
    for exit_layer in range(1, cfg.num_layers):
        np.testing.assert_allclose(per_layer[exit_layer - 1], hidden[exit_layer - 1], atol=1e-5)
        with torch.no_grad():
            expected = hf_model.lm_head(final_norm(torch.tensor(hidden[exit_layer - 1]))).numpy()
        np.testing.assert_allclose(M.exit_logits(params, cfg, per_layer[exit_layer - 1]),
                                   expected, atol=5e-5)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_greedy_generation_matches_transformers_token_for_token(name, tmp_path):
    """Catches a decode-time difference the whole-sequence parity cannot see: the conv history
    or SSM state carried wrongly from prefill into the cached steps (HF decodes with its
    recurrent step), or the attention layers' K/V in a hybrid."""
    hf_model, params, cfg = _imported(name, tmp_path, initializer_range=0.2)
    prompt = [5, 17, 3, 99, 42, 7]
    hf_model.generation_config.eos_token_id = None  # specjax's Generator has no EOS here either
    with torch.no_grad():
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=20,
                                     do_sample=False)[0, len(prompt):].tolist()
    out = Generator(params, cfg).generate([prompt], max_new_tokens=20)
    assert out.tokens[0] == expected
    assert len(set(expected)) > 3  # a real continuation, not one repeated token


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_export_round_trip_is_bit_identical(name, tmp_path):
    """Catches an inverse that is not exact (the conv transpose, in_proj's concatenation) and a
    config.json transformers does not rebuild the same model from."""
    _, _, cfg = _imported(name, tmp_path)
    exported = str(tmp_path / "exported")
    export_checkpoint(str(tmp_path / "workdir"), exported)
    original = load_file(str(tmp_path / "hf" / "model.safetensors"))
    again = load_file(os.path.join(exported, "model.safetensors"))
    assert set(original) == set(again)
    for key, tensor in original.items():
        assert torch.equal(tensor, again[key]), key
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported)
    assert reloaded.config.layer_types == _hf_model(name).config.layer_types


def test_a_specjax_hybrid_exports_to_bamba_when_its_layout_is_bambas(tmp_path):
    """A specjax hybrid with Bamba's half rotation exports and transformers computes the same
    logits; with full rotation, or Mamba-2 layers without an MLP beside attention, the
    export is refused by name. Catches an exporter that writes a Bamba config for a model Bamba
    would compute differently."""
    hybrid = dict(num_layers=3, layer_pattern=["mamba2", "attention", "mamba2"],
                  partial_rotary_factor=0.5,
                  ssm=dict(num_heads=4, head_dim=8, state_size=8, groups=2, chunk_size=8))
    workdir = str(tmp_path / "bamba")
    params = M.init_params(_model_config(hybrid), jax.random.PRNGKey(1))
    _save(workdir, params, hybrid)
    export_checkpoint(workdir, str(tmp_path / "hf"))
    with open(tmp_path / "hf" / "config.json") as f:
        assert json.load(f)["architectures"] == ["BambaForCausalLM"]
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    tokens = np.random.default_rng(1).integers(0, 259, (1, 9))
    cfg = _model_config(hybrid)
    with torch.no_grad():
        expected = hf_model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(M.forward(params, cfg, jnp.asarray(tokens)), expected, atol=5e-5)
    for change, message in [(dict(partial_rotary_factor=1.0), "rotates half of each head"),
                            (dict(ssm={**hybrid["ssm"], "mlp": False}), "an MLP after")]:
        other = {**hybrid, **change}
        workdir = str(tmp_path / str(len(message)))
        _save(workdir, M.init_params(_model_config(other), jax.random.PRNGKey(1)), other)
        with pytest.raises(ConversionError, match=message):
            export_checkpoint(workdir, str(tmp_path / "refused"))
        assert not (tmp_path / "refused").exists()


def _model_config(model):
    from specjax.training.config import parse_run_config
    return parse_run_config(tiny_run(model=model)).model


def _save(workdir, params, model):
    from specjax.io.checkpoint import Checkpointer
    cfg = _model_config(model)
    checkpoints = Checkpointer(workdir)
    checkpoints.save(0, params, None, {"step": 0, "data_position": 0, "model": cfg.to_dict(),
                                       "tokenizer": "bytes"})
    checkpoints.close()


def test_what_cannot_be_converted_is_a_clear_error(tmp_path):
    """Features specjax's Mamba-2 layer does not have are refused at import, by name, instead
    of being silently dropped: biased projections and a clamped time step. Catches an import
    that ignores them and computes another model."""
    for extra, message in [(dict(use_bias=True), "use_bias=True"),
                           (dict(time_step_limit=(0.0, 0.1)), "time_step_limit")]:
        path = tmp_path / message.split("=")[0]
        _hf_model("mamba2", **extra).save_pretrained(str(path))
        with pytest.raises(ConversionError, match=message):
            import_checkpoint(str(path), str(tmp_path / "w"))
