"""Trains (or resumes) a specjax model.

    python train/train.py --config configs/tiny_code.py --workdir runs/tiny \
        [--config.train.total_steps=200 ...]
"""


from absl import app, flags
from ml_collections import config_flags

from specjax.entrypoint import run_cli
from specjax.training.trainer import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file with get_config().")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    result = run_cli(lambda: train_and_evaluate(_CONFIG.value, _WORKDIR.value))
    if result.interrupted:
        print(f"interrupted at step {result.step}; checkpoint saved in {_WORKDIR.value}. "
              "Run the same command again to resume.")
        return
    print(f"\nfinished step {result.step} in {result.wall_seconds:.0f} s")
    if result.report is not None:
        print(result.report.table())


if __name__ == "__main__":
    app.run(main)
