"""Pins of the EAGLE-3 import (`training.heads.eagle.import_eagle`)."""

import jax

from specjax.config import ModelConfig
from specjax.loading import load_model
from specjax.training.heads.eagle import import_eagle
from tests.cli.test_feature_head_cli import _published_eagle3
from tests.support.models import TINY_MODEL, damped_params, model_workdir

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})


def test_a_head_fusing_the_last_layer_imports(tmp_path):
    """EAGLE-3's layer ids are layer counts in [1, L]: a head that fuses the last layer's
    output (L) imports, and decoding fuses exactly the layers it names. Catches the range
    check written as 1 <= e < L, refusing a published head that reads the last layer."""
    params = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
    base = model_workdir(str(tmp_path / "base"), params, CFG)
    layers = (1, 2, CFG.num_layers)
    _published_eagle3(str(tmp_path / "hub"), CFG, layers, draft_vocab=CFG.vocab_size)
    assert import_eagle(str(tmp_path / "hub"), base, str(tmp_path / "head")) == layers
    weights = load_model(str(tmp_path / "head")).draft_weights["eagle"]
    assert tuple(weights.settings["exits"]) == layers
