"""The exit report's refusals of windows it cannot cut or evaluate, pinned by their messages
at their limits (issue 52's scan: raise sites no test triggered)."""

import numpy as np
import pytest

from specjax.tokenizer import ByteTokenizer
from specjax.tools.exit_report import exit_report, token_windows
from specjax.tools.layer_costs import LayerCosts

TEXT = ["abcdefghijklmnopqrstuvwxyz" * 4]  # 104 bytes: several windows of 8


@pytest.mark.parametrize("seq_len, max_tokens", [(0, 8), (-1, 8), (8, 7)])
def test_windows_need_a_length_and_room_for_one(seq_len, max_tokens):
    """seq_len below 1, or max_tokens below one window, is a one-line error naming both.
    Catches the bounds loosened by one (seq_len=0 cutting empty windows; max_tokens=7 with
    seq_len 8 asking for 7 // 8 = 0 windows, refused later as "too few tokens", which blames
    the text)."""
    with pytest.raises(ValueError, match=f"^seq_len={seq_len} must be >= 1 and "
                                         f"max_tokens={max_tokens} at least one window"):
        token_windows(TEXT, ByteTokenizer(), seq_len, max_tokens)


def test_the_limits_themselves_cut_one_window():
    """seq_len=1, and max_tokens equal to seq_len, are accepted: one window each. Catches the
    comparisons tightened (`seq_len <= 1`, `max_tokens <= seq_len`)."""
    assert token_windows(TEXT, ByteTokenizer(), 8, 8).shape == (1, 9)
    assert token_windows(TEXT, ByteTokenizer(), 1, 1).shape == (1, 2)


def test_no_windows_is_refused_before_any_work():
    """An empty [0, T+1] batch of windows is a one-line error. Catches the check dropped: a
    batch size of min(4, 0) = 0 and a report of no batches (NaN means, a division by zero)."""
    costs = LayerCosts(layer={"attention": {1: 1.0}}, head={1: 1.0})
    with pytest.raises(ValueError, match="^no held-out windows to evaluate$"):
        exit_report(None, None, np.zeros((0, 9), np.int32), costs, num_draft=[2])
