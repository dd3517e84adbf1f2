"""Medusa heads on a trained model (its base, frozen): 4 heads on the last hidden state, head k
trained on the corpus token k + 1 places after the next. The model, tokenizer and data come
from the base.
    python train/train.py --config medusa --config.base_workdir=runs/tiny \\
        --workdir runs/medusa
    python infer/generate.py --workdir runs/medusa --strategy medusa --prompt "def main("
"""

import ml_collections

from specjax.training.config import head_config


def get_config() -> ml_collections.ConfigDict:
    config = head_config()
    config.medusa = ml_collections.ConfigDict(dict(num_heads=4, decay=0.8))
    # Every depth is drafted at once: a chain as deep as the heads.
    config.decoding = ml_collections.ConfigDict(dict(num_draft=4))
    return config
