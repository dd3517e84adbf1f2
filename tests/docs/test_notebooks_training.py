"""The notebooks that train models of their own (a stand-in checkpoint and its continual
training; a Mamba-2 hybrid) run end to end at smoke size in a fresh kernel each."""

import pytest

from tests.support.notebook_runner import run_notebook

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out


TRAINING_THEIR_OWN = ["your_own_model", "ssm"]


@pytest.mark.parametrize("name", TRAINING_THEIR_OWN)
def test_the_notebook_runs_end_to_end(name, tmp_path, monkeypatch):
    """Catches an API change a notebook did not follow (import, continual training, exit
    reports, tree scans), a figure that fails to draw, and a notebook's own checks failing."""
    run_notebook(name, tmp_path, monkeypatch)
