"""Feature heads from the command line: an EAGLE-3 head trained with train/train.py and
decoded from its workdir, a head refused on other weights, and published EAGLE-3 heads
imported with tools/convert.py against a reference forward written from EAGLE's `cnets.py`."""

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import specjax
from specjax import model as M
from specjax.config import ModelConfig
from specjax.decoding.registry import DecodingConfig, make_strategy
from specjax.heads.eagle import EAGLE
from specjax.heads.feature_head import unrolled_logits
from specjax.heads.vocab_subset import DraftVocab
from specjax.io.draft_vocab import read_ranking, write_ranking
from specjax.loading import load_model
from specjax.training.frozen_base import base_features
from specjax.training.heads.eagle import import_eagle
from tests.support.decoding import per_step_argmax
from tests.support.models import TINY_MODEL, damped_params, model_workdir
from tests.support.scripts import check_import_refusals, run_script

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]


@pytest.mark.slow
def test_a_head_trained_from_the_cli_decodes_from_its_workdir(trained_workdir, tmp_path):
    """Catches a feature head's objective that is not reachable from its config, a checkpoint
    that does not load for decoding (its exits), and a head decoded on weights it was not
    trained on. (`mtp` trains through the same objective; test_mtp_joint decodes its modules
    from the CLI.)"""
    name, option = "eagle", "--config.eagle.unroll=2"
    head = str(tmp_path / name)
    result = run_script("train/train.py", "--config", name,
                        f"--config.base_workdir={trained_workdir}", "--workdir", head, option,
                        "--config.train.total_steps=3", "--config.train.warmup_steps=1",
                        "--config.train.eval_every=3", "--config.train.save_every=3",
                        "--config.train.eval_batches=1", "--config.train.batch_size=4")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "agree w/ base" in result.stdout
    result = run_script("infer/generate.py", "--workdir", head, "--strategy", name,
                        "--prompt", "def f(", "--max_new_tokens", "8", "--tree", "2,1")
    assert result.returncode == 0 and "tau=" in result.stdout, result.stderr[-2000:]
    tiny = ModelConfig(**TINY_MODEL)  # a model of the same shape with other weights
    other = model_workdir(str(tmp_path / "other"), M.init_params(tiny, jax.random.PRNGKey(9)),
                          tiny)
    result = run_script("infer/generate.py", "--workdir", other, "--strategy", name,
                        "--draft_workdir", head, "--prompt", "x", "--max_new_tokens", "4")
    assert result.returncode == 1 and f"the {name} head in {head} was trained on the model in" \
        in result.stderr, result.stderr[-2000:]


def test_a_bad_eagle_layer_list_is_one_line_before_training(trained_workdir, tmp_path):
    """Catches layers outside the model or not numbers reaching a traceback mid-run."""
    for value, message in (("2,x", "eagle.layers='2,x' must be layer counts"),
                           ("1,99", "eagle.layers=1,99: each must lie in [1, num_layers")):
        result = run_script("train/train.py", "--config", "eagle",
                            f"--config.base_workdir={trained_workdir}", "--workdir",
                            str(tmp_path / value), f"--config.eagle.layers={value}")
        assert result.returncode == 1 and message in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, positions, theta):
    """Hugging Face Llama's rotary embedding (rotate_half) on x [T, heads, hd]."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    angles = positions[:, None] * inv[None, :]
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None]
    rotated = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * cos + rotated * sin


def _reference_eagle3(t, cfg, embed, hidden, ids):
    """EAGLE-3's draft logits over the target vocabulary (-inf where the draft vocabulary has
    no token), from the published tensors `t`, as cnets.py computes them: position i reads
    the target's fused hidden states at i and the embedding of the token after it (`ids`)."""
    steps, hd = len(ids), cfg.head_dim
    h = hidden @ t["fc.weight"].T
    x = np.concatenate([_rms(embed[ids], t["midlayer.input_layernorm.weight"], cfg.norm_eps),
                        _rms(h, t["midlayer.hidden_norm.weight"], cfg.norm_eps)], -1)
    positions = np.arange(steps, dtype=np.float64)
    q = _rope((x @ t["midlayer.self_attn.q_proj.weight"].T).reshape(steps, -1, hd), positions,
              cfg.rope_theta)
    k = _rope((x @ t["midlayer.self_attn.k_proj.weight"].T).reshape(steps, -1, hd), positions,
              cfg.rope_theta)
    v = (x @ t["midlayer.self_attn.v_proj.weight"].T).reshape(steps, -1, hd)
    group = q.shape[1] // k.shape[1]
    heads = []
    for head in range(q.shape[1]):
        scores = q[:, head] @ k[:, head // group].T / np.sqrt(hd)
        scores = np.where(np.tril(np.ones((steps, steps), bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        heads.append((probs / probs.sum(-1, keepdims=True)) @ v[:, head // group])
    x = h + np.concatenate(heads, -1) @ t["midlayer.self_attn.o_proj.weight"].T
    y = _rms(x, t["midlayer.post_attention_layernorm.weight"], cfg.norm_eps)
    gate, up = y @ t["midlayer.mlp.gate_proj.weight"].T, y @ t["midlayer.mlp.up_proj.weight"].T
    x = x + (gate / (1 + np.exp(-gate)) * up) @ t["midlayer.mlp.down_proj.weight"].T
    draft = _rms(x, t["norm.weight"], cfg.norm_eps) @ t["lm_head.weight"].T
    full = np.full((steps, cfg.vocab_size), -np.inf)
    full[:, np.arange(draft.shape[1]) + t["d2t"]] = draft
    return full


def _published_eagle3(folder, cfg, layers, draft_vocab, seed=3, **config):
    """A random EAGLE-3 head in EAGLE's and SpecForge's layout (PyTorch's out-by-in linear
    weights, a reduced draft vocabulary mapped by d2t), and its tensors."""
    rng = np.random.default_rng(seed)
    d, hd, inner = cfg.d_model, cfg.head_dim, cfg.mlp_dim
    shapes = {"fc.weight": (d, len(layers) * d),
              "midlayer.self_attn.q_proj.weight": (cfg.num_heads * hd, 2 * d),
              "midlayer.self_attn.k_proj.weight": (cfg.num_kv_heads * hd, 2 * d),
              "midlayer.self_attn.v_proj.weight": (cfg.num_kv_heads * hd, 2 * d),
              "midlayer.self_attn.o_proj.weight": (d, cfg.num_heads * hd),
              "midlayer.mlp.gate_proj.weight": (inner, d),
              "midlayer.mlp.up_proj.weight": (inner, d),
              "midlayer.mlp.down_proj.weight": (d, inner), "lm_head.weight": (draft_vocab, d)}
    tensors = {name: rng.normal(0, 0.3, shape).astype(np.float32)
               for name, shape in shapes.items()}
    for norm in ("midlayer.hidden_norm", "midlayer.input_layernorm",
                 "midlayer.post_attention_layernorm", "norm"):
        tensors[f"{norm}.weight"] = rng.uniform(0.5, 1.5, (d,)).astype(np.float32)
    chosen = np.sort(rng.choice(cfg.vocab_size, draft_vocab, replace=False))
    tensors["d2t"] = (chosen - np.arange(draft_vocab)).astype(np.int64)
    tensors["t2d"] = np.isin(np.arange(cfg.vocab_size), chosen)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": d,
                   "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
                   "intermediate_size": inner, "vocab_size": cfg.vocab_size,
                   "draft_vocab_size": draft_vocab, "num_hidden_layers": 1,
                   "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layers)}, **config},
                  f)
    return tensors


def test_a_published_eagle3_head_imports_and_matches_a_reference_forward(tmp_path):
    """Catches an import that forgets PyTorch's out-by-in layout, swaps the embedding and the
    feature halves of the attention's input (or their norms), maps the draft vocabulary
    through d2t the wrong way, fuses the layers in another order or at other exits, or writes
    a workdir decoding cannot load; and bad checkpoints (a size the base lacks, a model's
    checkpoint, pickled weights only) reaching a traceback or a half-made workdir."""
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
    base = model_workdir(str(tmp_path / "base"), params, CFG)
    layers = (3, 1, 2)
    published = _published_eagle3(str(tmp_path / "hub"), CFG, layers, draft_vocab=64)
    result = run_script("tools/convert.py", "--hf_dir", str(tmp_path / "hub"),
                        "--base_workdir", base, "--workdir", str(tmp_path / "head"))
    assert result.returncode == 0 and "layers 3,1,2" in result.stdout, result.stderr[-2000:]
    loaded = load_model(str(tmp_path / "head"))
    head = loaded.draft_weights["eagle"].params
    tokens = jnp.asarray([[5, 9, 2, 7, 1, 3, 200, 11]])
    hidden, _ = base_features(params, CFG, layers, tokens[:, :-1])
    ours = np.asarray(unrolled_logits(EAGLE, params, head, CFG, tokens, hidden, 1)[0, 0, 1:])
    fused = np.concatenate([np.asarray(h[0], np.float64) for h in hidden], -1)
    reference = _reference_eagle3({k: v.astype(np.float64) if v.dtype.kind == "f" else v
                                   for k, v in published.items()}, CFG,
                                  np.asarray(params["embed"], np.float64), fused[:-1],
                                  np.asarray(tokens[0, 1:-1]))
    drafted = np.isfinite(reference[0])
    np.testing.assert_allclose(ours[:, drafted], reference[:, drafted], rtol=2e-4, atol=2e-4)
    assert np.all(ours[:, ~drafted] < -1e8)
    out = loaded.generator().generate(PROMPTS, max_new_tokens=8, strategy=make_strategy(
        "eagle", DecodingConfig(num_draft=3)))
    assert out.tokens == per_step_argmax(loaded.generator(), PROMPTS, 8)
    _published_eagle3(str(tmp_path / "wide"), CFG, layers, 64, intermediate_size=99)
    _published_eagle3(str(tmp_path / "far"), CFG, (1, 2, 9), 64)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    _published_eagle3(str(tmp_path / "pickled"), CFG, layers, 64)
    pickled = tmp_path / "pickled"
    os.rename(pickled / "model.safetensors", pickled / "pytorch_model.bin")
    check_import_refusals(tmp_path, base, (
        ("wide", "intermediate_size=99 but the base model"),
        ("far", "eagle_aux_hidden_state_layer_ids [1, 2, 9] must lie in"),
        ("model", "has no medusa_num_heads"),
        ("pickled", "has no model.safetensors (specjax reads safetensors"),
    ))


def _imported_d2t_head(tmp_path):
    """A base ranked by a random permutation and a published head drafting 64 of its 259 ids,
    imported: (base workdir, head workdir, the base's ranking, the head's ids)."""
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
    base = model_workdir(str(tmp_path / "base"), params, CFG)
    ranking = np.random.default_rng(1).permutation(CFG.vocab_size)
    write_ranking(base, ranking, {"source": "a permutation"})
    published = _published_eagle3(str(tmp_path / "hub"), CFG, (1, 2, 3), draft_vocab=64)
    import_eagle(str(tmp_path / "hub"), base, str(tmp_path / "head"))
    return base, str(tmp_path / "head"), ranking, np.arange(64) + published["d2t"]


def test_an_imported_d2t_head_drafts_over_exactly_its_ids(tmp_path):
    """A published head with 64 of 259 ids (d2t) imports with them as its workdir's draft
    vocabulary (ranked as its base ranks them) and 64 as its default: its draft head is a
    64-row product of its own lm_head's columns, its greedy output the per-step argmax;
    --draft_vocab 16 drafts over the 16 of its ids the base ranks first, 65 is one line.
    Catches the d2t ids left unrecorded (the full masked head: the same output, none of the
    saving), a ranking that admits ids the head cannot draft or ignores the base's order, and
    N > V' drafted past the head's ids."""
    _, head, ranking, own = _imported_d2t_head(tmp_path)
    model = specjax.load(head)
    strategy = model.strategy("eagle", num_draft=3)
    assert strategy.draft_vocab == 64
    loaded = load_model(head)
    generator = loaded.generator()
    ids = generator.draft_ids(strategy)
    assert ids.tolist() == sorted(own.tolist())
    assert read_ranking(head, CFG.vocab_size).tolist() == ranking[np.isin(ranking, own)].tolist()
    bound, weights = generator.with_weights(strategy, None)
    cut = bound.restrict_vocab(weights, ids)
    assert cut["lm_head"].shape == (CFG.d_model, 64) and not np.any(cut["vocab_bias"])
    features = jnp.ones((2, CFG.d_model), CFG.compute_dtype)
    vocab = DraftVocab.gather(loaded.params, CFG, ids)
    jaxpr = str(jax.make_jaxpr(lambda w, v: EAGLE.logits(loaded.params, w, CFG, features, v))(
        cut, vocab))
    assert {s.split(",")[-1] for s in re.findall(r"f32\[([\d,]+)\] = (?:dot_general|ffi_call)",
                                                  jaxpr)} == {"64"}
    out = generator.generate(PROMPTS, max_new_tokens=8, strategy=strategy)
    assert out.tokens == per_step_argmax(generator, PROMPTS, 8)
    fewer = generator.draft_ids(dataclasses.replace(strategy, draft_vocab=16))
    assert fewer.tolist() == sorted(ranking[np.isin(ranking, own)][:16].tolist())
    with pytest.raises(ValueError, match=r"^draft_vocab=65 exceeds the 64 ids ranked"):
        generator.generate(PROMPTS[:1], max_new_tokens=2,
                           strategy=dataclasses.replace(strategy, draft_vocab=65))


@pytest.mark.slow
def test_draft_vocab_ranks_a_d2t_heads_own_ids_in_an_older_import(tmp_path):
    """A head imported before its d2t was recorded (no draft_vocab.json, no default: it drafts
    over the full head, masked) gets it from infer/draft_vocab.py on its workdir: the base's
    text counted, only the head's ids ranked, N its default; --size 65 of its 64 ids is one
    line. Catches the command refusing a head's workdir, ranking ids the head cannot draft, or
    writing the default for the base's step instead of the head's (then ignored)."""
    _, head, _, own = _imported_d2t_head(tmp_path)
    for name in ("draft_vocab.json", "calibrated_decoding.json"):
        os.remove(os.path.join(head, name))
    assert specjax.load(head).strategy("eagle").draft_vocab == 0
    refused = run_script("infer/draft_vocab.py", "--workdir", head, "--size", "65")
    assert refused.returncode == 1 and refused.stderr.strip().endswith(
        f"--size=65 exceeds the 64 ids the EAGLE-3 head in {head} drafts (its d2t)"), \
        refused.stderr[-2000:]
    done = run_script("infer/draft_vocab.py", "--workdir", head, "--size", "32")
    assert done.returncode == 0, done.stderr[-2000:]
    stored = read_ranking(head, CFG.vocab_size).tolist()
    assert len(stored) == 32 and set(stored) < set(own.tolist())
    assert specjax.load(head).strategy("eagle").draft_vocab == 32
