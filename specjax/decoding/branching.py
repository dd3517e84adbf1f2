"""Branches that keep updating their operands in place on XLA:CPU.

A `lax.cond` or `lax.switch` branch copies every buffer it updates (measured in the compiled
HLO: the layers' caches, 16 copies and 0.5 MB a token at the default size), while a while loop
updates its carry in place. So a branch here is a while loop of zero or one trip; only the
chosen one runs. Every branch takes and returns a state of the same structure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import jax
import jax.numpy as jnp

T = TypeVar("T")


def switch(index: jax.Array, branches: Sequence[Callable[[T], T]], state: T) -> T:
    """`lax.switch(index, branches, state)` as one while loop of zero or one trip per branch
    (an index out of range runs none)."""
    for i, branch in enumerate(branches):
        state = jax.lax.while_loop(
            lambda c: c[0], lambda c, branch=branch: (jnp.zeros((), bool), branch(c[1])),
            (index == i, state))[1]
    return state


def either(pred: jax.Array, if_true: Callable[[T], T], if_false: Callable[[T], T],
           state: T) -> T:
    """`lax.cond(pred, if_true, if_false, state)`, in place (`switch`)."""
    return switch(pred.astype(jnp.int32), (if_false, if_true), state)
