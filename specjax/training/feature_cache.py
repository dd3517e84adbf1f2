"""The frozen model's hidden states per training window, kept on disk (`train.feature_cache`).

A head on a frozen base and a draft model distilled from one read the frozen model's hidden
states at a few layers (`base_features`; its logits are recomputed from the last one by its
frozen head, so the objective stays exact and a token costs D numbers, not V). With a cache,
they are computed the first time a training window is trained on and read every later time:
later epochs, a resumed run, and every other drafter trained on the same base and data (the
point: the frozen model runs once per window). A window's states are a pure function of the
window, so the data order, the batch size and a resume do not matter.

Layout, like the token cache's (`token_cache`): `<dir>/features/<key>/`, the key a hash of what
makes the states valid (the base's weights' checksum, the corpus' token-cache key, seq_len, the
states' dtype, the window count); in it `meta.json` (the same, read back and compared) and per
layer L `layer<L>.bin` (windows x seq_len x D, memory-mapped, window i at row i; a sparse file
that grows as windows are written) and `layer<L>.filled` (one byte per window). A window's
rows are written and synced before its byte is set, so an interrupted fill, or two runs filling
at once, never leave a window marked filled with rows it lacks: an unmarked window is computed
again. Drafters that read different layers share the layers they have in common.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence

import jax
import numpy as np

from specjax.errors import SpecjaxError
from specjax.outputs import read_json_object, staged
from specjax.training.frozen_base import FrozenBase, base_hidden

FORMAT = 1  # bump when the layout changes


class FeatureCacheError(SpecjaxError):
    """A feature cache on disk that is not the one its key names (edited, truncated)."""


@dataclasses.dataclass(frozen=True)
class LayerFiles:
    """One layer's rows and marks: open for writing, and memory-mapped for reading."""

    rows_fd: int
    marks_fd: int
    rows: np.memmap  # [windows, seq_len, D]
    marks: np.memmap  # [windows] uint8, 1 once the window's rows are on disk


class FeatureCache:
    """The hidden states at `layers` of `base` on the training windows `sequences`
    ([N, seq_len + 1], the corpus whose token-cache key is `corpus_key`), under `root`."""

    def __init__(self, root: str, base: FrozenBase, layers: Sequence[int], corpus_key: str,
                 sequences: np.ndarray):
        cfg, self.base, self.layers = base.cfg, base, tuple(sorted(set(layers)))
        count, seq_len = sequences.shape[0], sequences.shape[1] - 1
        self._compute = jax.jit(lambda params, inputs: base_hidden(params, cfg, self.layers,
                                                                   inputs))
        shape = jax.eval_shape(self._compute, base.params,
                               jax.ShapeDtypeStruct((1, seq_len), np.int32))[self.layers[0]]
        self.dtype = np.dtype(shape.dtype)
        self.row_shape = (seq_len, shape.shape[-1])
        self.meta = {"format": FORMAT, "base": base.checksum, "corpus": corpus_key,
                     "seq_len": seq_len, "dtype": self.dtype.name, "windows": count,
                     "d_model": shape.shape[-1]}
        key = hashlib.sha256(json.dumps(self.meta, sort_keys=True).encode()).hexdigest()[:24]
        self.folder = os.path.join(root, "features", key)
        self.computed = self.read = 0  # windows computed / read from disk, for reports and tests
        self._check_meta()
        self._files = {layer: self._open(layer) for layer in self.layers}

    def filled(self) -> int:
        """How many windows have every layer on disk."""
        return int(np.stack([files.marks for files in self._files.values()]).all(axis=0).sum())

    def states(self, windows: np.ndarray, batch: np.ndarray) -> dict[int, np.ndarray]:
        """{layer: [b, seq_len, D]} for the windows numbered `windows` [b] whose tokens are
        `batch` [b, seq_len + 1]: read where every layer has them, else computed for the
        batch and the missing windows written."""
        marks = np.stack([np.asarray(self._files[layer].marks[windows]) for layer in self.layers])
        if marks.all():
            self.read += len(windows)
            return {layer: np.asarray(self._files[layer].rows[windows]) for layer in self.layers}
        states = jax.device_get(self._compute(self.base.params, batch[:, :-1]))
        for layer, layer_marks in zip(self.layers, marks, strict=True):
            self._write(layer, windows, states[layer], layer_marks)
        self.computed += len(np.unique(windows[~marks.all(axis=0)]))
        return states

    def _write(self, layer: int, windows: np.ndarray, rows: np.ndarray,
               marks: np.ndarray) -> None:
        """The unmarked windows' rows, synced, then their marks: never a mark without its
        rows."""
        files = self._files[layer]
        missing = [(int(w), row) for w, row, m in zip(windows, rows, marks, strict=True) if not m]
        for window, row in missing:
            data = np.ascontiguousarray(row, self.dtype).tobytes()
            os.pwrite(files.rows_fd, data, window * len(data))
        os.fdatasync(files.rows_fd)
        for window, _ in missing:
            os.pwrite(files.marks_fd, b"\x01", window)

    def _check_meta(self) -> None:
        """Writes meta.json for a new cache; refuses one whose meta.json says otherwise."""
        path = os.path.join(self.folder, "meta.json")
        if not os.path.isfile(path):
            os.makedirs(self.folder, exist_ok=True)
            with staged(path) as partial, open(partial, "w", encoding="utf-8") as f:
                json.dump(self.meta, f, sort_keys=True)
        elif read_json_object(path) != self.meta:
            raise FeatureCacheError(f"feature cache {self.folder} holds another model's or "
                                    "corpus' states than its name says (meta.json differs); "
                                    "delete that folder to rebuild it")

    def _open(self, layer: int) -> LayerFiles:
        """`layer`'s files, created empty (sparse) for a new cache."""
        count = self.meta["windows"]
        shape = (count, *self.row_shape)
        fds, maps = [], []
        for suffix, dtype, size in (("bin", self.dtype, int(np.prod(shape)) * self.dtype.itemsize),
                                    ("filled", np.dtype(np.uint8), count)):
            path = os.path.join(self.folder, f"layer{layer}.{suffix}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size == 0:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size != size:
                os.close(fd)
                raise FeatureCacheError(f"{path} holds {os.path.getsize(path)} bytes, not the "
                                        f"{size} its meta.json gives; delete {self.folder} to "
                                        "rebuild it")
            fds.append(fd)
            maps.append(np.memmap(path, dtype, "r", shape=shape if suffix == "bin" else (count,)))
        return LayerFiles(*fds, *maps)
