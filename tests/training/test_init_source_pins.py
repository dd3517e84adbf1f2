"""Continual training's source (`training.init_source`) pinned where the fresh audit's plant
got past tests/training/test_continual_training.py: explicit model fields compared with the
source's in their plain form; and its refusals the scan of issue 52 found untriggered."""

import numpy as np
import pytest

from specjax.config import ModelConfig
from specjax.io.checkpoint import CheckpointError
from specjax.training.init_source import _model_from_source, resolve_init
from tests.support.models import TINY_MODEL, model_workdir

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


def _workdir(path, **meta) -> str:
    """A workdir whose one checkpoint holds a stand-in weight and `meta` beside the model
    (no tokenizer unless `meta` names one)."""
    return model_workdir(str(path), {"w": np.zeros(2, np.float32)}, SOURCE,
                         **{"tokenizer": None, **meta})


@pytest.mark.parametrize("config, message", [
    ({"calm": {}}, "^init.source starts a model's own training; a head on a frozen base takes "
                   "config.base_workdir instead$"),
    ({"base_workdir": "runs/base"}, "^init.source starts a model's own training"),
    ({"distill": {"teacher_workdir": "runs/teacher"}},
     "^init.source and distill.teacher_workdir cannot be combined$")])
def test_init_source_refuses_a_head_or_a_teacher_beside_it(tmp_path, config, message):
    """Catches either check dropped: a head's section (or its base) beside init.source trains
    a model from the source and silently ignores the head asked for; a distillation teacher
    beside it is one too many starting points."""
    with pytest.raises(ValueError, match=message):
        resolve_init({"init": {"source": str(tmp_path)}, **config}, (), str(tmp_path / "w"))


def test_init_source_refuses_a_heads_workdir_and_a_source_without_a_tokenizer(tmp_path):
    """A head's workdir (its meta names a base) is no model to continue; a workdir that
    records no tokenizer leaves the run none unless --config.data.tokenizer gives one (then it
    is accepted). Catches the head's weights read as a model (a raw KeyError or shape error)
    and a run that silently tokenizes with the default bytes a model trained on another
    tokenizer."""
    head = _workdir(tmp_path / "head", base={"workdir": "b"}, objective="eagle", tokenizer="bytes")
    with pytest.raises(CheckpointError, match=r"holds a eagle head, not a model$"):
        resolve_init({"init": {"source": head}}, (), str(tmp_path / "w1"))
    bare = _workdir(tmp_path / "bare")
    with pytest.raises(ValueError, match="has no tokenizer: set --config.data.tokenizer"):
        resolve_init({"init": {"source": bare}}, (), str(tmp_path / "w2"))
    given = {"init": {"source": bare}, "data": {"tokenizer": "bytes"}}
    resolved, _ = resolve_init(given, ("data.tokenizer",), str(tmp_path / "w3"))
    assert resolved["data"]["tokenizer"] == "bytes"
