"""DeepSeek-style multi-token-prediction modules on a trained model (its base, frozen): 2
modules on the last hidden state, trained on their own unrolled drafts (training-time test),
distilled to the base. The model, tokenizer and data come from the base.
    python train/train.py --config mtp --config.base_workdir=runs/tiny \\
        --workdir runs/mtp
    python infer/generate.py --workdir runs/mtp --strategy mtp --prompt "def main("
"""

import ml_collections

from specjax.training.config import head_config


def get_config() -> ml_collections.ConfigDict:
    config = head_config()
    config.mtp = ml_collections.ConfigDict(dict(depth=2, decay=1.0))
    config.decoding = ml_collections.ConfigDict(dict(num_draft=4))
    return config
