"""DeepSeek-style multi-token-prediction modules on a trained model (its base, frozen): 2
modules on the last hidden state, trained on their own unrolled drafts (training-time test),
distilled to the base. The model, tokenizer and data come from the base.
    python train/train.py --config configs/mtp.py --config.base_workdir=runs/tiny \\
        --workdir runs/mtp
    python infer/generate.py --workdir runs/mtp --strategy mtp --prompt "def main("
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.base_workdir = ""  # required: the trained model's workdir
    config.mtp = ml_collections.ConfigDict(dict(depth=2, decay=1.0))
    # Device mesh (data, fsdp, tensor): the base's weights and the head laid out as the rules say.
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    config.train = ml_collections.ConfigDict(dict(
        batch_size=16, total_steps=300, learning_rate=2e-3, warmup_steps=30, min_lr_ratio=0.1,
        weight_decay=0.0, b1=0.9, b2=0.95, grad_clip=1.0, seed=0, eval_every=100,
        eval_batches=8, save_every=100, keep_checkpoints=3, log_every=10, remat="none",
        grad_accum=1, frozen=""))
    config.decoding = ml_collections.ConfigDict(dict(num_draft=4))
    return config
