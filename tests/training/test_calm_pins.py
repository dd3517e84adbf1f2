"""CALM's trained exits checked against the model's depth at their limit (issue 52's scan)."""

import pytest

from specjax.training.heads.calm import CalmConfig, trained_exits


def test_calm_exits_must_lie_below_the_last_layer():
    """Exit 4 of a 4-layer model is its last layer (nothing to stop early for): refused; exit
    3 is the deepest accepted, and no exits means every exit below the last. Catches the
    bound taken as `>` (exit 4 trained against itself: agreement 1 everywhere) or as `>=`
    one lower (exit 3 refused)."""
    with pytest.raises(ValueError, match=r"^calm\.exits=\[2, 4\] must lie below num_layers=4$"):
        trained_exits(CalmConfig(exits=(2, 4)), 4)
    assert trained_exits(CalmConfig(exits=(1, 3)), 4) == (1, 3)
    assert trained_exits(CalmConfig(), 4) == (1, 2, 3)
