"""GGUF import: tiny Llama GGUF files written here with the `gguf` package's writer, read back
against references written in this file (dequantization from the raw block bytes, llama.cpp's
Q/K row permutation, transformers' own logits and its GGUF tokenizer), and bad files refused
in one line with nothing written."""

import json

import jax
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specjax import model as M  # noqa: E402
from specjax.chat import render_chat  # noqa: E402
from specjax.convert.gguf import GgufCheckpoint  # noqa: E402
from specjax.convert.hf import import_checkpoint  # noqa: E402
from specjax.convert.hf_config import ConversionError  # noqa: E402
from specjax.io.checkpoint import load_params  # noqa: E402
from specjax.tokenizer import get_tokenizer  # noqa: E402
from tests.support.scripts import run_script  # noqa: E402

pytestmark = pytest.mark.slow

Q = gguf.GGMLQuantizationType
SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=300, rms_norm_eps=1e-5, rope_theta=10000.0,
             tie_word_embeddings=True)
TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] "
            "+ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|im_start|>assistant\n' }}{% endif %}")
TEXTS = ["def f(x):\n    return x + 1", "héllo wörld  <|im_end|> 12345", "  spaces\n\n\ttabs"]


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert script's reordering of a Q/K projection's rows (the reference the
    import must undo): within each head, the two rotated halves interleaved."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def reference_dequantize(raw: np.ndarray, kind, shape) -> np.ndarray:
    """Dequantization from the block layout of ggml's formats, written here: Q8_0 blocks are
    an fp16 scale and 32 int8s; Q4_0 an fp16 scale and 32 nibbles (low halves first) offset by
    8; Q4_1 an fp16 scale, an fp16 minimum and 32 nibbles."""
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if kind == Q.F32:
        return raw.view(np.float32).reshape(shape)
    if kind == Q.F16:
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if kind == Q.Q8_0:
        blocks = raw.reshape(-1, 34)
        scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        return (scale * blocks[:, 2:].copy().view(np.int8)).reshape(shape)
    header = {Q.Q4_0: 2, Q.Q4_1: 4}[kind]
    blocks = raw.reshape(-1, header + 16)
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    nibbles = np.concatenate([blocks[:, header:] & 15, blocks[:, header:] >> 4], axis=1)
    if kind == Q.Q4_0:
        return (scale * (nibbles.astype(np.float32) - 8)).reshape(shape)
    low = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    return (scale * nibbles + low).reshape(shape)


def bpe_vocabulary():
    """A small byte-level BPE (tokens, merges) with three control tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXTS * 20 + ["the quick brown fox jumps over the lazy dog"] * 20,
                            trainers.BpeTrainer(
                                vocab_size=SIZES["vocab_size"],
                                special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False))
    model = json.loads(bpe.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def write_gguf(path, hf_model, types, *, add_bos=False, arch="llama", template=TEMPLATE,
               tokenizer=True, pre="default", vocab_size=True, strings=None, uints=None,
               token_types=None):
    """`hf_model`'s weights as llama.cpp writes them (names, permuted Q/K, `types` per
    tensor kind), with a byte-level BPE tokenizer in the metadata (and `{arch}.vocab_size`
    unless `vocab_size` is False; the head width where it is not hidden / heads; `strings`
    and `uints`: more {key: string} and {key: uint32} metadata; `token_types`: {id: llama.cpp
    token type} over the normal type 1); returns {GGUF name: (type, raw bytes as stored, shape)}."""
    config = hf_model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_uint32(f"{arch}.block_count", config.num_hidden_layers)
    writer.add_uint32(f"{arch}.context_length", 256)
    writer.add_uint32(f"{arch}.embedding_length", config.hidden_size)
    writer.add_uint32(f"{arch}.feed_forward_length", config.intermediate_size)
    writer.add_uint32(f"{arch}.attention.head_count", config.num_attention_heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", config.num_key_value_heads)
    if config.head_dim != config.hidden_size // config.num_attention_heads:
        writer.add_uint32(f"{arch}.attention.key_length", config.head_dim)
        writer.add_uint32(f"{arch}.attention.value_length", config.head_dim)
    writer.add_float32(f"{arch}.rope.freq_base", SIZES["rope_theta"])
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    if vocab_size:
        writer.add_uint32(f"{arch}.vocab_size", config.vocab_size)
    for key, value in (strings or {}).items():
        writer.add_string(key, value)
    for key, value in (uints or {}).items():
        writer.add_uint32(key, value)
    if tokenizer:
        tokens, merges = bpe_vocabulary()
        writer.add_string("tokenizer.ggml.model", "gpt2")
        writer.add_string("tokenizer.ggml.pre", pre)
        writer.add_token_list(tokens)
        writer.add_token_merges(merges)
        writer.add_token_types([3 if i < 3 else (token_types or {}).get(i, 1)
                                for i in range(len(tokens))])
        writer.add_uint32("tokenizer.ggml.bos_token_id", 1)
        writer.add_uint32("tokenizer.ggml.eos_token_id", 2)
        writer.add_bool("tokenizer.ggml.add_bos_token", add_bos)
        if template:
            writer.add_string("tokenizer.chat_template", template)
    stored = {}
    state = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(config.num_hidden_layers):
        for theirs, ours in per_layer.items():
            names[f"model.layers.{i}.{theirs}.weight"] = f"blk.{i}.{ours}.weight"
    for hf_name, name in names.items():
        weight = state[hf_name].astype(np.float32)
        if name.endswith("attn_q.weight"):
            weight = llama_cpp_permute(weight, config.num_attention_heads)
        if name.endswith("attn_k.weight"):
            weight = llama_cpp_permute(weight, config.num_key_value_heads)
        kind = Q.F32 if weight.ndim == 1 else types.get(name.split(".")[-2], Q.F32)
        raw = gguf.quants.quantize(weight, kind)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=kind)
        stored[name] = (kind, raw, weight.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def hf_llama(seed=0, **extra):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**SIZES, **extra})).eval()


QUANTIZED = {"token_embd": Q.Q8_0, "attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.Q8_0,
             "attn_output": Q.F16, "ffn_gate": Q.Q4_1, "ffn_up": Q.Q4_0, "ffn_down": Q.Q8_0}


def test_each_tensor_type_dequantizes_to_the_block_reference(tmp_path):
    """Catches a wrong dequantization of any type (a Q4 nibble order, a missing Q4_1 minimum,
    a scale read as the wrong width) and a Q/K row order that is not the inverse of
    llama.cpp's permutation: each HF tensor, permuted as llama.cpp stores it, equals the
    reference dequantization of the bytes in the file."""
    stored = write_gguf(tmp_path / "q.gguf", hf_llama(), QUANTIZED)
    checkpoint = GgufCheckpoint(str(tmp_path / "q.gguf"))
    assert {kind for kind, _, _ in stored.values()} == {Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1}
    heads = {"attn_q": SIZES["num_attention_heads"], "attn_k": SIZES["num_key_value_heads"]}
    for hf_name, name in checkpoint.files.items():
        kind, raw, shape = stored[name]
        ours = checkpoint.get(hf_name)
        assert ours.dtype == np.float32 and ours.shape == shape, name
        role = name.split(".")[-2]
        if role in heads:
            ours = llama_cpp_permute(ours, heads[role])
        np.testing.assert_array_equal(ours, reference_dequantize(raw, kind, shape), name)


def test_imported_logits_match_transformers_on_float_and_quantized_files(tmp_path):
    """Catches a missing or wrong Q/K un-permutation, a swapped gate/up or a wrong norm or
    RoPE setting read from the metadata: the imported F32 file's logits equal transformers' on
    the model it was written from, and a quantized file's equal those of transformers' own
    GGUF loader on the same file."""
    hf_model = hf_llama(initializer_range=0.2)
    tokens = np.random.default_rng(0).integers(0, SIZES["vocab_size"], (2, 11))
    for name, types in (("f32", {}), ("quantized", QUANTIZED)):
        write_gguf(tmp_path / f"{name}.gguf", hf_model, types)
        reference = (hf_model if name == "f32" else
                     transformers.AutoModelForCausalLM.from_pretrained(
                         str(tmp_path), gguf_file=f"{name}.gguf", dtype=torch.float32).eval())
        with torch.no_grad():
            expected = reference(torch.tensor(tokens)).logits.numpy()
        cfg = import_checkpoint(str(tmp_path / f"{name}.gguf"), str(tmp_path / name))
        params, _, meta = load_params(str(tmp_path / name))
        logits = jax.jit(M.forward, static_argnames="cfg")(params, cfg, tokens)
        np.testing.assert_allclose(np.asarray(logits), expected, atol=2e-4, err_msg=name)
        assert meta["source"]["architecture"] == "llama"
    assert meta["source"]["tensor_types"]["Q4_1"] == 2 * SIZES["num_hidden_layers"]


@pytest.mark.parametrize("add_bos", [False, True])
def test_tokenizer_metadata_round_trip_matches_transformers(tmp_path, add_bos):
    """Catches a tokenizer built from the file's metadata that splits text, keeps control
    tokens whole, adds a BOS or renders the chat template otherwise than transformers' own
    GGUF tokenizer does (a planted always-BOS fails the add_bos=False case)."""
    path = tmp_path / "t.gguf"
    write_gguf(path, hf_llama(), {}, add_bos=add_bos)
    import_checkpoint(str(path), str(tmp_path / "w"))
    _, _, meta = load_params(str(tmp_path / "w"))
    ours = get_tokenizer(meta["tokenizer"], str(tmp_path / "w"))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=True).tolist() == theirs(text)["input_ids"]
        assert ours.decode(ours.encode(text)) == text
    assert ours.prefix == ((1,) if add_bos else ())
    messages = [{"role": "user", "content": "hi there"}]
    assert render_chat(ours, messages) == theirs.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)
    assert ours.stop_ids == (2,)
    exported = theirs.__class__.from_pretrained(str(tmp_path / "w"))  # the workdir's own files
    ids = ours.encode(TEXTS[0], add_special_tokens=True).tolist()
    assert exported(TEXTS[0])["input_ids"] == ids


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2"])
def test_each_pre_tokenizer_splits_text_as_transformers_does(tmp_path, pre):
    """Catches a text-splitting expression taken for another `tokenizer.ggml.pre` (Llama-3's
    groups digits by three, Qwen2's splits every digit) and control tokens not marked special
    (swapped with user-defined ones): encodings and the special ids equal those of
    transformers' GGUF tokenizer."""
    write_gguf(tmp_path / "t.gguf", hf_llama(), {}, pre=pre)
    import_checkpoint(str(tmp_path / "t.gguf"), str(tmp_path / "w"))
    _, _, meta = load_params(str(tmp_path / "w"))
    ours = get_tokenizer(meta["tokenizer"], str(tmp_path / "w"))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
    for text in [*TEXTS, "x = 12345678 + 90\n\n  y", "I'm 123 years'll"]:
        assert ours.encode(text, add_special_tokens=True).tolist() == theirs(text)["input_ids"]
    with open(tmp_path / "w" / "tokenizer.json", encoding="utf-8") as f:
        special = {t["id"] for t in json.load(f)["added_tokens"] if t["special"]}
    added = theirs.backend_tokenizer.get_added_tokens_decoder()
    assert special == {i for i, token in added.items() if token.special} == {0, 1, 2}


def test_only_control_tokens_are_special(tmp_path):
    """Only control tokens (GGUF token type 3) are special in the written tokenizer.json, as
    in transformers' GGUF tokenizer: a user-defined token (type 4, like `<think>`) is an added
    token that is not special (matched whole in text, kept by a decode that skips special
    tokens), and unused (5) and byte (6) tokens are plain vocabulary. Catches the special
    test widened to `kind >= CONTROL`, which marks the unused and byte tokens special (a
    decode with skip_special_tokens then drops them)."""
    tokens, _ = bpe_vocabulary()
    longest = sorted(range(3, len(tokens)), key=lambda i: -len(tokens[i]))
    user, unused, byte = longest[:3]
    write_gguf(tmp_path / "t.gguf", hf_llama(), {}, token_types={user: 4, unused: 5, byte: 6})
    import_checkpoint(str(tmp_path / "t.gguf"), str(tmp_path / "w"))
    with open(tmp_path / "w" / "tokenizer.json", encoding="utf-8") as f:
        added = {t["id"]: t["special"] for t in json.load(f)["added_tokens"]}
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
    assert added == {i: token.special for i, token in
                     theirs.backend_tokenizer.get_added_tokens_decoder().items()}
    assert added == {0: True, 1: True, 2: True, user: False}
    exported = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "w" / "tokenizer.json"))
    ids = [1, user, unused, byte, 2]
    text = exported.decode(ids[1:-1])
    assert exported.decode(ids, skip_special_tokens=True) == text
    assert theirs.decode(ids, skip_special_tokens=True) == text
    assert exported("x" + exported.decode([user]) + "x")["input_ids"][1:-1] == [user]


def test_bad_files_are_one_line_errors_and_write_nothing(tmp_path):
    """Catches a bad GGUF reaching a traceback, or a half-written workdir: a truncated file,
    a file that is not GGUF, another architecture, a tensor type the gguf package cannot
    dequantize, a tensor with no place in a Llama model and a missing file."""
    model = hf_llama()
    good = tmp_path / "good.gguf"
    write_gguf(good, model, {})
    data = good.read_bytes()
    (tmp_path / "truncated.gguf").write_bytes(data[:len(data) // 2])
    (tmp_path / "text.gguf").write_text("not a gguf file\n")
    write_gguf(tmp_path / "falcon.gguf", model, {}, arch="falcon")
    cases = {"truncated.gguf": "is not a readable GGUF file",
             "text.gguf": "is not a readable GGUF file",
             "falcon.gguf": "GGUF architecture 'falcon' is not supported",
             "missing.gguf": "does not exist"}
    for name, pattern in cases.items():
        workdir = tmp_path / f"w_{name}"
        with pytest.raises(ConversionError, match=pattern) as caught:
            import_checkpoint(str(tmp_path / name), str(workdir))
        assert "\n" not in str(caught.value)
        assert not workdir.exists(), name
    for name, tensor, options in (
            ("fused.gguf", "blk.0.attn_qkv.weight", {}),
            ("q8_1.gguf", "token_embd.weight", dict(raw_shape=(300, 80), raw_dtype=Q.Q8_1))):
        writer = gguf.GGUFWriter(str(tmp_path / name), "llama")
        writer.add_tensor(tensor, np.zeros((300, 80), np.uint8 if options else np.float32),
                          **options)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    with pytest.raises(ConversionError, match="'blk.0.attn_qkv.weight' has no place"):
        GgufCheckpoint(str(tmp_path / "fused.gguf"))
    with pytest.raises(ConversionError, match="type Q8_1, which the gguf package cannot"):
        GgufCheckpoint(str(tmp_path / "q8_1.gguf")).get("model.embed_tokens.weight")
    result = run_script("tools/convert.py", "--gguf", str(tmp_path / "text.gguf"), "--workdir",
                        str(tmp_path / "cli"))
    assert result.returncode == 1 and "is not a readable GGUF file" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "cli").exists()


def test_a_gguf_with_rope_scaling_is_refused_in_one_line(tmp_path):
    """A GGUF whose metadata sets `llama.rope.scaling.type` ("linear", as llama.cpp writes a
    context-extended model) is a one-line error naming the scaling, nothing written. Catches
    the key misspelled where the import reads it: the scaling unseen, the model imported with
    plain RoPE (positions past the original context would be wrong, silently)."""
    path = tmp_path / "scaled.gguf"
    write_gguf(path, hf_llama(), {}, strings={"llama.rope.scaling.type": "linear"})
    assert gguf.GGUFReader(str(path)).fields["llama.rope.scaling.type"].contents() == "linear"
    with pytest.raises(ConversionError, match="RoPE scaling 'linear' is not supported") as caught:
        import_checkpoint(str(path), str(tmp_path / "w"))
    assert "\n" not in str(caught.value) and not (tmp_path / "w").exists()


def test_without_a_vocab_size_key_the_vocabulary_is_the_embeddings_row_count(tmp_path):
    """With neither `llama.vocab_size` nor a token list in the metadata, the imported vocab_size
    is the row count of the embedding (300 tokens by 64 hidden), and the logits are 300 wide.
    Catches the fallback reading the embedding's other axis (the hidden size, 64)."""
    model = hf_llama()
    path = tmp_path / "novocab.gguf"
    write_gguf(path, model, {}, tokenizer=False, vocab_size=False)
    fields = gguf.GGUFReader(str(path)).fields
    assert "llama.vocab_size" not in fields and "tokenizer.ggml.tokens" not in fields
    rows = model.model.embed_tokens.weight.shape[0]
    assert rows == SIZES["vocab_size"] != SIZES["hidden_size"]
    assert GgufCheckpoint(str(path)).hf_config()["vocab_size"] == rows
    cfg = import_checkpoint(str(path), str(tmp_path / "w"))
    params, _, _ = load_params(str(tmp_path / "w"))
    assert cfg.vocab_size == rows == params["embed"].shape[0]


def test_a_head_width_other_than_hidden_over_heads_is_read_from_key_length(tmp_path):
    """Heads 32 wide in a 64-wide model of 4 heads (hidden / heads is 16; Mistral-Nemo's are
    128 against 5120 / 32) are recorded in `llama.attention.key_length`: the import's head_dim
    is 32 and its logits equal transformers' on the model the file was written from. Catches
    key_length ignored (head_dim taken as hidden / heads: Q/K/V split into the wrong heads)."""
    hf_model = hf_llama(initializer_range=0.2, head_dim=32)
    write_gguf(tmp_path / "wide.gguf", hf_model, {})
    assert gguf.GGUFReader(str(tmp_path / "wide.gguf")).fields[
        "llama.attention.key_length"].contents() == 32
    tokens = np.random.default_rng(0).integers(0, SIZES["vocab_size"], (2, 9))
    with torch.no_grad():
        expected = hf_model(torch.tensor(tokens)).logits.numpy()
    cfg = import_checkpoint(str(tmp_path / "wide.gguf"), str(tmp_path / "w"))
    assert cfg.head_dim == 32
    params, _, _ = load_params(str(tmp_path / "w"))
    logits = jax.jit(M.forward, static_argnames="cfg")(params, cfg, tokens)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=2e-4)
