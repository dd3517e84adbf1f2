"""Device meshes and the one table that says how every array is laid out on them.

A mesh has three axes: `data` (rows of the batch), `fsdp` (rows of the batch, and parameters and
optimizer state split along their model width, gathered per layer as they are used) and `tensor`
(heads, MLP and vocabulary columns split, activations reduced across it). An array's layout is
named logically, per dimension (`PARAM_AXES`: "embed", "mlp", "heads", ...), and `RULES` maps
each logical name to mesh axes. Optimizer states mirror the parameters (optax keeps them under
the same keys), so they are laid out by the same lookup. A dimension the mesh axes do not divide
is replicated instead.

The mesh's axes are `Auto`: jit's sharding propagation places the intermediate values, so the
model code stays free of sharding annotations, on jax 0.10 and 0.11 alike (tested with simulated
CPU devices; the one-GPU runs of docs/results/2026-11-27-gpu-1b.md used a mesh of one device).
Decoding restores a workdir straight into this layout (`io.checkpoint.load_params(mesh=)`),
never whole on one device; a frozen base for training is read whole by each process (its
checksum reads every weight) and then placed. The train step and the generate loop lower for
TPU and GPU (`jax.export` for both platforms is tested on CPU).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from specjax.nn.layer_kinds import LAYER_KINDS

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axes (in order); a name not listed is replicated.
RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "embed": ("fsdp",),
    "vocab": ("tensor",),
    "mlp": ("tensor",),
    "heads": ("tensor",),
    "ssm_heads": ("tensor",),
}

# A parameter's logical axes by its innermost keys, for the leaves every layer kind shares
# (embeddings, norms, MLPs); each kind adds its own (`LayerKind.param_axes`), and a stack of a
# kind's layers (`LayerKind.params_key`) adds a leading "layers" axis.
PARAM_AXES: dict[tuple[str, ...], tuple[str | None, ...]] = {
    ("embed",): ("vocab", "embed"),
    ("unembed",): ("embed", "vocab"),
    ("scale",): ("embed",),                               # RMSNorm scales
    ("attn", "qkv"): ("embed", "heads", None, None),      # [D, K, G+2, Dh]
    ("attn", "qkv_bias"): ("heads", None, None),
    ("attn", "out"): ("heads", None, None, "embed"),      # [K, G, Dh, D]
    ("mlp", "gate_up"): ("embed", None, "mlp"),           # [D, 2, F]
    ("mlp", "down"): ("mlp", "embed"),
}

# A decode cache leaf's logical axes by its field name: the per-row lengths (`cache.Cache`), and
# each kind's own leaves (`LayerKind.cache_axes`).
CACHE_AXES: dict[str, tuple[str | None, ...]] = {"lengths": ("batch",)}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axis sizes; one of them may be -1: all the devices the others leave."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self) -> None:
        sizes = [getattr(self, name) for name in MESH_AXES]
        if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
            raise ValueError(f"mesh={dataclasses.asdict(self)}: sizes must be positive, with at "
                             "most one -1 (the devices the others leave)")

    @classmethod
    def parse(cls, sizes: Sequence[str]) -> MeshConfig:
        """From three sizes as a flag gives them ("1", "1", "-1")."""
        try:
            values = [int(size) for size in sizes]
        except ValueError:
            values = []
        if len(values) != len(MESH_AXES):
            raise ValueError(f"mesh {','.join(sizes)!r}: give three sizes data,fsdp,tensor "
                             "(e.g. 1,1,-1: weights split over every device)")
        return cls(*values)

    def shape(self, devices: int) -> tuple[int, ...]:
        sizes = [getattr(self, name) for name in MESH_AXES]
        known = math.prod(s for s in sizes if s != -1)
        if devices % known or (-1 not in sizes and known != devices):
            raise ValueError(f"mesh={dataclasses.asdict(self)} does not fit {devices} devices: "
                             "the sizes must multiply to the device count (or use -1 once)")
        return tuple(devices // known if s == -1 else s for s in sizes)


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The (data, fsdp, tensor) mesh over `devices` (default: every device of every process)."""
    devices = list(devices if devices is not None else jax.devices())
    return jax.make_mesh(config.shape(len(devices)), MESH_AXES,
                         axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def logical_to_spec(mesh: Mesh, axes: Sequence[str | None], shape: Sequence[int]
                    ) -> PartitionSpec:
    """The PartitionSpec of an array with these logical axes under RULES; a dimension the mesh
    axes do not divide, or whose mesh axes an earlier dimension took, is replicated."""
    used: set[str] = set()
    spec = []
    for name, size in zip(axes, shape, strict=True):
        mesh_axes = tuple(a for a in RULES.get(name, ()) if a not in used and mesh.shape[a] > 1)
        if mesh_axes and size % math.prod(mesh.shape[a] for a in mesh_axes) == 0:
            used.update(mesh_axes)
            spec.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
        else:
            spec.append(None)
    return PartitionSpec(*spec)


def param_axes(keys: Sequence[str], ndim: int) -> tuple[str | None, ...]:
    """A parameter's (or its optimizer state's) logical axes from its dict keys; unknown leaves
    and scalars are replicated."""
    table = {**PARAM_AXES, **_declared("param_axes")}
    stacks = {kind.params_key for kind in LAYER_KINDS.values()}
    for length in (2, 1):
        axes = table.get(tuple(keys[-length:]))
        if axes is None:
            continue
        if len(axes) == ndim:  # one layer's (decoding keeps a tuple of them) or a global leaf
            return axes
        if len(axes) + 1 == ndim and keys[0] in stacks:
            return ("layers", *axes)
    return (None,) * ndim


def _declared(field: str) -> dict:
    """The axes every registered layer kind declares in `field` (read at each call, so a kind
    registered later, e.g. by a test, is laid out too); two kinds may not disagree on a key."""
    table: dict = {}
    for name, kind in LAYER_KINDS.items():
        for key, axes in getattr(kind, field).items():
            if table.setdefault(key, axes) != axes:
                raise ValueError(f"layer kind {name!r} declares {field} {key} as {axes}, "
                                 f"another kind as {table[key]}")
    return table


def tree_shardings(mesh: Mesh, tree: Any) -> Any:
    """NamedShardings for a tree of arrays or shape structs: parameters, optimizer states or a
    whole train state (each leaf looked up by the dict keys on its path)."""
    def sharding(path, leaf):
        keys = [str(entry.key) for entry in path if isinstance(entry, jax.tree_util.DictKey)]
        shape = np.shape(leaf)
        return NamedSharding(mesh, logical_to_spec(mesh, param_axes(keys, len(shape)), shape))
    return jax.tree_util.tree_map_with_path(sharding, tree)


def cache_specs(mesh: Mesh | AbstractMesh, cache: Any, rows: int) -> Any:
    """PartitionSpecs for a decode cache of `rows` rows (or any tree of layer caches) by
    CACHE_AXES. The merged rows-and-K/V-heads axis splits like the rows and, when each shard
    then holds one row, along its heads like the attention weights: the only splits of a
    row-major merge that keep a head's K/V on the devices that project them."""
    table = {**CACHE_AXES, **_declared("cache_axes")}

    def spec(path, leaf):
        axes = table[path[-1].name]
        if axes[0] != "rows*kv_heads":
            return logical_to_spec(mesh, axes, leaf.shape)
        by_rows = _mesh_axes(logical_to_spec(mesh, ("batch",), (rows,))[0])
        heads = leaf.shape[0] // rows
        by_heads = (_mesh_axes(logical_to_spec(mesh, ("heads",), (heads,))[0])
                    if rows == math.prod(mesh.shape[a] for a in by_rows) else ())
        merged = by_rows + by_heads
        return PartitionSpec(merged[0] if len(merged) == 1 else (merged or None),
                             *axes[1:])
    return jax.tree_util.tree_map_with_path(spec, cache)


def constrain_cache(cache: Any, rows: int) -> Any:
    """`cache` laid out by `cache_specs` on the mesh the caller set (`jax.set_mesh`: decoding
    on a mesh, `Generator(mesh=)`); unchanged without one. Freshly allocated zeros have no
    layout of their own for jit to propagate: unconstrained, a tensor-parallel mesh kept every
    K/V head's cache on every device."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return cache
    return jax.lax.with_sharding_constraint(cache, cache_specs(mesh, cache, rows))


def _mesh_axes(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """A PartitionSpec entry as a tuple of mesh axes."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def with_shardings(abstract: Any, shardings: Any | None) -> Any:
    """Shape structs carrying `shardings` (restore targets land on the mesh); unchanged if
    None. `jax.eval_shape` drops the shardings a jitted init lays its outputs out with."""
    if shardings is None:
        return abstract
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        abstract, shardings)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Rows over `data` and `fsdp`, the rest of each row on one device."""
    rows = tuple(a for a in RULES["batch"] if mesh.shape[a] > 1)
    return NamedSharding(mesh, PartitionSpec(rows or None, *([None] * (ndim - 1))))


def batch_devices(mesh: Mesh) -> int:
    """How many ways the rows of a batch split: the mesh's data x fsdp devices."""
    return math.prod(mesh.shape[a] for a in RULES["batch"])


def place_batch(batch: np.ndarray, mesh: Mesh) -> jax.Array:
    """The global batch as one array on the mesh, rows split as `batch_sharding` says (whole on
    every device if they do not divide evenly: a short last validation batch); each process
    fills only its own devices' rows (every process derives the same batch from the data
    position)."""
    sharding = batch_sharding(mesh, batch.ndim)
    if batch.shape[0] % batch_devices(mesh):
        sharding = NamedSharding(mesh, PartitionSpec())
    return jax.make_array_from_callback(batch.shape, sharding, lambda index: batch[index])


def process_rows(mesh: Mesh, batch_size: int) -> slice:
    """The rows of a global batch of `batch_size` that this process's devices hold: the only
    rows it needs to read (`make_mesh` orders devices process by process, so they are one run)."""
    index_map = batch_sharding(mesh, 1).addressable_devices_indices_map((batch_size,))
    runs = {index[0].indices(batch_size)[:2] for index in index_map.values()}
    start, stop = min(r[0] for r in runs), max(r[1] for r in runs)
    if sum(b - a for a, b in runs) != stop - start:
        raise ValueError(f"this process's devices hold rows {sorted(runs)} of the batch, not one "
                         "run: build the mesh with make_mesh")
    return slice(start, stop)


def place_process_rows(rows: np.ndarray, mesh: Mesh, batch_size: int) -> jax.Array:
    """The global batch of `batch_size` rows as one array on the mesh, from this process's
    `rows` (`process_rows`); every process passes its own."""
    return jax.make_array_from_process_local_data(batch_sharding(mesh, rows.ndim), rows,
                                                  (batch_size, *rows.shape[1:]))


def check_batch(mesh: Mesh, batch_size: int) -> None:
    """A clear error when the batch's rows cannot be split evenly over the mesh."""
    rows = batch_devices(mesh)
    if batch_size % rows:
        raise ValueError(f"train.batch_size={batch_size} must be a multiple of the mesh's "
                         f"data x fsdp = {rows} devices that split the rows")
