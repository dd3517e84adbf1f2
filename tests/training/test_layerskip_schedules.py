"""LayerSkip schedules: dropout rates match p_l(t) = S(t) D(l) p_max empirically, and the
curricula enable exactly the exits the recipe says, with normalised weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.training.config import LayerSkipConfig
from specjax.training.curriculum import (
    curriculum_mask,
    exit_schedule,
    max_active_exits,
    raw_exit_weights,
)
from specjax.training.layer_dropout import depth_scale, dropout_rates, sample_keep_mask, time_scale


def test_depth_scale_rises_exponentially_from_zero_to_one():
    d = depth_scale(8)
    np.testing.assert_allclose(d, 2 ** (np.arange(8) / 7) - 1, rtol=1e-6)
    assert d[0] == 0 and d[-1] == pytest.approx(1.0)
    assert depth_scale(1).tolist() == [0.0]


def test_time_scale_schedules():
    exp = LayerSkipConfig(p_max=0.2, dropout_schedule="exp")
    assert time_scale(exp, 0, 100) == 0.0
    assert time_scale(exp, 99, 100) == pytest.approx(1.0)
    assert time_scale(exp, 50, 100) == pytest.approx(2 ** (50 / 99) - 1)
    assert time_scale(LayerSkipConfig(p_max=0.2), 50, 100) == 1.0


@pytest.mark.parametrize("schedule, step", [("constant", 0), ("exp", 70), ("exp", 99)])
def test_empirical_dropout_rates_match_the_formula(schedule, step):
    cfg = LayerSkipConfig(p_max=0.5, dropout_schedule=schedule)
    rates = dropout_rates(cfg, num_layers=6, step=step, total_steps=100)
    expected = time_scale(cfg, step, 100) * (2 ** (np.arange(6) / 5) - 1) * 0.5
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    samples = 20000
    keep = jax.jit(sample_keep_mask, static_argnums=2)(jax.random.PRNGKey(step),
                                                        jnp.asarray(rates), samples)
    dropped = 1.0 - np.asarray(keep).mean(axis=1)
    # 4.5 standard errors of a Bernoulli mean: a wrong formula or layer order fails.
    tolerance = 4.5 * np.sqrt(np.maximum(expected * (1 - expected), 1e-12) / samples) + 1e-9
    assert np.all(np.abs(dropped - expected) <= tolerance), (dropped, expected)


def test_masks_are_drawn_per_sample():
    keep = np.asarray(sample_keep_mask(jax.random.PRNGKey(0), jnp.full((3,), 0.5), 64))
    assert keep.shape == (3, 64)
    assert 0 < keep[0].sum() < 64 and not np.all(keep[0] == keep[1])


EXITS = (1, 2, 3, 4, 5, 6, 7, 8)


def test_rotational_curriculum_cycles_every_early_exit():
    cfg = LayerSkipConfig(curriculum="rotational", rotation_interval=3)
    masks = np.array([curriculum_mask(cfg, EXITS, 8, step, 100) for step in range(6)])
    # Step 0: exits 1, 4, 7 (+ final); step 1: 2, 5 (+8); step 2: 3, 6 (+8); then repeats.
    assert [list(np.asarray(EXITS)[m]) for m in masks[:3]] == [[1, 4, 7, 8], [2, 5, 8], [3, 6, 8]]
    np.testing.assert_array_equal(masks[:3], masks[3:])
    assert masks[:, -1].all()
    assert max_active_exits(cfg, EXITS, 8) == 4
    # Irregular exit sets: the static size is the true maximum over rotations.
    assert max_active_exits(cfg, (1, 4, 7), 8) == 3
    assert max_active_exits(LayerSkipConfig(curriculum="rotational", rotation_interval=2),
                            (1, 3, 5), 8) == 3


def test_gradual_curriculum_enables_exits_from_the_top():
    cfg = LayerSkipConfig(curriculum="gradual")
    total = 160
    masks = np.array([curriculum_mask(cfg, EXITS, 8, step, total) for step in range(total)])
    assert masks[0].tolist() == [False] * 7 + [True]
    assert masks[total // 2:].all()
    counts = masks.sum(axis=1)
    assert np.all(np.diff(counts) >= 0)
    first_on = [int(np.argmax(masks[:, e - 1])) for e in EXITS]
    # Exit e switches on at step ceil(T (8 - e) / 16): one layer every T / (2L) = 10 steps.
    assert first_on == [70, 60, 50, 40, 30, 20, 10, 0]


def test_exit_weights_convention():
    cfg = LayerSkipConfig(e_scale=0.5, exit_scale="sum")
    raw = raw_exit_weights(cfg, EXITS, 8, step=0)
    e = np.arange(1, 9)
    np.testing.assert_allclose(raw[:-1], 0.5 * e[:-1] * (e[:-1] + 1) / 2)
    assert raw[-1] == 36.0  # the final exit is never scaled by e_scale
    layers, weights = exit_schedule(cfg, EXITS, 8, step=0, total_steps=10)
    np.testing.assert_array_equal(layers, EXITS)
    np.testing.assert_allclose(weights, raw / raw.sum(), rtol=1e-6)


def test_exit_scale_warmup_ramps_early_exits_only():
    """Catches a warm-up that scales the final exit too, or that never reaches e_scale."""
    cfg = LayerSkipConfig(e_scale=0.5, e_scale_warmup=10)
    for step, ramp in ((0, 0.0), (5, 0.5), (10, 1.0), (30, 1.0)):
        raw = raw_exit_weights(cfg, EXITS, 8, step=step)
        np.testing.assert_allclose(raw[:-1], 0.5 * ramp)
        assert raw[-1] == 1.0


@pytest.mark.parametrize("curriculum", ["none", "rotational", "gradual"])
def test_schedule_has_static_size_and_normalised_weights(curriculum):
    cfg = LayerSkipConfig(curriculum=curriculum, rotation_interval=3, e_scale=0.3)
    size = max_active_exits(cfg, EXITS, 8)
    for step in range(0, 100, 7):
        layers, weights = exit_schedule(cfg, EXITS, 8, step, 100)
        assert layers.shape == weights.shape == (size,)
        assert weights.sum() == pytest.approx(1.0)
        mask = curriculum_mask(cfg, EXITS, 8, step, 100)
        enabled = [e for e, m in zip(EXITS, mask, strict=True) if m]
        assert sorted(set(layers[weights > 0].tolist())) == enabled


def test_zero_total_weight_is_an_error():
    cfg = LayerSkipConfig(e_scale=0.0)
    with pytest.raises(ValueError, match="no exit has positive loss weight"):
        exit_schedule(cfg, (1, 2), 8, 0, 10)
