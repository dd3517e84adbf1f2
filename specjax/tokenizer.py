"""Tokenizers. The byte-level one needs no vocabulary file: ids 0-255 are bytes, then BOS, EOS
and PAD."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np


class ByteTokenizer:
    """UTF-8 bytes plus three special ids; decoding replaces invalid byte sequences."""

    name = "bytes"
    bos_id, eos_id, pad_id = 256, 257, 258
    vocab_size = 259

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> np.ndarray:
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
        parts = ([np.array([self.bos_id], np.int32)] if add_bos else []) + [ids]
        if add_eos:
            parts.append(np.array([self.eos_id], np.int32))
        return np.concatenate(parts)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer (tokenizer.json) with BOS/EOS ids from the
    checkpoint's config; BOS and EOS are added by us, never by the tokenizer's template."""

    name = "hf"

    def __init__(self, path: str, bos_id: int | None = None, eos_id: int | None = None):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(path)
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, None
        self.vocab_size = self._tokenizer.get_vocab_size()

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> np.ndarray:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        ids = ([self.bos_id] if add_bos and self.bos_id is not None else []) + ids
        if add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return np.asarray(ids, np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


Tokenizer = ByteTokenizer | HFTokenizer


def get_tokenizer(spec: str | dict, workdir: str | None = None) -> Tokenizer:
    """The tokenizer a config or checkpoint names: "bytes", or {"kind": "hf", "file": ...,
    "bos_id": ..., "eos_id": ...} with the file relative to `workdir`."""
    if spec == ByteTokenizer.name:
        return ByteTokenizer()
    if isinstance(spec, dict) and spec.get("kind") == HFTokenizer.name:
        return HFTokenizer(os.path.join(workdir or ".", spec["file"]), spec.get("bos_id"),
                           spec.get("eos_id"))
    if spec is None:
        raise ValueError("this checkpoint names no tokenizer (imported without tokenizer.json): "
                         "import it again with `infer/convert.py --tokenizer bytes`, or with a "
                         "tokenizer.json in the Hugging Face directory")
    raise ValueError(f"unknown tokenizer {spec!r}; available: '{ByteTokenizer.name}' or a "
                     "Hugging Face tokenizer.json imported by infer/convert.py")
