"""The train step's memory: the estimate training prints at start-up against the device's
measured peak.

    python bench/memory_check.py --config tiny_code:gpu1b \\
        --config.train.grad_accum=4 --config.train.remat=full [--steps 3] [--output_json F]

Runs a few steps of the run's own LayerSkip train step (its compiled program, state and data,
nothing saved) and prints the estimate (`training.memory`: the state counted from its shapes,
XLA's buffer assignment for the step) beside the peak bytes the device had in use
(`Device.memory_stats`: GPUs and TPUs report it; a CPU does not, and then only the estimate is
printed).
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import json
import time

import jax
from absl import app, flags

from specjax.cli.decoding import require_positive_flags
from specjax.cli.entrypoint import define_config, parse_flags, run_cli
from specjax.cli.flags import define_output_flags
from specjax.outputs import staged
from specjax.training.config import config_reference
from specjax.training.memory import GIB
from specjax.training.registry import layerskip_with_data

__doc__ += "\n" + config_reference()  # `--help` lists the config fields too

_CONFIG = define_config(None, "A shipped config (tiny_code:smoke) or a config file.")
_STEPS = flags.DEFINE_integer("steps", 3, "Train steps to run.")
define_output_flags()
flags.mark_flags_as_required(["config"])


def check(config, steps: int) -> dict:
    objective, sampler = layerskip_with_data(config.to_dict(), "memory_check")
    run = objective.run
    state = objective.init_state()
    tick = time.perf_counter()
    for step in range(steps):
        state, metrics = objective.train_step(state, sampler.batch(step * run.train.batch_size),
                                              step)
        float(metrics["loss"])
    seconds = (time.perf_counter() - tick) / steps
    estimate = objective.memory
    stats = jax.devices()[0].memory_stats() or {}
    measured = stats.get("peak_bytes_in_use")
    record = {"device": jax.devices()[0].device_kind, "grad_accum": run.train.grad_accum,
              "remat": run.train.remat, "param_dtype": run.model.param_dtype,
              "dtype": run.model.dtype, "batch_size": run.train.batch_size,
              "seq_len": run.data.seq_len, "estimate": estimate.to_dict() if estimate else None,
              "measured_peak": measured, "seconds_per_step": seconds}
    print(estimate.line() if estimate else "no estimate: the backend reports no memory analysis")
    if measured is not None and estimate is not None:
        print(f"measured peak in use: {measured / GIB:.2f} GiB = {measured / estimate.peak:.3f}x "
              f"the estimate ({seconds:.2f} s/step)")
    return record


def main(argv):
    del argv

    def body() -> None:
        require_positive_flags("steps")
        with staged(flags.FLAGS.output_json) as path:
            record = check(_CONFIG.value, _STEPS.value)
            if path:
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(record, f, indent=1)

    run_cli(body)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
