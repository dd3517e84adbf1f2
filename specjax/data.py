"""Input pipeline: documents -> train/validation split -> packed fixed-length sequences -> batches.

Documents come from an HF `datasets.Dataset` with a `key` and a `text` column. Sources:
  - "stdlib": the embedded default corpus, the Python standard library source of the running
    interpreter (every .py file, without test/tests folders and site-packages): real text present
    on every machine, no download;
  - "files": local .jsonl files (one JSON object per line, text in `text_field`) or plain text
    files (one document each);
  - "hub": an HF hub dataset (needs the network; tests never use it).

The split is by document key (a stable hash), so it is deterministic across machines and runs.
Batch `i` of an epoch is a fixed function of (seed, i): data order is reproducible and a run
resumes exactly from the number of batches already consumed.
"""

from __future__ import annotations

import dataclasses
import os
import sysconfig
import zlib
from collections.abc import Mapping
from typing import Any

import datasets
import numpy as np

from specjax.config import dataclass_from_mapping
from specjax.tokenizer import Tokenizer, get_tokenizer

SOURCES = ("stdlib", "files", "hub")
_EXCLUDED_DIRS = frozenset({"test", "tests", "site-packages", "__pycache__"})


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the text comes from and how it is cut into training sequences."""

    source: str = "stdlib"
    files: tuple[str, ...] = ()
    hub_name: str = ""
    hub_config: str = ""
    hub_split: str = "train"
    text_field: str = "text"
    tokenizer: str = "bytes"
    seq_len: int = 256
    val_fraction: float = 0.05
    max_documents: int = 0

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"data.source={self.source!r} must be one of {list(SOURCES)}")
        if self.source == "files" and not self.files:
            raise ValueError("data.files must list at least one file when data.source='files'")
        if self.source == "hub" and not self.hub_name:
            raise ValueError("data.hub_name must be set when data.source='hub'")
        if self.seq_len < 2:
            raise ValueError(f"data.seq_len={self.seq_len} must be >= 2")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={self.val_fraction} must lie in (0, 1)")
        if self.max_documents < 0:
            raise ValueError(f"data.max_documents={self.max_documents} must be >= 0 (0 = all)")
        get_tokenizer(self.tokenizer)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DataConfig:
        """`files` may be a list or one string of comma-separated paths (the command line's
        `--config.data.files=a.jsonl,b.txt`)."""
        values = dict(values)
        if "files" in values:
            files = values["files"]
            files = files.split(",") if isinstance(files, str) else files
            values["files"] = tuple(f.strip() for f in files if f.strip())
        return dataclass_from_mapping(cls, values, "data")


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def stdlib_documents() -> datasets.Dataset:
    """The standard library's .py files, keyed by path relative to the stdlib directory."""
    root = stdlib_dir()
    keys, texts = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    texts.append(f.read())
                keys.append(os.path.relpath(path, root))
    return datasets.Dataset.from_dict({"key": keys, "text": texts})


def _file_documents(cfg: DataConfig) -> datasets.Dataset:
    parts = []
    for path in cfg.files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"data file {path!r} does not exist")
        if path.endswith((".jsonl", ".json")):
            rows = datasets.load_dataset("json", data_files=path, split="train")
            if cfg.text_field not in rows.column_names:
                raise ValueError(
                    f"{path}: no field {cfg.text_field!r} (fields: {rows.column_names})")
            parts.append(datasets.Dataset.from_dict({
                "key": [f"{path}:{i}" for i in range(len(rows))], "text": rows[cfg.text_field]}))
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                parts.append(datasets.Dataset.from_dict({"key": [path], "text": [f.read()]}))
    return datasets.concatenate_datasets(parts)


def _hub_documents(cfg: DataConfig) -> datasets.Dataset:
    rows = datasets.load_dataset(cfg.hub_name, cfg.hub_config or None, split=cfg.hub_split)
    return datasets.Dataset.from_dict({
        "key": [f"{cfg.hub_name}:{i}" for i in range(len(rows))], "text": rows[cfg.text_field]})


def load_documents(cfg: DataConfig) -> datasets.Dataset:
    """All documents of the configured source, sorted by key (optionally only the first N)."""
    loaders = {"stdlib": lambda c: stdlib_documents(), "files": _file_documents,
               "hub": _hub_documents}
    docs = loaders[cfg.source](cfg)
    if len(docs) == 0:
        raise ValueError(f"data source {cfg.source!r} produced no documents")
    docs = docs.select(np.argsort(docs["key"], kind="stable"))
    if cfg.max_documents:
        docs = docs.select(range(min(cfg.max_documents, len(docs))))
    return docs


def is_validation_key(key: str, val_fraction: float) -> bool:
    """A stable per-document coin: crc32 of the key against the validation fraction."""
    return zlib.crc32(key.encode("utf-8")) % 10_000 < round(val_fraction * 10_000)


def split_documents(docs: datasets.Dataset,
                    val_fraction: float) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(train, validation), decided per document key."""
    flags = [is_validation_key(k, val_fraction) for k in docs["key"]]
    val = docs.select([i for i, f in enumerate(flags) if f])
    train = docs.select([i for i, f in enumerate(flags) if not f])
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"val_fraction={val_fraction} leaves an empty split "
                         f"({len(train)} train / {len(val)} validation documents)")
    return train, val


def pack(docs: datasets.Dataset, tokenizer: Tokenizer, seq_len: int) -> np.ndarray:
    """Concatenates [BOS] doc [EOS] for every document and cuts the stream into non-overlapping
    windows of seq_len + 1 tokens (inputs are window[:-1], targets window[1:])."""
    stream = np.concatenate([tokenizer.encode(t, add_bos=True, add_eos=True)
                             for t in docs["text"]])
    count = len(stream) // (seq_len + 1)
    if count == 0:
        raise ValueError(f"{len(stream)} tokens are too few for one sequence of {seq_len + 1}")
    return stream[:count * (seq_len + 1)].reshape(count, seq_len + 1).astype(np.int32)


class BatchSampler:
    """Shuffled batches of packed sequences. The stream of sequences is a pure function of the
    seed; a batch is addressed by its offset in that stream (the data position), so a resumed
    run continues exactly where the interrupted one stopped, whatever its batch size."""

    def __init__(self, sequences: np.ndarray, batch_size: int, seed: int):
        self.sequences, self.batch_size, self.seed = sequences, batch_size, seed
        self._epoch, self._order = -1, None

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._epoch, self._order = epoch, rng.permutation(len(self.sequences))
        return self._order

    def batch(self, position: int, rows: slice = slice(None)) -> np.ndarray:
        """The `batch_size` sequences starting at stream offset `position`, [B, seq_len + 1],
        or only their `rows` (a process reads the rows its devices hold)."""
        total = len(self.sequences)
        chosen = []
        for flat in range(position, position + self.batch_size)[rows]:
            epoch, offset = divmod(flat, total)
            chosen.append(self._permutation(epoch)[offset])
        return self.sequences[np.asarray(chosen)]


@dataclasses.dataclass
class Corpus:
    """Packed train and validation sequences of one data config."""

    train: np.ndarray
    validation: np.ndarray
    validation_documents: datasets.Dataset

    @classmethod
    def build(cls, cfg: DataConfig) -> Corpus:
        tokenizer = get_tokenizer(cfg.tokenizer)
        train_docs, val_docs = split_documents(load_documents(cfg), cfg.val_fraction)
        return cls(pack(train_docs, tokenizer, cfg.seq_len),
                   pack(val_docs, tokenizer, cfg.seq_len), val_docs)

    def validation_batches(self, batch_size: int, num_batches: int) -> list[np.ndarray]:
        """The first `num_batches` validation batches in file order (fewer if data runs out)."""
        usable = min(num_batches, len(self.validation) // batch_size)
        if usable == 0:
            return [self.validation[:batch_size]]
        return [self.validation[i * batch_size:(i + 1) * batch_size] for i in range(usable)]
