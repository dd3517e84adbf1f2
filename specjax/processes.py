"""Multi-process runs through JAX's own multi-controller runtime (`jax.distributed`): every
process runs the same program on its own devices, one mesh spans them all, and the first process
alone writes what is written once (metrics, the workdir's lock). Each process reads only the
training rows its devices hold (`sharding.process_rows`; every process still loads the
corpus, since the embedded and local-file corpora are in memory), the step's batch is
assembled from every process's rows (`jax.make_array_from_process_local_data`), so a resumed
run continues at the same data position, and a signal on any process stops all of them at the
same step."""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
    """Joins the run's processes. Arguments left None are read from the environment a TPU pod
    slice, SLURM or Open MPI provides; on CPU the processes' collectives go through gloo."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id)


def is_leader() -> bool:
    """The process that writes what is written once."""
    return jax.process_index() == 0


def any_process(flag: bool) -> bool:
    """True on every process if it is True on any (one process's SIGTERM stops them all at the
    same step, instead of leaving the others waiting in the next collective)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))
