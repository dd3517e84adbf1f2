"""Kangaroo's adapter on a trained model (its base, frozen): one attention block at exit 1,
distilled to the base's final distribution. The model, tokenizer and data come from the base.
    python train/train.py --config kangaroo --config.base_workdir=runs/tiny \\
        --workdir runs/kangaroo
    python infer/generate.py --workdir runs/kangaroo --strategy kangaroo --prompt "def main("
"""

import ml_collections

from specjax.training.config import head_config


def get_config() -> ml_collections.ConfigDict:
    config = head_config()
    config.kangaroo = ml_collections.ConfigDict(dict(exit_layer=1))
    # Kangaroo's second early exit: a chain stops after a draft below this top-1 probability.
    config.decoding = ml_collections.ConfigDict(dict(num_draft=6, draft_threshold=0.0))
    return config
