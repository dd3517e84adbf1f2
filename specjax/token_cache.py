"""Tokenized corpora kept on disk: each corpus is tokenized once, in batches, and memory-mapped
by every later run (a resume, a second run, every process of a multi-process run).

A corpus is two flat token streams, train and validation, each the concatenation of
[BOS] doc [EOS] over its documents in order. It lives in `<cache dir>/tokens/<key>/`, the key a
hash of the documents' identity (file paths, sizes, modification times), the tokenizer's
fingerprint (file bytes, BOS/EOS ids) and the split. Documents stream through in batches, so
the corpus may be larger than memory. The folder is written under a temporary name and renamed
when complete (`outputs.staged_dir`): an interrupted run leaves no half-written cache, and two
runs building the same one at once both end with a whole one (the later replaces the earlier,
whose open maps stay valid).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from specjax.outputs import staged_dir
from specjax.tokenizer import Tokenizer

FORMAT = 1  # bump when the streams' layout changes
BATCH_DOCUMENTS = 512  # documents tokenized per call of the Rust tokenizer
STREAMS = ("train", "validation")


def cache_root(configured: str = "") -> str:
    """`configured`, else $SPECJAX_CACHE, else ~/.cache/specjax."""
    return (configured or os.environ.get("SPECJAX_CACHE")
            or os.path.join(os.path.expanduser("~"), ".cache", "specjax"))


def stream_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (half the disk and page cache of int32), else int32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)


def cache_key(identity: dict[str, Any], tokenizer: Tokenizer) -> str:
    blob = json.dumps({"format": FORMAT, "documents": identity,
                       "tokenizer": tokenizer.fingerprint()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def token_streams(documents: Callable[[], Iterable[tuple[str, str]]], identity: dict[str, Any],
                  is_validation: Callable[[str], bool], tokenizer: Tokenizer,
                  cache_dir: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) token streams, memory-mapped read-only from the cache; built first
    from `documents()` ((key, text) pairs) when the cache lacks them. `identity` must name the
    documents and the split (`is_validation(key)`) completely."""
    folder = os.path.join(cache_root(cache_dir), "tokens", cache_key(identity, tokenizer))
    if not os.path.isfile(os.path.join(folder, "meta.json")):
        _build(folder, documents(), is_validation, tokenizer)
    with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    dtype = np.dtype(meta["dtype"])
    return tuple(_map(os.path.join(folder, f"{name}.bin"), dtype, meta[name]["tokens"])
                 for name in STREAMS)


def _map(path: str, dtype: np.dtype, tokens: int) -> np.ndarray:
    if tokens == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(tokens,))


def _build(folder: str, documents: Iterable[tuple[str, str]],
           is_validation: Callable[[str], bool], tokenizer: Tokenizer) -> None:
    with staged_dir(folder) as staging:
        dtype = stream_dtype(tokenizer.vocab_size)
        counts = {name: {"documents": 0, "tokens": 0} for name in STREAMS}
        files = {name: open(os.path.join(staging, f"{name}.bin"), "wb") for name in STREAMS}
        try:
            for keys, texts in _batches(documents):
                encoded = tokenizer.encode_batch(texts, add_special_tokens=True, add_eos=True)
                for key, ids in zip(keys, encoded, strict=True):
                    name = STREAMS[1] if is_validation(key) else STREAMS[0]
                    files[name].write(ids.astype(dtype).tobytes())
                    counts[name]["documents"] += 1
                    counts[name]["tokens"] += len(ids)
        finally:
            for f in files.values():
                f.close()
        with open(os.path.join(staging, "meta.json"), "w", encoding="utf-8") as f:
            json.dump({"dtype": dtype.name, **counts}, f)


def _batches(documents: Iterable[tuple[str, str]]) -> Iterator[tuple[list[str], list[str]]]:
    keys, texts = [], []
    for key, text in documents:
        keys.append(key)
        texts.append(text)
        if len(keys) == BATCH_DOCUMENTS:
            yield keys, texts
            keys, texts = [], []
    if keys:
        yield keys, texts
