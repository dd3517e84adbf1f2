"""The mesh a training run works on (`config.mesh`) and how every objective puts things there:
its train state and frozen weights laid out by `sharding.RULES`, each process's rows of a
training batch, whole validation batches, the step jitted to keep the state's layout."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from specjax.sharding import (
    check_batch,
    make_mesh,
    place_batch,
    place_process_rows,
    process_rows,
    tree_shardings,
)
from specjax.training.config import RunConfig


class RunMesh:
    """`mesh`, and `batch_rows`: the rows of each global batch this process reads."""

    def __init__(self, run: RunConfig):
        self.mesh = make_mesh(run.mesh)
        self.batch_size = run.train.batch_size
        check_batch(self.mesh, self.batch_size)
        self.batch_rows = process_rows(self.mesh, self.batch_size)

    def shardings(self, tree: Any) -> Any:
        """The rules' layout of a tree of arrays or shape structs (a state, weights)."""
        return tree_shardings(self.mesh, tree)

    def place(self, tree: Any) -> Any:
        """`tree` laid out on the mesh (small or already materialised trees: heads, bases)."""
        return jax.device_put(tree, self.shardings(tree))

    def jit_step(self, step: Callable, state_shardings: Any) -> Callable:
        """`step(state, ...) -> (state, metrics)` jitted to return the state in its layout and
        to reuse its buffers; the other arguments arrive placed."""
        return jax.jit(step, out_shardings=(state_shardings, None), donate_argnums=0)

    def train_batch(self, rows: np.ndarray) -> jax.Array:
        """The global training batch from this process's `batch_rows`."""
        return place_process_rows(rows, self.mesh, self.batch_size)

    def train_features(self, features: Mapping[int, np.ndarray] | None) -> Any:
        """This process's rows of a frozen model's hidden states (`feature_cache`) laid out as
        the training batch's; None stays None (the step runs the model)."""
        if features is None:
            return None
        return {layer: self.train_batch(rows) for layer, rows in features.items()}

    def eval_batch(self, batch: np.ndarray) -> jax.Array:
        """A whole validation batch (every process passes all of it)."""
        return place_batch(batch, self.mesh)
