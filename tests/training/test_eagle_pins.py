"""Pins of the EAGLE-3 import (`training.heads.eagle.import_eagle`)."""

import os

import jax
import pytest
from safetensors.numpy import save_file

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


def _refused(base_workdir, tmp_path, change, message) -> None:
    """A published head, changed by `change(tensors)` and saved again, refused on import in
    one line with nothing written."""
    hub = str(tmp_path / "hub")
    tensors = _published_eagle3(hub, CFG, (1, 2, 3), draft_vocab=8)
    change(tensors)
    save_file(tensors, os.path.join(hub, "model.safetensors"))
    with pytest.raises(ValueError, match=message):
        import_eagle(hub, base_workdir, str(tmp_path / "head"))
    assert not os.path.exists(tmp_path / "head" / "checkpoints")


def test_a_head_for_another_width_or_a_larger_vocabulary_is_refused(base_workdir, tmp_path):
    """lm_head.weight must be [draft vocabulary <= V, D]. Catches the shape check dropped: a
    head of another width failing inside a matmul, or a draft vocabulary larger than the
    base's scattered out of range."""
    def wider(tensors):
        tensors["lm_head.weight"] = tensors["lm_head.weight"][:, :-1].copy()
    _refused(base_workdir, tmp_path, wider,
             r"lm_head\.weight is \(8, 31\), but the base model needs "
             r"\[draft vocabulary <= 259, 32\]$")


def test_a_d2t_mapping_twice_onto_one_token_is_refused(base_workdir, tmp_path):
    """d2t maps each draft id to a distinct target id inside the vocabulary. Catches the
    check dropped or loosened: two draft ids scattered onto one token (one of them silently
    lost) or past the vocabulary."""
    def twice(tensors):
        tensors["d2t"][1] = tensors["d2t"][0] - 1  # draft id 1 lands on draft id 0's token
    _refused(base_workdir, tmp_path, twice,
             r"d2t maps the draft vocabulary outside \[0, 259\) or twice onto one token$")
