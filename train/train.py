"""Trains (or resumes) a specjax model.

    python train/train.py --config tiny_code --workdir runs/tiny \\
        [--config.train.total_steps=200 ...] [--config.mesh.fsdp=4 --config.mesh.tensor=2]

Several processes (a TPU pod slice, several GPU hosts, or local CPU processes) run the same
command with --distributed; on a TPU pod or under SLURM the processes find each other from the
environment, elsewhere give --coordinator_address, --num_processes and --process_id.

Exit status: 0 when the run reached train.total_steps (or had already), 1 for a user error
(one line on stderr), 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM) when a signal
stopped it after saving a checkpoint: run the same command again to resume.
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import signal
import sys

from absl import app, flags
from ml_collections import config_flags

from specjax import processes
from specjax.cli.entrypoint import define_config, parse_flags, run_cli
from specjax.cli.flags import define_model_flags
from specjax.training.config import config_reference
from specjax.training.registry import HEADS
from specjax.training.trainer import train_and_evaluate

__doc__ += "\n" + config_reference(  # `--help` prints the module docstring
    {name: head.config_class for name, head in HEADS.items()})

_CONFIG = define_config(None, "A shipped config (tiny_code:smoke) or a config file.")
define_model_flags()
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Join the other processes of a "
                                  "multi-process run (jax.distributed) before training.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0 "
                                   "(default: from the TPU / SLURM environment).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run (default: "
                                      "from the environment).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (default: from "
                                   "the environment).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    if _DISTRIBUTED.value:
        processes.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    explicit = tuple(config_flags.get_override_values(flags.FLAGS["config"]))
    result = run_cli(lambda: train_and_evaluate(_CONFIG.value, flags.FLAGS.workdir,
                                                explicit=explicit))
    if result.interrupted:
        print(f"interrupted at step {result.step}; checkpoint saved in {flags.FLAGS.workdir}. "
              "Run the same command again to resume.")
        sys.exit(128 + signal.Signals[result.signal_name].value)
    if result.already_done:
        return
    print(f"\nfinished step {result.step} in {result.wall_seconds:.0f} s")
    if result.report is not None:
        print(result.report.table())


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
