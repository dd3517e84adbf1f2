"""The benchmark's refusal of a seed count below one, pinned at its limit (issue 52's scan;
greedy runs refusing seeds > 1 are tested in test_bench.py)."""

import pytest

from specjax.decoding.engine import AUTOREGRESSIVE, Generator
from specjax.tools.bench import run_benchmark


@pytest.mark.parametrize("seeds", [0, -1])
def test_seeds_below_one_are_refused(tiny_cfg, tiny_params, seeds):
    """seeds=0 is a one-line error before anything compiles. Catches the bound dropped or
    taken as `< 0`: seeds=0 decodes nothing and reports 0 tokens per second (a division by
    zero in the speed-up)."""
    with pytest.raises(ValueError, match=f"^seeds={seeds}: must be >= 1, and 1 for greedy"):
        run_benchmark(Generator(tiny_params, tiny_cfg), {"ar": AUTOREGRESSIVE}, [[1, 2]],
                      max_new_tokens=2, seeds=seeds)
