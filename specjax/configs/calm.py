"""CALM's confidence classifier on a trained model (its base, frozen): one logistic classifier
on the normalised hidden state of any exit, trained at every exit below the last to predict
whether that exit's argmax is already the final layer's. Decoding from its workdir exits early
with it (--calm_measure classifier; the model, tokenizer and data come from the base).
    python train/train.py --config calm --config.base_workdir=runs/tiny \\
        --workdir runs/calm
    python infer/generate.py --workdir runs/calm --strategy calm --prompt "def main("
    python infer/learn_then_test.py --workdir runs/calm --consistency risk
"""

import ml_collections

from specjax.training.config import head_config


def get_config() -> ml_collections.ConfigDict:
    config = head_config(total_steps=200, learning_rate=1e-2, warmup_steps=20)
    config.calm = ml_collections.ConfigDict(dict(exits=()))  # (): every exit below the last
    return config
