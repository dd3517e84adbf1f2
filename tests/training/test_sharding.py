"""Sharded training: the same losses on one device and on (data, fsdp, tensor) meshes of 8
simulated CPU devices, parameters and optimizer state laid out as the rules say, checkpoints
that move between meshes and onto one device, the sharded step exported for TPU and GPU, and
clear errors for meshes and batches that do not fit."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from specjax.config import ModelConfig, SsmConfig
from specjax.data import BatchSampler
from specjax.io.checkpoint import load_params
from specjax.model import allocate_cache
from specjax.sharding import (
    MeshConfig,
    cache_specs,
    check_batch,
    logical_to_spec,
    make_mesh,
    process_rows,
)
from specjax.training.metrics_log import MetricsLog
from specjax.training.trainer import Trainer
from tests.support import ROOT
from tests.support import mesh_training as M
from tests.support.models import tiny_run

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out


@pytest.fixture(scope="module")
def on_eight_devices(tmp_path_factory):
    """The worker's results from a subprocess with 8 CPU devices (XLA reads the device count
    once, at start-up), and the directory of the checkpoint it saved on the (2, 2, 2) mesh."""
    directory = tmp_path_factory.mktemp("mesh")
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")
           + " --xla_force_host_platform_device_count=8"}
    out = directory / "results.json"
    result = subprocess.run([sys.executable, "-m", "tests.support.mesh_training", str(out),
                             str(directory / "checkpoint")], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text()), str(directory / "checkpoint")


@pytest.fixture(scope="module")
def one_device():
    """Losses of every step on one device, the reference the meshes must reproduce."""
    obj = M.objective((1, 1, 1))
    return M.train(obj, obj.init_state(), 0, M.STEPS + M.MORE)[1]


def test_every_mesh_trains_with_the_losses_of_one_device(on_eight_devices, one_device):
    """Catches a layout that changes the math: a reduction over a sharded axis done per shard
    (a gradient summed over half the batch rows, a norm over a quarter of the width), an
    optimizer state laid out unlike its parameter, rows fed to the wrong devices."""
    results, _ = on_eight_devices
    assert results["devices"] == 8
    for mesh, losses in results["losses"].items():
        np.testing.assert_allclose(losses, one_device[:M.STEPS], rtol=2e-6, err_msg=mesh)


def test_parameters_and_optimizer_state_are_laid_out_as_the_rules_say(on_eight_devices):
    """On (data 2, fsdp 2, tensor 2): matrices split along the model width over fsdp and along
    heads / MLP / vocabulary over tensor, the layer axis whole, Adam's moments like their
    parameter. Catches a rule table that is not applied (everything replicated) or a state
    whose moments are replicated while the parameters are not."""
    specs = on_eight_devices[0]["specs"]
    assert specs == {"mlp.down": "P(None, 'tensor', 'fsdp')",
                     "attn.qkv": "P(None, 'fsdp', 'tensor', None, None)",
                     "embed": "P('tensor', 'fsdp')",
                     "mu mlp.down": "P(None, 'tensor', 'fsdp')"}


def test_a_checkpoint_moves_to_another_mesh_and_to_one_device(on_eight_devices, one_device):
    """Saved on (2, 2, 2), restored onto (1, 8, 1) with that mesh's layout and onto this
    process's one device: both continue with the uninterrupted run's losses. Catches a restore
    that keeps the saved layout (the jitted step refuses it), or reads shards into the wrong
    places."""
    results, directory = on_eight_devices
    assert results["restored spec"] == "P(None, None, 'fsdp')"
    np.testing.assert_allclose(results["continued"], one_device[M.STEPS:], rtol=2e-6)
    obj = M.objective((1, 1, 1))
    _, continued = M.train(obj, M.restore(obj, directory), M.STEPS, M.MORE)
    np.testing.assert_allclose(continued, one_device[M.STEPS:], rtol=2e-6)


def test_two_processes_of_train_py_match_one_process(tmp_path):
    """`train/train.py --distributed` in two processes of 4 CPU devices each (jax.distributed,
    gloo collectives), one mesh over all 8 from the command line (`--config.mesh.fsdp=4
    --config.mesh.tensor=2`): the logged train and eval losses and the saved weights equal a
    one-device run of the same config. Catches a process that reads rows
    other than its devices' (each reads only those), metrics written twice, a workdir lock that
    refuses the second process, a checkpoint that cannot be read on one device."""
    run = tiny_run(model=M.MODEL, train=dict(batch_size=8, total_steps=4, eval_every=2,
                                             save_every=2, log_every=1),
                   mesh=dict(data=-1, fsdp=1, tensor=1))  # one device unless overridden
    config = tmp_path / "config.py"
    config.write_text("import ml_collections\n\n\ndef get_config():\n    return "
                      f"ml_collections.ConfigDict({run!r})\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")
           + " --xla_force_host_platform_device_count=4"}
    workdir = str(tmp_path / "sharded")
    workers = [subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "train", "train.py"), f"--config={config}",
         f"--workdir={workdir}", "--config.mesh.data=1", "--config.mesh.fsdp=4",
         "--config.mesh.tensor=2", "--distributed", f"--coordinator_address=127.0.0.1:{port}",
         "--num_processes=2", f"--process_id={i}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)]
    try:
        errors = [worker.communicate(timeout=300)[0] for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    assert [w.returncode for w in workers] == [0, 0], errors[0][-2000:] + errors[1][-2000:]
    for i, rows in enumerate(("0:4", "4:8")):
        assert f"process {i} of 2 reads rows {rows} of each batch of 8" in errors[i]
    Trainer(run, str(tmp_path / "one")).fit()
    sharded, one = MetricsLog(workdir).read(), MetricsLog(str(tmp_path / "one")).read()
    assert [(r["split"], r["step"]) for r in sharded] == [(r["split"], r["step"]) for r in one]
    for mine, theirs in zip(sharded, one, strict=True):  # train loss, eval loss at every exit
        key = "loss" if mine["split"] == "train" else "exit_loss"
        np.testing.assert_allclose(mine[key], theirs[key], rtol=2e-6)
    restored, _, _ = load_params(workdir)
    expected, _, _ = load_params(str(tmp_path / "one"))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 restored, expected)


def test_greedy_decoding_on_a_mesh_equals_one_device(on_eight_devices):
    """Rows over data (4) and weights split over tensor (2): `ar`, a selfspec chain with a
    confidence stop (verified as far as its rows drafted), Kangaroo's tree, a draft model and
    a hybrid's tree through SSM layers give one device's tokens, for 6 prompts run as 8.
    Catches a rule that splits a dimension the decode loop indexes per row or per head in a way
    the partitioner cannot keep exact (a cache written to the wrong rows, a K/V head split
    from its queries), and padding rows that change the real rows on a mesh."""
    assert on_eight_devices[0]["decoded"] == M.decode(None)


def test_the_decode_cache_is_laid_out_by_the_rules():
    """Rows over data; a Mamba-2 state's heads over tensor; attention's merged rows-and-heads
    axis split by its heads too only where each shard holds one row (a row-major merge of two
    split axes is otherwise not one split). Catches a cache left out of the rules (replicated)
    and a merged axis split into blocks that mix rows and heads."""
    cfg = ModelConfig(**M.MODEL, num_layers=2, layer_pattern=("attention", "mamba2"),
                      ssm=SsmConfig(num_heads=4, head_dim=8, state_size=8, groups=2,
                                    chunk_size=8))
    mesh = jax.sharding.AbstractMesh((4, 1, 2), ("data", "fsdp", "tensor"))
    P = jax.sharding.PartitionSpec

    def specs(rows, on=mesh):
        cache = jax.eval_shape(lambda: allocate_cache(cfg, rows, 32, 4))
        return cache_specs(on, cache, rows)

    four, eight = specs(4), specs(8)
    assert four.layers[0].k == P(("data", "tensor"), None, None)  # a row per shard
    assert eight.layers[0].v == P("data", None, None)              # two rows per shard
    assert eight.layers[1].state == P("data", "tensor", None, None)
    assert eight.layers[1].dt == P("data", None, "tensor") and eight.lengths == P("data")
    tensor_only = jax.sharding.AbstractMesh((1, 1, 2), ("data", "fsdp", "tensor"))
    assert specs(1, tensor_only).layers[0].k == P("tensor", None, None)  # batch 1: heads
    assert specs(3, tensor_only).layers[0].k == P(None, None, None)


def test_the_decode_loops_cache_carries_its_layout_on_a_mesh(on_eight_devices):
    """Inside a jitted program on the (4, 1, 2) mesh (`jax.set_mesh`, as `Generator(mesh=)`
    runs), a freshly allocated cache comes out as `cache_specs` says. Catches a constraint that
    is never applied (zeros have no layout of their own: unconstrained, a tensor-parallel mesh
    kept every head's K/V on every device)."""
    assert on_eight_devices[0]["cache specs"] == {
        "k": "P(('data', 'tensor'),)", "state": "P('data', 'tensor')"}  # trailing Nones dropped


def test_heads_and_distillation_train_on_a_mesh_with_the_losses_of_one_device(
        on_eight_devices):
    """A Kangaroo adapter and a distilled draft model, each on a frozen base, on (2, 2, 2):
    the losses of one device, the frozen weights and the trained state split as the rules say.
    Catches a base or teacher left whole on one device (copied to every device at each step),
    a head state left replicated, a state whose layout changes between steps."""
    results, one = on_eight_devices[0]["heads"], M.heads((1, 1, 1))
    for name in ("kangaroo", "distill"):
        np.testing.assert_allclose(results[name], one[name], rtol=2e-6, err_msg=name)
        assert results[f"{name} frozen mlp.down"] == "P(None, 'tensor', 'fsdp')"
    assert results["kangaroo trained qkv"] == "P('fsdp', 'tensor', None, None)"
    assert results["distill trained qkv"] == "P(None, 'fsdp', 'tensor', None, None)"


def test_the_sharded_train_step_and_generate_loops_export_for_tpu_and_cuda(on_eight_devices):
    assert on_eight_devices[0]["exported for"] == ["tpu", "cuda", "8 devices"]
    assert on_eight_devices[0]["decoding exported for"] == [
        "greedy: tpu,cuda on 8 devices", "sampled: tpu,cuda on 8 devices"]


def test_a_process_reads_only_the_rows_its_devices_hold():
    """The sampler's rows of a batch (across an epoch's end) are those rows of the whole batch,
    and one process holds every row. Catches a sampler that reads the first rows whatever it
    is asked for, or counts the data position in local rows (processes would drift apart)."""
    sampler = BatchSampler(np.arange(10 * 3).reshape(10, 3), batch_size=8, seed=0)
    for position in (0, 8, 16):
        whole = sampler.batch(position)
        np.testing.assert_array_equal(sampler.batch(position, slice(4, 8)), whole[4:8])
    assert process_rows(make_mesh(MeshConfig()), 8) == slice(0, 8)


def test_meshes_and_batches_that_do_not_fit_are_clear_errors():
    with pytest.raises(ValueError, match="at most one -1"):
        MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="does not fit 1 devices"):
        make_mesh(MeshConfig(data=1, fsdp=2))
    with pytest.raises(ValueError, match="batch_size=6 must be a multiple of"):
        check_batch(jax.sharding.AbstractMesh((2, 4, 1), ("data", "fsdp", "tensor")), 6)


def test_a_dimension_the_mesh_does_not_divide_is_replicated():
    """Vocabulary 259 on tensor 2 stays whole (an uneven split is refused by jit); the other
    dimension still splits. Catches a spec that only works for round sizes."""
    mesh = jax.sharding.AbstractMesh((1, 2, 2), ("data", "fsdp", "tensor"))
    assert logical_to_spec(mesh, ("vocab", "embed"), (259, 32)) == \
        jax.sharding.PartitionSpec(None, "fsdp")
