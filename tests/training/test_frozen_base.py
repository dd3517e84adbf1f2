"""Which base a head is resumed and decoded on (`training.frozen_base.trained_base`), with
`load_base` replaced by a table of steps: no model is built."""

import pytest

from specjax.io.checkpoint import CheckpointError
from specjax.training import frozen_base
from specjax.training.frozen_base import FrozenBase, trained_base


def _base(step, checksum):
    return FrozenBase("/base", step, {}, None, {"step": step}, checksum)


@pytest.fixture
def steps(monkeypatch):
    """The base workdir's checkpoints (step -> checksum; None: the latest), read by load_base."""
    held = {4: "four", None: "six"}

    def load_base(workdir, step=None, *, mesh=None):
        if step not in held:
            raise CheckpointError(f"no step {step}")
        return _base(step if step is not None else 6, held[step])

    monkeypatch.setattr(frozen_base, "load_base", load_base)
    return held


RECORDED = {"workdir": "/base", "step": 4, "checksum": "four"}


@pytest.mark.parametrize("current", [None, _base(6, "six")])
def test_a_base_trained_on_since_gives_the_step_the_head_started_on(steps, current):
    """Decoding (no base loaded) and resuming (the run's base, trained on since) both take the
    recorded step 4. Catches one of the two paths keeping the latest base (a checksum refusal
    for a base that still holds the head's step)."""
    assert trained_base(RECORDED, "head", current=current).step == 4


@pytest.mark.parametrize("current", [None, _base(6, "four")])
def test_a_rotated_out_step_falls_back_to_weights_that_match(steps, current):
    """Step 4 rotated out: the latest (or the resumed run's base) is used when its weights are
    the recorded ones. Catches a fallback that refuses a base whose recorded step is gone but
    whose weights never changed."""
    del steps[4]
    steps[None] = "four"
    assert trained_base(RECORDED, "head", current=current).checksum == "four"


@pytest.mark.parametrize("current", [None, _base(6, "six")])
def test_a_base_whose_weights_differ_is_refused(steps, current):
    """Step 4 gone and the base's weights changed: a one-line refusal naming the user. Catches
    a fallback that decodes or resumes on other weights than the head was trained on."""
    del steps[4]
    with pytest.raises(CheckpointError, match="is not the one head was trained on"):
        trained_base(RECORDED, "head", current=current)
