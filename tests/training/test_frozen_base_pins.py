"""The frozen base pinned where the fresh audit's plant got past test_frozen_base.py: a run's
config laid over its base's, by hand; and the refusals issue 52's scan found untriggered in
the frozen base and the objectives built on one (heads, distillation's teacher)."""

import pytest

from specjax.config import ModelConfig
from specjax.io.checkpoint import CheckpointError
from specjax.training.frozen_base import (
    FrozenBase,
    config_on_base,
    load_base,
    save_imported_head,
)
from specjax.training.heads.kangaroo import KangarooAdapter, KangarooConfig
from specjax.training.registry import make_objective
from tests.support.models import TINY_MODEL, tiny_run


def test_the_runs_own_data_and_decoding_fields_override_the_bases(tmp_path):
    """The base trained on seq_len 64 of stdlib and decodes with num_draft 3; a head's run
    sets seq_len 16 and num_draft 5: the run's values win, the fields it leaves out come from
    the base, the model and tokenizer are the base's. Catches the base's sections laid over
    the run's (a head trained on windows it never asked for)."""
    cfg = ModelConfig(**TINY_MODEL)
    base = FrozenBase(str(tmp_path), 0, {}, cfg, {"tokenizer": "bytes", "config": {
        "data": {"source": "stdlib", "seq_len": 64}, "decoding": {"num_draft": 3,
                                                                  "exit_layer": 2}}}, "x")
    out = config_on_base({"data": {"seq_len": 16}, "decoding": {"num_draft": 5}}, base)
    assert out["data"]["seq_len"] == 16 and out["data"]["source"] == "stdlib"
    assert out["decoding"] == {"num_draft": 5, "exit_layer": 2}
    assert out["model"] == cfg.to_dict() and out["data"]["tokenizer"] == "bytes"


@pytest.mark.parametrize("config, message", [
    ({"model": {"num_layers": 2}}, "^a run on config.base_workdir takes its model from the "
                                   "base; remove the model section$"),
    ({"data": {"tokenizer": "other.json"}},
     "^data.tokenizer='other.json' differs from the base's 'bytes'$")])
def test_a_run_on_a_base_refuses_another_model_or_tokenizer(tmp_path, config, message):
    """Catches each check dropped: a head's run with a model section of its own (a head
    trained on a model the base is not) and a run's tokenizer that is not the base's (a head
    trained on ids the base never saw). A base recording no tokenizer is
    tests/cli/test_bad_inputs.py's. The base has no weights: config_on_base reads its meta."""
    base = FrozenBase(str(tmp_path), 0, {}, ModelConfig(**TINY_MODEL), {"tokenizer": "bytes"},
                      "x")
    with pytest.raises(ValueError, match=message):
        config_on_base(config, base)


@pytest.mark.parametrize("config, message", [
    (lambda base: {"base_workdir": base, "kangaroo": {"exit_layer": 1},
                   "train": tiny_run()["train"]},
     "^the workdir holds a layerskip run, not a kangaroo head; use a new --workdir$"),
    (lambda base: tiny_run(distill={"teacher_workdir": base}),
     "^the workdir holds a layerskip run, not a distilled one; use a new --workdir$")],
    ids=["kangaroo", "distill"])
def test_a_head_or_distillation_does_not_resume_another_run(base_workdir, config, message):
    """Resuming a workdir whose checkpoint another objective wrote (here a LayerSkip model's)
    is a one-line error before anything trains. Catches the objective check dropped: the
    head's (or draft model's) training restoring the model's weights as its own, a raw
    KeyError on the meta it lacks."""
    with pytest.raises(CheckpointError, match=message):
        make_objective(config(base_workdir)).check_resume({"objective": "layerskip"})


def test_an_imported_head_never_lands_on_a_workdir_with_checkpoints(base_workdir):
    """Catches the check dropped: a published head written as step 0 over a workdir that
    already holds a run (here the base itself), mixing the two."""
    with pytest.raises(ValueError, match="already holds checkpoints; import into a new "
                                         "workdir$"):
        save_imported_head(KangarooAdapter, KangarooConfig(), {}, load_base(base_workdir),
                           base_workdir, {}, {})
