"""Tokenizers. The byte-level one needs no vocabulary file: ids 0-255 are bytes, then BOS, EOS
and PAD."""

from __future__ import annotations

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


def get_tokenizer(name: str) -> ByteTokenizer:
    """The tokenizer registered under `name` (only "bytes" for now)."""
    if name != ByteTokenizer.name:
        raise ValueError(f"unknown tokenizer {name!r}; available: ['{ByteTokenizer.name}']")
    return ByteTokenizer()
