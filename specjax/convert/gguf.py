"""A GGUF file (llama.cpp's one-file checkpoint) read as the pieces of a Hugging Face checkpoint:
its config.json keys, its tensors under their HF names (dequantized to float32), and its
tokenizer (a tokenizer.json built from the file's vocabulary, with its special-token
conventions and chat template). `convert.hf.import_checkpoint` takes it where it takes a folder.

Only Llama-family files are read (`general.architecture` "llama": Llama, Mistral, SmolLM...).
llama.cpp's converter permutes the rows of each Q and K projection for its RoPE kernel (the two
halves of every head interleaved); `_unpermute` restores transformers' order. Tensors of any
type the `gguf` package dequantizes (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_x, the K-quants) are
read; the weights stay quantization-rounded, so the model is the GGUF's, not the original's.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import numpy as np

from specjax.convert.hf_config import ConversionError
from specjax.tokenizer import TokenizerSource

SUFFIX = ".gguf"
MAGIC = b"GGUF"
ARCHITECTURES = {"llama": "LlamaForCausalLM"}
# GGUF tensor names -> transformers' Llama names; {i} is the layer.
_LLAMA_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
# The regular expressions llama.cpp's byte-level pre-tokenizers split text with before BPE
# (`tokenizer.ggml.pre`); any other value splits as GPT-2 does (ByteLevel's own expression).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
          "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types


def is_gguf(path: str) -> bool:
    """Whether `path` names a GGUF file (by its suffix, or by its first bytes)."""
    if path.endswith(SUFFIX):
        return True
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == MAGIC


class GgufCheckpoint:
    """One GGUF file, memory-mapped; nothing is dequantized until a tensor is asked for."""

    def __init__(self, path: str):
        try:
            import gguf  # the optional `gguf` extra: only a GGUF import needs it
        except ImportError:
            raise ConversionError("reading a GGUF file needs the gguf package: pip install "
                                  "gguf (or specjax's [gguf] extra)") from None

        if not os.path.isfile(path):
            problem = "is a directory" if os.path.isdir(path) else "does not exist"
            raise ConversionError(f"GGUF file {path!r} {problem}")
        try:
            reader = gguf.GGUFReader(path)
        except Exception as error:  # the reader raises ValueError, struct and numpy errors
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ConversionError(f"{path} is not a readable GGUF file (truncated, or not "
                                  f"GGUF?): {first}") from None
        self.path, self._reader, self._gguf = path, reader, gguf
        self.architecture = self.value("general.architecture")
        if self.architecture not in ARCHITECTURES:
            raise ConversionError(f"{path}: GGUF architecture {self.architecture!r} is not "
                                  f"supported; supported: {sorted(ARCHITECTURES)}")
        self.files = self._hf_names()

    def value(self, key: str, default: Any = None) -> Any:
        """A metadata value (a string, number, bool or list), or `default` if absent."""
        field = self._reader.fields.get(key)
        return default if field is None else field.contents()

    def _arch(self, key: str, default: Any = None) -> Any:
        return self.value(f"{self.architecture}.{key}", default)

    def hf_config(self) -> dict[str, Any]:
        """The config.json transformers would write for this model."""
        heads, kv_heads = self._arch("attention.head_count"), self._arch("attention.head_count_kv")
        if isinstance(heads, list) or isinstance(kv_heads, list):
            raise ConversionError(f"{self.path}: per-layer head counts are not supported")
        hidden = self._arch("embedding_length")
        head_dim = self._arch("attention.key_length") or hidden // heads
        rotary = self._arch("rope.dimension_count", head_dim)
        if rotary != head_dim:
            raise ConversionError(f"{self.path}: RoPE over {rotary} of {head_dim} head "
                                  "dimensions is not supported (full rotation only)")
        scaling = self._arch("rope.scaling.type", "none")
        if scaling != "none":
            raise ConversionError(f"{self.path}: RoPE scaling {scaling!r} is not supported")
        tokens = self.value("tokenizer.ggml.tokens") or []
        embed = self._tensor("token_embd.weight")
        return {
            "architectures": [ARCHITECTURES[self.architecture]], "model_type": "llama",
            "vocab_size": self._arch("vocab_size") or len(tokens) or int(embed.shape[-1]),
            "hidden_size": hidden, "num_hidden_layers": self._arch("block_count"),
            "intermediate_size": self._arch("feed_forward_length"),
            "num_attention_heads": heads, "num_key_value_heads": kv_heads or heads,
            "head_dim": head_dim, "rms_norm_eps": self._arch("attention.layer_norm_rms_epsilon"),
            "rope_theta": self._arch("rope.freq_base", 10000.0), "hidden_act": "silu",
            "tie_word_embeddings": "output.weight" not in {t.name for t in
                                                            self._reader.tensors},
            "torch_dtype": "float32"}

    def _hf_names(self) -> dict[str, str]:
        """{HF name: GGUF name} of every tensor; an unknown tensor is a one-line error."""
        patterns = [(re.compile(re.escape(ours).replace(re.escape("{i}"), r"(\d+)") + "$"),
                     theirs) for ours, theirs in _LLAMA_NAMES.items()]
        names = {}
        for tensor in self._reader.tensors:
            for pattern, hf_name in patterns:
                if match := pattern.match(tensor.name):
                    names[hf_name.format(i=match.group(1)) if match.groups() else hf_name] = (
                        tensor.name)
                    break
            else:
                raise ConversionError(f"{self.path}: tensor {tensor.name!r} has no place in a "
                                      "Llama model (not read: the import would drop it)")
        return names

    @functools.cached_property
    def _tensors(self) -> dict[str, Any]:
        return {t.name: t for t in self._reader.tensors}

    def _tensor(self, name: str) -> Any:
        if name not in self._tensors:
            raise ConversionError(f"{self.path} is missing tensor {name!r}")
        return self._tensors[name]

    def get(self, hf_name: str) -> np.ndarray:
        """The tensor transformers calls `hf_name`, float32, in transformers' layout."""
        if hf_name not in self.files:
            raise ConversionError(f"{self.path} is missing tensor {hf_name!r}")
        tensor = self._tensor(self.files[hf_name])
        try:
            values = self._gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise ConversionError(f"{self.path}: tensor {tensor.name!r} is of type "
                                  f"{tensor.tensor_type.name}, which the gguf package cannot "
                                  "dequantize") from None
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dimensions inner first
        values = np.asarray(values, np.float32).reshape(shape)
        if hf_name.endswith("q_proj.weight"):
            return _unpermute(values, self._arch("attention.head_count"))
        if hf_name.endswith("k_proj.weight"):
            kv_heads = self._arch("attention.head_count_kv") or self._arch("attention.head_count")
            return _unpermute(values, kv_heads)
        return values

    def tensors(self) -> GgufCheckpoint:
        """The tensor reader `hf_weights.load_hf_params` takes: the file itself."""
        return self

    def summary(self) -> dict[str, Any]:
        """What the import records of the file: its path, architecture and tensor types."""
        types: dict[str, int] = {}
        for tensor in self._reader.tensors:
            types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
        return {"gguf": os.path.abspath(self.path), "architecture": self.architecture,
                "tensor_types": types}

    def tokenizer(self) -> TokenizerSource | None:
        """The file's tokenizer (None, with the reason, where it is not a byte-level BPE)."""
        kind = self.value("tokenizer.ggml.model")
        if kind != "gpt2":
            return None
        tokens = self.value("tokenizer.ggml.tokens")
        special = {name: self.value(f"tokenizer.ggml.{name}_token_id")
                   for name in ("bos", "eos")}
        add = {name: bool(self.value(f"tokenizer.ggml.add_{name}_token", False))
               for name in ("bos", "eos")}
        prefix = [special["bos"]] if add["bos"] else []
        suffix = [special["eos"]] if add["eos"] else []
        return TokenizerSource(
            json=byte_level_bpe(tokens, self.value("tokenizer.ggml.merges") or [],
                                self.value("tokenizer.ggml.token_type") or [],
                                self.value("tokenizer.ggml.pre", "default")),
            bos_id=special["bos"], eos_id=special["eos"], stop_ids=[special["eos"]],
            prefix=prefix, suffix=suffix, chat_template=self.value("tokenizer.chat_template"))

    def tokenizer_problem(self) -> str:
        """Why `tokenizer` is None."""
        return (f"its tokenizer is of llama.cpp type {self.value('tokenizer.ggml.model')!r}; "
                "the GGUF import builds byte-level BPE ('gpt2') tokenizers only")


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K row order -> transformers': within each head, llama.cpp interleaves the
    rows of the two rotated halves (row 2j is transformers' row j, row 2j+1 its row j + d/2)."""
    rows = weight.shape[0]
    return (weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def byte_level_bpe(tokens: list[str], merges: list[str], types: list[int], pre: str) -> str:
    """A tokenizer.json of a byte-level BPE vocabulary as GGUF stores it: `tokens` spelled in
    GPT-2's byte alphabet, `merges` as "a b", control tokens (type 3) special and never split,
    user-defined ones (type 4) never split; `pre` picks the text-splitting expression. The ids
    around a text are the `TokenizerSource`'s (`HFTokenizer.save_files` writes them)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: index for index, token in enumerate(tokens)}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges]))
    split = SPLITS.get(pre)
    bpe.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=False) if split is None else
                         pre_tokenizers.Sequence([
                             pre_tokenizers.Split(Regex(split), behavior="isolated"),
                             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    bpe.decoder = decoders.ByteLevel()
    kinds = dict(enumerate(types))
    bpe.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True)
                            for i, kind in kinds.items() if kind == CONTROL])
    bpe.add_tokens([AddedToken(tokens[i], normalized=False)
                    for i, kind in kinds.items() if kind == USER_DEFINED])
    return bpe.to_str()
