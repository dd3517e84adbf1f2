"""Kangaroo's adapter on a trained model (its base, frozen): one attention block at exit 1,
distilled to the base's final distribution. The model, tokenizer and data come from the base.
    python train/train.py --config configs/kangaroo.py --config.base_workdir=runs/tiny \\
        --workdir runs/kangaroo
    python infer/generate.py --workdir runs/kangaroo --strategy kangaroo --prompt "def main("
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.base_workdir = ""  # required: the trained model's workdir
    config.kangaroo = ml_collections.ConfigDict(dict(exit_layer=1))
    # Device mesh (data, fsdp, tensor): the base's weights and the head laid out as the rules say.
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    config.train = ml_collections.ConfigDict(dict(
        batch_size=16, total_steps=300, learning_rate=2e-3, warmup_steps=30, min_lr_ratio=0.1,
        weight_decay=0.0, b1=0.9, b2=0.95, grad_clip=1.0, seed=0, eval_every=100,
        eval_batches=8, save_every=100, keep_checkpoints=3, log_every=10, remat="none",
        grad_accum=1, frozen=""))
    # Kangaroo's second early exit: a chain stops after a draft below this top-1 probability.
    config.decoding = ml_collections.ConfigDict(dict(num_draft=6, draft_threshold=0.0))
    return config
