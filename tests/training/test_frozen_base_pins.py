"""The frozen base pinned where the fresh audit's plant got past test_frozen_base.py: a run's
config laid over its base's, by hand."""

from specjax.config import ModelConfig
from specjax.training.frozen_base import FrozenBase, config_on_base
from tests.support.models import TINY_MODEL


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
