"""CALM's confidence classifier on a trained model (its base, frozen): one logistic classifier
on the normalised hidden state of any exit, trained at every exit below the last to predict
whether that exit's argmax is already the final layer's. Decoding from its workdir exits early
with it (--calm_measure classifier; the model, tokenizer and data come from the base).
    python train/train.py --config configs/calm.py --config.base_workdir=runs/tiny \\
        --workdir runs/calm
    python infer/generate.py --workdir runs/calm --strategy calm --prompt "def main("
    python infer/calibrate.py --workdir runs/calm --consistency risk
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.base_workdir = ""  # required: the trained model's workdir
    config.calm = ml_collections.ConfigDict(dict(exits=()))  # (): every exit below the last
    # Device mesh (data, fsdp, tensor): the base's weights and the head laid out as the rules say.
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    config.train = ml_collections.ConfigDict(dict(
        batch_size=16, total_steps=200, learning_rate=1e-2, warmup_steps=20, min_lr_ratio=0.1,
        weight_decay=0.0, b1=0.9, b2=0.95, grad_clip=1.0, seed=0, eval_every=100,
        eval_batches=8, save_every=100, keep_checkpoints=3, log_every=10, remat="none",
        grad_accum=1, frozen=""))
    return config
