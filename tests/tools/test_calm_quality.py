"""What CALM's calibration measures: ROUGE-L, teacher-forced losses through the exits, and the
calibrated defaults file a workdir keeps."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import model as M
from specjax.config import ModelConfig
from specjax.decoding.drafters.calm import Calm
from specjax.decoding.drafters.calm_exit import EarlyExit
from specjax.io.calibrated_defaults import FILE, read_calibrated, with_calibrated, write_calibrated
from specjax.tools.calm_quality import rouge_l
from specjax.tools.forced import forced_losses
from tests.support.models import TINY_MODEL, damped_params

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PARAMS = damped_params(CFG, jax.random.PRNGKey(0), 0.5)


def lcs_reference(a, b):
    table = np.zeros((len(a) + 1, len(b) + 1), int)
    for i, x in enumerate(a, 1):
        for j, y in enumerate(b, 1):
            table[i, j] = table[i - 1, j - 1] + 1 if x == y else max(table[i - 1, j],
                                                                     table[i, j - 1])
    return table[-1, -1]


def test_rouge_l_equals_the_textbook_dynamic_programme():
    """Catches a vectorised LCS row that misses the running maximum along the row (or the
    diagonal step), on random sequences over a small alphabet (many repeats)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        a, b = (rng.integers(0, 4, rng.integers(0, 12)).tolist() for _ in range(2))
        common = lcs_reference(a, b)
        expected = (float(len(a) == len(b)) if not a or not b else
                    0.0 if common == 0 else 2 * common / (len(a) + len(b)))
        assert rouge_l(a, b) == pytest.approx(expected)


@pytest.mark.parametrize("threshold,exit_layer", [(1.0, 4), (0.0, 1)])
def test_forced_losses_equal_the_models_log_loss_at_the_exit_taken(threshold, exit_layer):
    """Teacher forcing through the exits against the model without a cache: at lambda 1 every
    reference token is scored by the final layer, at lambda 0 by exit 1 (which no propagated
    state reaches: layer 0 always runs). Catches an off-by-one between a token and the logits
    that score it."""
    prompts, lengths = jnp.asarray([[3, 1, 4, 1, 5, 0, 0, 0], [2, 7, 1, 8, 2, 8, 1, 8]]), \
        jnp.asarray([5, 8])
    targets = jnp.asarray([[9, 2, 6, 5, 3], [5, 9, 0, 4, 5]])
    calm = Calm(EarlyExit((1, 2, 3)), threshold)
    losses, exits = forced_losses(M.unstack_layers(PARAMS, CFG), calm.runtime_params(None), prompts,
                                  lengths, targets, cfg=CFG, early_exit=calm.early_exit,
                                  cache_len=16)
    for row in range(2):
        sequence = jnp.concatenate([prompts[row, :lengths[row]], targets[row]])[None]
        hidden = M.run_layers(PARAMS, CFG, M.embed(PARAMS, CFG, sequence))
        exit_hidden = hidden[exit_layer - 1]
        final = jax.nn.log_softmax(M.exit_logits(PARAMS, CFG, hidden[-1])[0], -1)
        early = jax.nn.log_softmax(M.exit_logits(PARAMS, CFG, exit_hidden)[0], -1)
        start = int(lengths[row]) - 1
        expected = [-final[start, targets[row, 0]]] + [
            -early[start + t, targets[row, t]] for t in range(1, targets.shape[1])]
        np.testing.assert_allclose(losses[row], expected, atol=1e-4)
        assert exits[row].tolist() == [4] + [exit_layer] * (targets.shape[1] - 1)


def test_calibrated_defaults_apply_to_their_step_only(tmp_path):
    """Catches a calibration applied to weights it was not measured on (a workdir trained on
    since), and an update that drops earlier calibrated fields."""
    workdir = str(tmp_path)
    write_calibrated(workdir, 100, {"calm_threshold": 0.7}, {"delta": 0.1})
    write_calibrated(workdir, 100, {"calm_measure": "state"}, {"epsilon": 0.05})
    meta = {"step": 100, "config": {"decoding": {"exit_layer": 2, "calm_threshold": 0.9}}}
    decoding = with_calibrated(meta, workdir, CFG)["config"]["decoding"]
    assert decoding == {"exit_layer": 2, "calm_threshold": 0.7, "calm_measure": "state"}
    assert meta["config"]["decoding"]["calm_threshold"] == 0.9  # the input is not modified
    assert with_calibrated({**meta, "step": 200}, workdir, CFG) == {**meta, "step": 200}
    assert read_calibrated(workdir)["calibration"] == {"delta": 0.1, "epsilon": 0.05}


def test_a_failed_write_keeps_the_previous_calibration(tmp_path, monkeypatch):
    """The file is replaced by one rename: a write that fails half-way leaves the old record
    and no stray partial file."""
    workdir = str(tmp_path)
    write_calibrated(workdir, 1, {"calm_threshold": 0.7}, {})
    monkeypatch.setattr(json, "dump", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        write_calibrated(workdir, 1, {"calm_threshold": 0.1}, {})
    monkeypatch.undo()
    assert read_calibrated(workdir)["decoding"] == {"calm_threshold": 0.7}
    assert os.listdir(workdir) == [FILE]


def test_an_unreadable_calibration_is_a_one_line_error(tmp_path):
    (tmp_path / FILE).write_text("{not json")
    with pytest.raises(ValueError, match=f"{FILE} is not readable JSON"):
        read_calibrated(str(tmp_path))
