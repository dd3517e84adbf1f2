"""An EAGLE-3 head on a trained model (its base, frozen): one decoder layer fed the base's hidden
states after three layers (EAGLE-3's 2, L // 2, L - 3 unless `layers` says), trained on its own
unrolled drafts (training-time test, 4 depths), distilled to the base. The model, tokenizer and
data come from the base.
    python train/train.py --config eagle --config.base_workdir=runs/tiny \\
        --workdir runs/eagle
    python infer/generate.py --workdir runs/eagle --strategy eagle --prompt "def main("
"""

import ml_collections

from specjax.training.config import head_config


def get_config() -> ml_collections.ConfigDict:
    config = head_config()
    config.eagle = ml_collections.ConfigDict(dict(layers="", unroll=4, decay=0.8))
    config.decoding = ml_collections.ConfigDict(dict(num_draft=4))
    return config
