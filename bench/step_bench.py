"""The LayerSkip train step's speed: the step jitted with the mesh's shardings (the batch placed
on the mesh, as training does) against a plain `jax.jit` of the same step, on the same state and
batches, in one process, and the model-FLOPs utilisation of each.

    python bench/step_bench.py --config tiny_code [--steps 10]
    python bench/step_bench.py --config tiny_code:gpu1b   # on a GPU

Each program is compiled ahead of time (compile time printed separately); steps then alternate
between the two after one warm-up step each, so both see the same machine load, and the median
step time of each is compared. Model FLOPs (`training.flops`: counted from the model's shapes,
without rematerialisation; XLA's own count sees a scanned layer once) per step and device over
the step time is the achieved rate, and over the device's peak dense bf16 rate
(`--peak_tflops`, or the datasheet figure of a known GPU/TPU) the utilisation (MFU).
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import statistics
import time

import jax
import numpy as np
from absl import app, flags

from specjax.cli.decoding import require_positive_flags
from specjax.cli.entrypoint import define_config, parse_flags, run_cli
from specjax.sharding import place_batch
from specjax.training.config import config_reference
from specjax.training.flops import train_flops_per_token
from specjax.training.objective import step_schedule
from specjax.training.registry import layerskip_with_data
from specjax.training.train_step import make_train_step

__doc__ += "\n" + config_reference()  # `--help` lists the config fields too

_CONFIG = define_config(None, "A shipped config (tiny_code:smoke) or a config file.")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps per program.")
_PEAK = flags.DEFINE_float("peak_tflops", None, "The device's peak dense TFLOP/s for the "
                           "utilisation (default: the datasheet bf16 figure of a known GPU/TPU; "
                           "none on CPU).")
flags.mark_flags_as_required(["config"])

# Dense bf16 peak TFLOP/s per device (vendor datasheets; SXM parts), by `device_kind` substring.
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "TPU v6 lite": 918.0,
               "TPU v5 lite": 197.0, "TPU v5p": 459.0, "TPU v4": 275.0}


def peak_tflops(device: jax.Device) -> float | None:
    """The device's peak from `PEAK_TFLOPS`, None when unknown (a CPU)."""
    return next((peak for kind, peak in PEAK_TFLOPS.items() if kind in device.device_kind),
                None)


def bench(config, steps: int, peak: float | None) -> dict:
    objective, sampler = layerskip_with_data(config.to_dict(), "step_bench")
    run = objective.run
    state = objective.init_state()
    example = (np.asarray(sampler.batch(0)), jax.random.PRNGKey(0), step_schedule(run, 0))
    plain = jax.jit(make_train_step(run.model, objective.optimizer, remat=run.train.remat,
                                    grad_accum=run.train.grad_accum))
    mesh_name = f"mesh {dict(objective.mesh.shape)}"
    placed = (place_batch(example[0], objective.mesh), *example[1:])
    step_flops = (train_flops_per_token(run.model, run.data.seq_len) * run.train.batch_size
                  * run.data.seq_len)
    compiled, report = {}, {}
    for name, jitted, args, devices in (("plain jit", plain, example, 1),
                                        (mesh_name, objective.jitted_step, placed,
                                         objective.mesh.size)):
        tick = time.perf_counter()
        compiled[name] = jitted.lower(state, *args).compile()
        report[name] = {"compile_s": time.perf_counter() - tick, "flops": step_flops / devices}
        print(f"{name}: compiled in {report[name]['compile_s']:.1f} s")
    programs = {"plain jit": compiled["plain jit"],
                mesh_name: lambda s, b, k, sch: compiled[mesh_name](
                    s, place_batch(b, objective.mesh), k, sch)}
    times: dict[str, list[float]] = {name: [] for name in programs}
    for step in range(steps + 1):
        args = (np.asarray(sampler.batch(step * run.train.batch_size)),
                jax.random.PRNGKey(step), step_schedule(run, step))
        for name, program in programs.items():
            fresh = jax.block_until_ready(jax.tree.map(lambda x: x.copy(), state))  # donated
            tick = time.perf_counter()
            new_state, metrics = program(fresh, *args)
            float(metrics["loss"])
            if step:  # the first is a warm-up
                times[name].append(time.perf_counter() - tick)
        state = new_state
    peak = peak if peak is not None else peak_tflops(jax.devices()[0])
    base = statistics.median(times["plain jit"])
    for name, entry in report.items():
        median = statistics.median(times[name])
        rate = entry["flops"] / median / 1e12
        entry.update(step_s=median, tflops_per_s=rate, mfu=rate / peak if peak else None)
        print(f"{name:40s} {median * 1e3:8.1f} ms/step  {median / base:.3f}x of plain jit  "
              f"{rate:.3g} TFLOP/s per device"
              + (f" = {100 * entry['mfu']:.1f}% of the {peak:g} peak" if peak else
                 " (MFU: give --peak_tflops)"))
    return report


def main(argv):
    del argv

    def body() -> dict:
        require_positive_flags("steps")  # before the compiles, which take seconds to minutes
        if _PEAK.value is not None and _PEAK.value <= 0:
            raise ValueError(f"--peak_tflops={_PEAK.value:g} must be > 0")
        return bench(_CONFIG.value, _STEPS.value, _PEAK.value)

    run_cli(body)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
