"""What the mesh machinery costs: the LayerSkip train step jitted with the mesh's shardings (the
batch placed on the mesh, as training does) against a plain `jax.jit` of the same step, on the
same state and batches, in one process.

    python train/step_bench.py --config configs/tiny_code.py [--steps 10]

Steps alternate between the two programs after one warm-up step each (compile time is printed
separately), so both see the same machine load; the median step time of each is compared.
"""

import statistics
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from specjax.data import BatchSampler, Corpus
from specjax.entrypoint import parse_flags, run_cli
from specjax.sharding import place_batch
from specjax.training.objective import LayerSkip, step_schedule
from specjax.training.objectives import make_objective
from specjax.training.train_step import make_train_step

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file with get_config().")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps per program.")
flags.mark_flags_as_required(["config"])


def bench(config, steps: int) -> None:
    objective = make_objective(config.to_dict())
    if not isinstance(objective, LayerSkip):
        raise ValueError("step_bench times the LayerSkip train step; give a model config")
    run = objective.run
    plain = jax.jit(make_train_step(run.model, objective.optimizer, remat=run.train.remat))
    programs = {"plain jit": plain,
                f"mesh {dict(objective.mesh.shape)}":
                    lambda s, b, k, sch: objective.jitted_step(s, place_batch(b, objective.mesh),
                                                               k, sch)}
    sampler = BatchSampler(Corpus.build(run.data).train, run.train.batch_size, run.train.seed)
    state = objective.init_state()
    times: dict[str, list[float]] = {name: [] for name in programs}
    for step in range(steps + 1):
        batch = sampler.batch(step * run.train.batch_size)
        args = (np.asarray(batch), jax.random.PRNGKey(step), step_schedule(run, step))
        for name, program in programs.items():
            fresh = jax.block_until_ready(jax.tree.map(lambda x: x.copy(), state))  # donated
            tick = time.perf_counter()
            new_state, metrics = program(fresh, *args)
            float(metrics["loss"])
            elapsed = time.perf_counter() - tick
            if step == 0:
                print(f"{name}: first step (compile + run) {elapsed:.1f} s")
            else:
                times[name].append(elapsed)
        state = new_state
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["plain jit"]
    for name, median in medians.items():
        print(f"{name:40s} {median * 1e3:8.1f} ms/step  {median / base:.3f}x of plain jit")


def main(argv):
    del argv
    run_cli(lambda: bench(_CONFIG.value, _STEPS.value))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
