"""What the program being traced runs on, for the layers' choice of CPU kernel (below the
layout rules of `specjax.sharding`, which import the layers)."""

import jax


def traced_for_one_device() -> bool:
    """Whether the program being traced runs on one device: no mesh set (`jax.set_mesh`), or a
    mesh of one device. The CPU kernels (`specjax.kernels`) have no partitioning rule: on a
    larger mesh XLA would gather their operands onto every device, so its own ops run there."""
    mesh = jax.sharding.get_abstract_mesh()
    return mesh.empty or mesh.size == 1
