"""A workdir's calibrated decoding defaults (`io.calibrated_defaults`) pinned where the fresh
audits' plants got past the tune and calibration tests: the tuned section's mode names and a
record without its decoding section."""

import pytest

from specjax.config import ModelConfig
from specjax.io.calibrated_defaults import with_calibrated, write_calibrated
from tests.support.models import TINY_MODEL

CFG = ModelConfig(**TINY_MODEL)
CHOICE = {"strategy": "selfspec", "options": {"num_draft": 2}}


def test_a_tuned_strategy_under_an_unknown_mode_is_refused_naming_the_file(tmp_path):
    """The tuned section's keys are the modes decoding reads ("greedy", "sampled"): one under
    "greed" is a one-line error naming the file and the modes, and the same entry under
    "greedy" loads. Catches the mode check dropped: a misspelled mode loads without a word
    and is never used."""
    write_calibrated(str(tmp_path), 5, {}, {}, {"greed": CHOICE})
    with pytest.raises(ValueError, match=r"calibrated_decoding\.json: tuned\.greed is not a "
                                         r"mode \(greedy, sampled\)"):
        with_calibrated({"step": 5}, str(tmp_path), CFG)
    (tmp_path / "calibrated_decoding.json").unlink()
    write_calibrated(str(tmp_path), 5, {}, {}, {"greedy": CHOICE})
    assert with_calibrated({"step": 5}, str(tmp_path), CFG)["tuned"] == {"greedy": CHOICE}


def test_a_record_without_a_decoding_section_is_refused_naming_the_file(tmp_path):
    """A calibrated_decoding.json holding an object without its "decoding" section (an older
    or hand-edited file) is a one-line error naming it when the workdir loads. Catches the
    section check dropped (the record accepted, then a KeyError when the defaults are laid
    over the checkpoint's)."""
    (tmp_path / "calibrated_decoding.json").write_text('{"step": 5}')
    with pytest.raises(ValueError, match=r"calibrated_decoding\.json has no 'decoding' "
                                         r"section; calibrate again or delete it$"):
        with_calibrated({"step": 5}, str(tmp_path), CFG)
