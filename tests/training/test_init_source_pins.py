"""Continual training's source (`training.init_source`) pinned where the fresh audit's plant
got past tests/training/test_continual_training.py: explicit model fields compared with the
source's in their plain form."""

import pytest

from specjax.config import ModelConfig
from specjax.training.init_source import _model_from_source
from tests.support.models import TINY_MODEL

SOURCE = ModelConfig(**TINY_MODEL)


def test_an_explicit_field_equal_to_the_sources_as_a_tuple_is_accepted():
    """A config file writes sequences as tuples (`sliding_layers=()`), the source's config
    reads back lists: the same value either way agrees with the source, a different one is
    the one-line contradiction. Catches the comparison made without `_plain` (a tuple never
    equals a list), which refuses a config that agrees with its source."""
    model = _model_from_source({"sliding_layers": (), "num_layers": 4}, SOURCE,
                               {"model.sliding_layers", "model.num_layers"})
    assert model["sliding_layers"] == [] and model["num_layers"] == 4
    with pytest.raises(ValueError, match=r"^--config\.model\.sliding_layers=\(1,\) contradicts "
                                         r"init\.source"):
        _model_from_source({"sliding_layers": (1,)}, SOURCE, {"model.sliding_layers"})
