"""Hugging Face interop: golden-logit parity with transformers for the full model and every early
exit, bit-identical export round trips, clear errors, and converted checkpoints in the CLIs.
Needs the `hf` extra (torch, transformers); the reference models are created locally."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from specjax import model as M  # noqa: E402
from specjax.convert.hf import export_checkpoint, import_checkpoint  # noqa: E402
from specjax.convert.hf_config import ConversionError  # noqa: E402
from specjax.decoding.engine import Generator  # noqa: E402
from specjax.io.checkpoint import CheckpointError, load_params  # noqa: E402
from tests.support.scripts import run_script  # noqa: E402

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

BASE = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
            vocab_size=101)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
CONFIGS = {
    "llama-gqa-untied": ("Llama", dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "llama-mha-tied": ("Llama", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama3-rope-scaling": ("Llama", dict(num_key_value_heads=1, head_dim=32, rope_theta=5e5,
                                          rope_scaling=LLAMA3_ROPE, rms_norm_eps=1e-5)),
    "qwen2-bias": ("Qwen2", dict(num_key_value_heads=2)),
}


def _hf_model(name, seed=0, **extra):
    family, options = CONFIGS[name]
    torch.manual_seed(seed)
    config = getattr(transformers, f"{family}Config")(**{**BASE, **options, **extra})
    return getattr(transformers, f"{family}ForCausalLM")(config).eval()


def _saved(model, path, **kwargs):
    model.save_pretrained(str(path), **kwargs)
    return str(path)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_of_the_model_and_every_exit_match_transformers(name, tmp_path):
    hf_model = _hf_model(name)
    workdir = str(tmp_path / "workdir")
    cfg = import_checkpoint(_saved(hf_model, tmp_path / "hf"), workdir)
    params, _, _ = load_params(workdir)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 13))
    with torch.no_grad():
        reference = hf_model(torch.tensor(tokens), output_hidden_states=True)
    per_layer = jax.jit(M.run_layers, static_argnames="cfg")(
        params, cfg, M.embed(params, cfg, jnp.asarray(tokens)))
    np.testing.assert_allclose(M.exit_logits(params, cfg, per_layer[-1]),
                               reference.logits.numpy(), atol=2e-5)
    for exit_layer in range(1, cfg.num_layers):
        hidden = reference.hidden_states[exit_layer]
        with torch.no_grad():
            expected = hf_model.lm_head(hf_model.model.norm(hidden)).numpy()
        np.testing.assert_allclose(per_layer[exit_layer - 1], hidden.numpy(), atol=2e-6)
        np.testing.assert_allclose(M.exit_logits(params, cfg, per_layer[exit_layer - 1]),
                                   expected, atol=2e-5)


@pytest.mark.parametrize("name, dtype, shard", [("llama-gqa-untied", "float32", None),
                                                 ("llama3-rope-scaling", "bfloat16", "60KB"),
                                                 ("qwen2-bias", "float16", None)])
def test_export_round_trip_is_bit_identical(name, dtype, shard, tmp_path):
    hf_model = _hf_model(name).to(getattr(torch, dtype))
    kwargs = {"max_shard_size": shard} if shard else {}
    source = _saved(hf_model, tmp_path / "hf", **kwargs)
    if shard:
        assert os.path.exists(os.path.join(source, "model.safetensors.index.json"))
    cfg = import_checkpoint(source, str(tmp_path / "workdir"))
    assert cfg.param_dtype == dtype
    exported = str(tmp_path / "exported")
    export_checkpoint(str(tmp_path / "workdir"), exported, max_shard_bytes=50_000)
    original, again = _all_tensors(source), _all_tensors(exported)
    assert set(original) == set(again)
    for key, tensor in original.items():
        assert tensor.dtype == again[key].dtype and torch.equal(tensor, again[key]), key
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported)
    assert reloaded.config.num_key_value_heads == hf_model.config.num_key_value_heads


def _all_tensors(path):
    tensors = {}
    for name in os.listdir(path):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(path, name)))
    return tensors


def test_greedy_generation_matches_transformers_token_for_token(tmp_path):
    hf_model = _hf_model("llama-gqa-untied", initializer_range=0.2)
    workdir = str(tmp_path / "workdir")
    import_checkpoint(_saved(hf_model, tmp_path / "hf"), workdir)
    params, cfg, _ = load_params(workdir)
    prompt = [5, 17, 3, 99, 42]
    with torch.no_grad():
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                     min_new_tokens=24)[0, len(prompt):].tolist()
    out = Generator(params, cfg).generate([prompt], max_new_tokens=24)
    assert out.tokens[0] == expected
    assert len(set(expected)) > 3  # a real continuation, not one repeated token


def test_conversion_errors_name_what_is_wrong(tmp_path):
    source = _saved(_hf_model("llama-gqa-untied"), tmp_path / "hf")
    tensors = load_file(os.path.join(source, "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, os.path.join(source, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConversionError, match="missing tensor 'model.layers.1.mlp.down_proj"):
        import_checkpoint(source, str(tmp_path / "a"))
    with open(os.path.join(source, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(source, "config.json"), "w") as f:
        json.dump({**config, "architectures": ["GPTNeoXForCausalLM"]}, f)
    with pytest.raises(ConversionError, match="unsupported architecture \\['GPTNeoXForCausalLM'"):
        import_checkpoint(source, str(tmp_path / "b"))
    with pytest.raises(ConversionError, match="has no config.json"):
        import_checkpoint(str(tmp_path), str(tmp_path / "c"))
    os.remove(os.path.join(source, "model.safetensors"))
    with open(os.path.join(source, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(ConversionError, match="only safetensors checkpoints are read"):
        import_checkpoint(source, str(tmp_path / "d"))


def test_imported_checkpoint_cannot_resume_training(tmp_path):
    from specjax.training.trainer import Trainer
    from tests.support.models import tiny_run

    run = tiny_run()
    hf_model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=259, tie_word_embeddings=True, rms_norm_eps=1e-5))
    workdir = str(tmp_path / "workdir")
    import_checkpoint(_saved(hf_model, tmp_path / "hf"), workdir)
    with pytest.raises(CheckpointError, match="holds weights only"):
        Trainer(run, workdir).fit()


def _word_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<s>", "</s>", "def", "return", "x", "(", ")", ":",
                                         "import", "os", "\n", " "] + [f"w{i}" for i in range(89)])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "isolated")
    tokenizer.save(path)


def test_converted_checkpoint_decodes_through_the_clis(tmp_path):
    hf_model = _hf_model("llama-gqa-untied", initializer_range=0.2, bos_token_id=0,
                         eos_token_id=1)
    source = _saved(hf_model, tmp_path / "hf")
    _word_tokenizer(os.path.join(source, "tokenizer.json"))
    workdir, exported = str(tmp_path / "workdir"), str(tmp_path / "exported")

    def cli(script, *args):
        result = run_script(script, *args)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    assert "imported a 3-layer model" in cli("tools/convert.py", "--hf_dir", source, "--workdir",
                                             workdir)
    completions = {s: cli("infer/generate.py", "--workdir", workdir, "--strategy", s, "--prompt",
                          "def x", "--max_new_tokens", "8").split("\n--- tau=")[0]
                   for s in ("ar", "selfspec")}
    assert completions["ar"] == completions["selfspec"]
    assert completions["ar"].startswith("def x") and len(completions["ar"]) > len("def x")
    prompts, report = tmp_path / "prompts.jsonl", tmp_path / "bench.json"
    prompts.write_text('{"prompt": "def x"}\n{"prompt": "import os"}\n')
    cli("bench/bench.py", "--workdir", workdir, "--prompts_file", str(prompts), "--max_new_tokens",
        "24", "--repeats", "1", "--bandwidth_mb", "16", "--strategies",
        "ar,selfspec,ngram,draft", "--draft_workdir", workdir, "--compare_hf", "--output_json",
        str(report))
    peers = json.loads(report.read_text())["hf_peers"]
    assert [p["strategy"] for p in peers] == [
        "hf greedy", "hf assistant_early_exit=1 (HF's policy)", "hf selfspec E=1 K=4",
        "hf ngram n=1..3 K=4", "hf draft K=4"]  # the draft: assisted generation, same model
    rates = {row["strategy"]: row["tokens_per_s"] for row in json.loads(
        report.read_text())["results"]}
    for peer in peers:
        assert peer["identical_to_specjax"] and peer["tokens_per_s"] > 0
        assert peer["specjax_speedup"] == pytest.approx(
            rates[peer["specjax_strategy"]] / peer["tokens_per_s"])
    # A variant projected past the budget is skipped and said so, not run for an hour.
    output = cli("bench/bench.py", "--workdir", workdir, "--prompts_file", str(prompts),
                 "--max_new_tokens", "8", "--repeats", "1", "--bandwidth_mb", "16",
                 "--strategies", "ar", "--compare_hf", "--hf_budget_s", "1e-9")
    assert "hf greedy: skipped (one prompt took" in output and "past the 0 min budget" in output
    cli("tools/convert.py", "--to_hf", "--workdir", workdir, "--hf_dir", exported)
    assert os.path.exists(os.path.join(exported, "tokenizer.json"))
    with open(os.path.join(exported, "config.json")) as f:
        assert json.load(f)["eos_token_id"] == 1


def test_the_peer_projects_its_budget_and_assists_with_the_draft_model(tmp_path, monkeypatch):
    """Catches the peer's budget compared with one prompt's time instead of the projection over
    every prompt and repeat (a variant taking an hour would run), and assisted generation
    given the target instead of the draft model as its assistant (as lossless, so only the
    exported folders tell)."""
    from specjax.decoding.drafters.draft_model import DraftModel
    from specjax.decoding.shapes.chain import Chain
    from specjax.tools import hf_peer

    workdirs = []
    for name, seed in (("target", 0), ("draft", 1)):
        workdirs.append(str(tmp_path / name))
        import_checkpoint(_saved(_hf_model("llama-gqa-untied", seed=seed, initializer_range=0.2),
                                 tmp_path / f"{name}_hf"), workdirs[-1])
    exported = []
    export = hf_peer._exported
    monkeypatch.setattr(hf_peer, "_exported", lambda path, *a: exported.append(path) or
                        export(path, *a))
    prompts = [[5, 17, 3], [9, 8]]
    [greedy, assisted] = hf_peer.hf_peer_benchmark(
        workdirs[0], prompts, max_new_tokens=6, repeats=2, draft_workdir=workdirs[1],
        strategies={"draft K=2": DraftModel(Chain(2))})
    assert exported == workdirs and assisted.name == "hf draft K=2"
    assert assisted.generated == greedy.generated and not assisted.skipped
    monkeypatch.setattr(hf_peer, "_timed", lambda *args: 1.0)  # 4 s over 2 prompts x 2 repeats
    for budget, skipped in ((3.0, True), (5.0, False)):
        [peer] = hf_peer.hf_peer_benchmark(workdirs[0], prompts, max_new_tokens=6, repeats=2,
                                           strategies={}, budget_seconds=budget)
        assert bool(peer.skipped) == skipped and (peer.tokens_per_second is None) == skipped


def test_the_peers_time_is_the_sum_of_each_prompts_median_on_a_scripted_clock(monkeypatch):
    """HF greedy's time over two prompts and three repeats, on a clock each `generate` call
    advances by a scripted time (1.0, 1.2, 9.0 s and 2.0, 2.5, 2.1 s after a 0.1 s warm-up):
    the per-prompt medians summed, 1.2 + 2.1 s, as the specjax strategies are timed. Catches
    the mean taken instead (one slow outlier repeat, 9 s, would count)."""
    from types import SimpleNamespace

    from specjax import timing
    from specjax.tools import hf_peer

    clock = [0.0]
    durations = {(5, 17, 3): iter([0.1, 1.0, 1.2, 9.0]), (9, 8): iter([2.0, 2.5, 2.1])}

    class ScriptedModel:
        def generate(self, input_ids, max_new_tokens, do_sample, **options):
            clock[0] += next(durations[tuple(input_ids[0].tolist())])
            return torch.cat([input_ids, torch.zeros((1, max_new_tokens), dtype=torch.long)], 1)

    scripted = SimpleNamespace(perf_counter=lambda: clock[0])
    monkeypatch.setattr(timing, "time", scripted)
    monkeypatch.setattr(hf_peer, "time", scripted)
    monkeypatch.setattr(hf_peer, "_exported", lambda *args: ScriptedModel())
    [greedy] = hf_peer.hf_peer_benchmark("unused", [[5, 17, 3], [9, 8]], max_new_tokens=2,
                                         strategies={}, repeats=3)
    assert greedy.name == "hf greedy" and greedy.generated == [[0, 0], [0, 0]]
    assert greedy.seconds == pytest.approx(1.2 + 2.1, rel=1e-12)
    assert greedy.tokens_per_second == pytest.approx(4 / 3.3, rel=1e-12)


def test_export_never_clobbers_and_a_missing_tokenizer_is_explained(tmp_path, capsys):
    """Catches an export that silently overwrites a directory (a source model, even) or
    leaves stale shards beside new ones, and an import without tokenizer.json that succeeds
    silently and then fails in generate with "unknown tokenizer None"."""
    source = _saved(_hf_model("llama-gqa-untied"), tmp_path / "hf", max_shard_size="60KB")
    workdir = str(tmp_path / "workdir")
    import_checkpoint(source, workdir)
    assert "has no tokenizer.json" in capsys.readouterr().err
    with pytest.raises(ValueError, match="names no tokenizer .* --tokenizer bytes"):
        from specjax.tokenizer import get_tokenizer
        get_tokenizer(load_params(workdir)[2].get("tokenizer"), workdir)
    before = sorted(os.listdir(source))
    with pytest.raises(ConversionError, match="is not empty; pass --overwrite"):
        export_checkpoint(workdir, source)
    assert sorted(os.listdir(source)) == before  # untouched
    export_checkpoint(workdir, source, overwrite=True)  # one shard now: no stale ones remain
    assert sorted(os.listdir(source)) == ["config.json", "model.safetensors"]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # no leftovers
    with pytest.raises(ConversionError, match="'bytes' tokenizer has 259 ids, more than the "
                                              "model's vocabulary of 101"):
        import_checkpoint(source, str(tmp_path / "small"), tokenizer="bytes")
    bytes_source = _saved(_hf_model("llama-gqa-untied", vocab_size=259), tmp_path / "hf259")
    import_checkpoint(bytes_source, str(tmp_path / "bytes"), tokenizer="bytes")
    assert load_params(str(tmp_path / "bytes"))[2]["tokenizer"] == "bytes"
