"""Input pipeline: documents -> train/validation split -> the model's tokens (cached on disk) ->
packed fixed-length sequences -> batches.

Documents are (key, text) pairs read one at a time, so a corpus larger than memory streams
through. Sources:
  - "stdlib": the embedded default corpus, the Python standard library source of the running
    interpreter (every .py file, without test/tests folders and site-packages): real text present
    on every machine, no download;
  - "files": local files and globs: .jsonl/.json (one JSON object per line, text in
    `text_field`), .parquet (text in column `text_field`) or plain text (one document each);
  - "hub": a Hugging Face `datasets` dataset, streamed: a hub name (needs the network) or a
    local dataset folder (`load_dataset` on local files works offline).

The split is by document key (a stable hash), so it is deterministic across machines and runs,
and no validation document is ever trained on. Tokens go to `token_cache` once per (documents,
tokenizer); batch `i` of an epoch is a fixed function of (seed, i), so a run resumes exactly from
the number of sequences already consumed.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import itertools
import json
import os
import sysconfig
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from absl import logging

from specjax.config import check_number_fields, dataclass_from_mapping
from specjax.token_cache import cache_key, token_streams
from specjax.tokenizer import UNSET_ID, Tokenizer, load_tokenizer

SOURCES = ("stdlib", "files", "hub")
_EXCLUDED_DIRS = frozenset({"test", "tests", "site-packages", "__pycache__"})


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the text comes from, how it is tokenized and cut into training sequences.

    `tokenizer`: "bytes", or a tokenizer.json (or a folder holding one; a run on `init.source`
    takes the source's), each document encoded as the tokenizer encodes a text (its own special
    tokens: a BOS where its post-processor or `add_bos_token` adds one) and ended with its EOS;
    `bos_id` >= 0 starts every document with that id instead, `eos_id` >= 0 ends it with
    that one.
    `cache_dir`: where tokenized corpora are kept (default $SPECJAX_CACHE, else
    ~/.cache/specjax)."""

    source: str = "stdlib"
    files: tuple[str, ...] = ()
    hub_name: str = ""
    hub_config: str = ""
    hub_split: str = "train"
    text_field: str = "text"
    tokenizer: str = "bytes"
    bos_id: int = UNSET_ID
    eos_id: int = UNSET_ID
    seq_len: int = 256
    val_fraction: float = 0.05
    max_documents: int = 0
    cache_dir: str = ""

    def __post_init__(self) -> None:
        check_number_fields(self, "data")
        if self.source not in SOURCES:
            raise ValueError(f"data.source={self.source!r} must be one of {list(SOURCES)}")
        for field, source in (("files", "files"), ("hub_name", "hub")):
            if getattr(self, field) and self.source != source:
                raise ValueError(f"data.{field} is read only with data.source={source!r} (it is "
                                 f"{self.source!r}): set data.source={source!r} too, or drop "
                                 f"data.{field}")
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
        if not isinstance(self.tokenizer, str) or not self.tokenizer:
            raise ValueError(f"data.tokenizer={self.tokenizer!r} must be 'bytes' or the path of "
                             "a tokenizer.json")
        for name in ("bos_id", "eos_id"):
            if getattr(self, name) < UNSET_ID:
                raise ValueError(f"data.{name}={getattr(self, name)!r} must be an id >= 0, or "
                                 f"{UNSET_ID} for the one found beside the tokenizer")

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

    def make_tokenizer(self) -> Tokenizer:
        """The tokenizer this data is encoded with (a one-line error for a missing file or one
        that is not a tokenizer)."""
        ids = [None if value == UNSET_ID else value for value in (self.bos_id, self.eos_id)]
        return load_tokenizer(self.tokenizer, *ids)


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def _stdlib_paths() -> list[tuple[str, str]]:
    """(key, path) of the standard library's .py files, sorted by key (the path relative to the
    stdlib directory)."""
    root = stdlib_dir()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_DIRS)
        found += [(os.path.relpath(os.path.join(dirpath, name), root), os.path.join(dirpath, name))
                  for name in filenames if name.endswith(".py")]
    return sorted(found)


def _read_text(path: str) -> str:
    with open(path, "rb") as f:
        text, whole = _utf8(f.read())
    if not whole:
        _warn_not_utf8(path)
    return text


def _utf8(data: bytes) -> tuple[str, bool]:
    """`data` as text, bytes that are not UTF-8 replaced (U+FFFD), and whether all were."""
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), False


def _warn_not_utf8(where: str) -> None:
    """Says that text was changed as it was read (the model would learn U+FFFD silently)."""
    logging.warning("%s is not UTF-8 text: its undecodable bytes are read as U+FFFD, the "
                    "replacement character (reported once per file)", where)


def data_files(cfg: DataConfig) -> list[str]:
    """The files `cfg.files` names, globs expanded (each pattern's matches sorted), in order;
    a pattern that matches nothing, a missing or an empty file is a one-line error."""
    found = []
    for pattern in cfg.files:
        if os.path.isdir(pattern):
            raise ValueError(f"data file {pattern!r} is a directory (give files or a glob)")
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [
            pattern]
        matches = [m for m in matches if not os.path.isdir(m)]
        if not matches:
            raise FileNotFoundError(f"data file {pattern!r} does not exist" if not
                                    glob.has_magic(pattern) else
                                    f"data files {pattern!r} match no file")
        for path in matches:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"data file {path!r} does not exist")
            if os.path.getsize(path) == 0:
                raise ValueError(f"data file {path!r} is empty")
            if not os.access(path, os.R_OK):
                raise ValueError(f"data file {path!r} is not readable")
        found += matches
    return found


def _file_documents(cfg: DataConfig, setting: str) -> Iterator[tuple[str, str]]:
    for path in data_files(cfg):
        if path.endswith((".jsonl", ".json")):
            yield from _jsonl_documents(path, cfg.text_field, setting)
        elif path.endswith(".parquet"):
            yield from _parquet_documents(path, cfg.text_field, setting)
        else:
            yield path, _read_text(path)


def jsonl_rows(path: str, *, strict_utf8: bool = False) -> Iterator[tuple[int, Any]]:
    """Each non-blank line of a JSONL file (gzipped where `path` ends in .gz) as (line number,
    its JSON value), a bad line a one-line "path:N: ..." error. Bytes that are not UTF-8 are
    refused with `strict_utf8` (prompts: a model would be asked about U+FFFD), else read as
    U+FFFD with one warning per file (corpora)."""
    warned = False
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            line, whole = _utf8(raw)
            if not whole and strict_utf8:
                raise ValueError(f"{path}:{number}: not UTF-8 text")
            if not whole and not warned:
                _warn_not_utf8(f"{path}:{number}")
                warned = True
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error})") from None


def _jsonl_documents(path: str, field: str, setting: str) -> Iterator[tuple[str, str]]:
    for number, row in jsonl_rows(path):
        if not isinstance(row, dict) or field not in row:
            fields = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{path}:{number}: no field {field!r} (fields: {fields}; "
                             f"set {setting})")
        yield f"{path}:{number - 1}", str(row[field])


def _parquet_documents(path: str, field: str, setting: str) -> Iterator[tuple[str, str]]:
    import pyarrow.parquet as pq  # a dependency of `datasets`

    try:
        table = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises ArrowInvalid and others
        raise ValueError(f"{path} is not a readable Parquet file ({error})") from None
    if field not in table.schema_arrow.names:
        raise ValueError(f"{path}: no column {field!r} (columns: {table.schema_arrow.names}; "
                         f"set {setting})")
    row = 0
    for batch in table.iter_batches(columns=[field], batch_size=1024):
        for text in batch.column(0).to_pylist():
            yield f"{path}:{row}", str(text)
            row += 1


def _hub_documents(cfg: DataConfig) -> Iterator[tuple[str, str]]:
    import datasets  # imported here: it costs 2 s of every command's start-up (it loads pandas)

    rows = datasets.load_dataset(cfg.hub_name, cfg.hub_config or None, split=cfg.hub_split,
                                 streaming=True)
    for index, row in enumerate(rows):
        if cfg.text_field not in row:
            raise ValueError(f"dataset {cfg.hub_name!r}: no field {cfg.text_field!r} (fields: "
                             f"{sorted(row)}; set data.text_field)")
        yield f"{cfg.hub_name}:{index}", str(row[cfg.text_field])


def iter_documents(cfg: DataConfig, setting: str = "data.text_field"
                   ) -> Iterator[tuple[str, str]]:
    """(key, text) of every document of the configured source in its fixed order (the first
    `max_documents`, if set), read lazily. `setting`: how errors name the text field's setting
    (a command's own flag, where it has one instead of a config)."""
    if cfg.source == "stdlib":
        documents = ((key, _read_text(path)) for key, path in _stdlib_paths())
    elif cfg.source == "files":
        documents = _file_documents(cfg, setting)
    else:
        documents = _hub_documents(cfg)
    count = 0
    for key, text in documents:
        yield key, text
        count += 1
        if count == cfg.max_documents:
            break
    if count == 0:
        raise ValueError(f"data source {cfg.source!r} produced no documents")


def run_data(meta: Mapping[str, Any]) -> DataConfig | None:
    """The data a checkpoint's run trained on (`meta["config"]["data"]`); None where it names
    none (an imported model)."""
    data = (meta.get("config") or {}).get("data")
    return DataConfig.from_dict(data) if data else None


def heldout_data(meta: Mapping[str, Any]) -> DataConfig:
    """The data a checkpoint's held-out text is read from: its run's (`run_data`), else the
    embedded default corpus (an imported model's). Its tokenizer field is not used (the
    model's own tokenizer is)."""
    return run_data(meta) or DataConfig()


def file_texts(path: str, field: str) -> list[str]:
    """The documents of one data file given on a command line (.jsonl/.json rows with `field`,
    .parquet, or plain text), with the readers' one-line errors naming --text_field."""
    data = DataConfig(source="files", files=(path,), text_field=field)
    return [text for _, text in iter_documents(data, "--text_field")]


def source_identity(cfg: DataConfig) -> dict[str, Any]:
    """What names the documents `iter_documents` yields, for the token cache's key: every
    local file's path, size and modification time; a hub dataset's name, config and split."""
    if cfg.source == "hub":
        return {"hub": [cfg.hub_name, cfg.hub_config, cfg.hub_split, cfg.text_field]}
    paths = ([path for _, path in _stdlib_paths()] if cfg.source == "stdlib"
             else data_files(cfg))
    stats = [(os.path.abspath(p), info.st_size, info.st_mtime_ns)
             for p, info in ((p, os.stat(p)) for p in paths)]
    return {"files": stats, "text_field": cfg.text_field}


def is_validation_key(key: str, val_fraction: float) -> bool:
    """A stable per-document coin: crc32 of the key against the validation fraction."""
    return zlib.crc32(key.encode("utf-8")) % 10_000 < round(val_fraction * 10_000)


def validation_texts(cfg: DataConfig) -> Iterator[str]:
    """The validation documents' texts in order, read lazily: held-out text for prompts and
    reports, which need only their first few (the corpus is never loaded whole)."""
    return (text for key, text in iter_documents(cfg) if is_validation_key(key, cfg.val_fraction))


def windows(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Cuts a token stream ([BOS] doc [EOS] ...) into non-overlapping windows of seq_len + 1
    tokens (inputs are window[:-1], targets window[1:]); a view of `stream`, no copy."""
    count = len(stream) // (seq_len + 1)
    if count == 0:
        raise ValueError(f"{len(stream)} tokens are too few for one sequence of {seq_len + 1}")
    return stream[:count * (seq_len + 1)].reshape(count, seq_len + 1)


class BatchSampler:
    """Shuffled batches of packed sequences. The stream of sequences is a pure function of the
    seed; a batch is addressed by its offset in that stream (the data position), so a resumed
    run continues exactly where the interrupted one stopped, whatever its batch size. Only the
    rows asked for are read (from a memory-mapped cache: each process reads its own rows)."""

    def __init__(self, sequences: np.ndarray, batch_size: int, seed: int):
        self.sequences, self.batch_size, self.seed = sequences, batch_size, seed
        self._epoch, self._order = -1, None

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._epoch, self._order = epoch, rng.permutation(len(self.sequences))
        return self._order

    def indices(self, position: int, rows: slice = slice(None)) -> np.ndarray:
        """The numbers (rows of `sequences`) of the batch at stream offset `position`, or of
        its `rows`: what `batch` reads, and what keys a window's cached features."""
        total = len(self.sequences)
        chosen = []
        for flat in range(position, position + self.batch_size)[rows]:
            epoch, offset = divmod(flat, total)
            chosen.append(self._permutation(epoch)[offset])
        return np.asarray(chosen, np.int64)

    def batch(self, position: int, rows: slice = slice(None)) -> np.ndarray:
        """The `batch_size` sequences starting at stream offset `position`, [B, seq_len + 1]
        int32, or only their `rows` (a process reads the rows its devices hold)."""
        return self.read(self.indices(position, rows))

    def read(self, numbers: np.ndarray) -> np.ndarray:
        """The sequences numbered `numbers` (`indices`), [len(numbers), seq_len + 1] int32."""
        return np.asarray(self.sequences[numbers], np.int32)


@dataclasses.dataclass
class Corpus:
    """Packed train and validation sequences of one data config (views of the token cache;
    `key`: its token-cache key, which names the documents, their split and the tokenizer)."""

    train: np.ndarray
    validation: np.ndarray
    key: str = ""

    @classmethod
    def build(cls, cfg: DataConfig, tokenizer: Tokenizer | None = None) -> Corpus:
        """Tokenized with `tokenizer` (default: the config's) through the token cache."""
        identity = {**source_identity(cfg), "max_documents": cfg.max_documents,
                    "val_fraction": cfg.val_fraction}
        tokenizer = tokenizer or cfg.make_tokenizer()
        streams = token_streams(lambda: iter_documents(cfg), identity,
                                lambda key: is_validation_key(key, cfg.val_fraction),
                                tokenizer, cfg.cache_dir)
        for name, stream in zip(("train", "validation"), streams, strict=True):
            if len(stream) == 0:
                raise ValueError(f"data.val_fraction={cfg.val_fraction} leaves no {name} "
                                 "documents")
        return cls(*(windows(stream, cfg.seq_len) for stream in streams),
                   cache_key(identity, tokenizer))

    def validation_batches(self, batch_size: int, num_batches: int) -> list[np.ndarray]:
        """The first `num_batches` validation batches in file order (fewer if data runs out)."""
        usable = min(num_batches, len(self.validation) // batch_size)
        rows = [self.validation[:batch_size]] if usable == 0 else [
            self.validation[i * batch_size:(i + 1) * batch_size] for i in range(usable)]
        return [np.asarray(batch, np.int32) for batch in rows]


def completion_prompts(data: DataConfig, tokenizer: Tokenizer, count: int, length: int, *,
                       answer: int = 256, gram: int = 4) -> list[list[int]]:
    """Code completion whose prompt shares text with its answer: from each held-out validation
    document (one prompt each), the `length` tokens before the line start whose next `answer`
    tokens repeat the most of them (the share of its `gram`-grams that occur in the prompt):
    the function bodies that reuse the names, calls and lines above them, where drafters that
    copy from the context should shine."""
    newline = tokenizer.encode("\n")[-1]
    prompts = []
    for text in validation_texts(data):
        ids = tokenizer.encode(text).tolist()
        cuts = [i + 1 for i in range(length - 1, len(ids) - answer - 1) if ids[i] == newline]
        if not cuts:
            continue

        best = max(cuts, key=lambda cut, ids=ids: _shared(ids, cut, length, answer, gram))
        prompts.append(ids[best - length:best])
        if len(prompts) == count:
            return prompts
    raise ValueError(f"the validation documents hold only {len(prompts)} completions of "
                     f"{length} + {answer} tokens, not {count}")


def _shared(ids: list[int], cut: int, length: int, answer: int, gram: int) -> float:
    """The share of the `answer` tokens after `cut` whose `gram`-gram occurs in the `length`
    tokens before it."""
    seen = {tuple(ids[i:i + gram]) for i in range(cut - length, cut - gram + 1)}
    return sum(tuple(ids[i:i + gram]) in seen
               for i in range(cut, cut + answer - gram + 1)) / (answer - gram + 1)


def heldout_prompts(data: DataConfig, tokenizer: Tokenizer, count: int, length: int, *,
                    skip_documents: int = 0, per_document: int = 1) -> list[list[int]]:
    """`length`-token windows from the middle of held-out validation documents, starting at the
    first line break after the middle (or the middle itself if the tokenizer merges newlines
    into other tokens): unseen text in the middle of real files. Up to `per_document`
    consecutive windows per document, after the first `skip_documents` documents (which a
    benchmark keeps for itself when a calibration runs on the rest)."""
    newline = tokenizer.encode("\n")[-1]
    prompts = []
    for text in itertools.islice(validation_texts(data), skip_documents, None):
        ids = tokenizer.encode(text)
        breaks = np.flatnonzero(ids[len(ids) // 2:] == newline)
        start = len(ids) // 2 + (int(breaks[0]) + 1 if len(breaks) else 0)
        for begin in range(start, start + per_document * length, length):
            if begin + length > len(ids):
                break
            prompts.append(ids[begin:begin + length].tolist())
            if len(prompts) == count:
                return prompts
    raise ValueError(f"the validation documents after the first {skip_documents} hold only "
                     f"{len(prompts)} windows of {length} tokens ({per_document} per document), "
                     f"not {count}")
