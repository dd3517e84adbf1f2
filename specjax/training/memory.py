"""What a train step holds in device memory, estimated before the first step runs.

The train state (weights, optimizer moments) is counted exactly from its shapes; the step's
temporaries (activations kept for the backward pass, gradients, logits) come from XLA's buffer
assignment of the compiled program (`Compiled.memory_analysis`), which is what the device will
allocate: that is why the estimate is taken after compiling, not from a formula. Per device, for
a sharded program.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """Bytes per device: the params, the optimizer state, and XLA's figures for the compiled
    step (its arguments, outputs not aliased onto donated arguments, temporaries)."""

    params: int
    optimizer: int
    arguments: int
    outputs: int
    temporaries: int

    @property
    def peak(self) -> int:
        """Arguments + new outputs + temporaries: the most the step holds at once."""
        return self.arguments + self.outputs + self.temporaries

    def line(self) -> str:
        return (f"memory per device (estimate): params {_size(self.params)}, optimizer state "
                f"{_size(self.optimizer)}, step temporaries (activations, gradients) "
                f"{_size(self.temporaries)}; peak about {_size(self.peak)}")

    def to_dict(self) -> dict[str, int]:
        return {**dataclasses.asdict(self), "peak": self.peak}


def _size(count: int) -> str:
    return f"{count / GIB:.2f} GiB" if count >= GIB else f"{count / 2**20:.1f} MiB"


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of arrays or shape structs (its shard of each)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.shape
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            shape = sharding.shard_shape(shape)
        total += int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
    return total


def step_memory(compiled: jax.stages.Compiled, state: Any) -> StepMemory | None:
    """The estimate for a compiled step whose first argument is the train `state` (with
    `params` and `opt_state`); None where the backend reports no analysis."""
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    return StepMemory(params=per_device_bytes(state.params),
                      optimizer=per_device_bytes(state.opt_state),
                      arguments=stats.argument_size_in_bytes,
                      outputs=max(0, stats.output_size_in_bytes - stats.alias_size_in_bytes),
                      temporaries=stats.temp_size_in_bytes)
