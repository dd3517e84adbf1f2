"""Hugging Face Hub ids ("org/name") import through huggingface_hub, offline only: a folder
laid out like the Hub cache resolves with HF_HUB_OFFLINE=1, neither a cache nor a network is one
line naming the id and the fix, and a local folder stays a folder."""

import os

import jax
import numpy as np
import pytest

import specjax
from specjax.convert.hf import export_checkpoint
from specjax.io.checkpoint import load_params
from tests.conftest import model_workdir, run_script

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

HUB_ID = "someone/tiny-llama"
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(tmp_path, tiny_params, tiny_cfg, monkeypatch):
    """A Hub cache (HF_HUB_CACHE) holding HUB_ID's snapshot at main, and this process's
    huggingface_hub offline and reading it (the library reads both variables at import)."""
    from huggingface_hub import constants

    repo = tmp_path / "cache" / f"models--{HUB_ID.replace('/', '--')}"
    export_checkpoint(model_workdir(str(tmp_path / "source"), tiny_params, tiny_cfg),
                      str(repo / "snapshots" / REVISION))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "cache"


def _same_weights(workdir: str, params) -> bool:
    imported = load_params(workdir)[0]
    return all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(imported),
                                                    jax.tree.leaves(params), strict=True))


def test_a_hub_id_in_the_cache_imports_offline(hub, tmp_path, tiny_params):
    """Catches a Hub id read as a local path ("does not exist") by the API or by convert.py's
    --hf_id, and a download that ignores the cache (offline, nothing could be fetched): each
    import holds the snapshot's weights."""
    workdir = str(tmp_path / "w")
    model = specjax.import_hf(HUB_ID, workdir)
    assert model.config.num_layers == 4 and _same_weights(workdir, tiny_params)
    result = run_script("infer/convert.py", "--hf_id", HUB_ID, "--workdir", str(tmp_path / "c"),
                        env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert _same_weights(str(tmp_path / "c"), tiny_params)


def test_a_local_folder_named_like_an_id_stays_a_folder(hub, tmp_path, tiny_params, tiny_cfg,
                                                        monkeypatch):
    """Catches a string that is an existing folder sent to the Hub (here the cache holds
    another model of that id: the local folder's weights must be the ones imported)."""
    monkeypatch.chdir(tmp_path)
    other = jax.tree.map(lambda a: a + 1, tiny_params)
    export_checkpoint(model_workdir(str(tmp_path / "other"), other, tiny_cfg), HUB_ID)
    specjax.import_hf(HUB_ID, "w")
    assert _same_weights("w", other)


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"},
                                 {"HF_ENDPOINT": "http://127.0.0.1:9"}],  # nothing listens
                         ids=["offline", "no-network"])
def test_a_hub_id_without_cache_or_network_is_one_line(tmp_path, env):
    """Catches huggingface_hub's own multi-line error (or a traceback) reaching the user, and
    an error that names neither the id nor what to do, offline and with the Hub unreachable;
    no workdir is left."""
    result = run_script("infer/convert.py", "--hf_id", HUB_ID, "--workdir", str(tmp_path / "w"),
                        env={**env, "HF_HUB_CACHE": str(tmp_path / "empty")})
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: '{HUB_ID}' is not a local folder, and the Hugging "
                                    "Face Hub cannot give it here (")
    assert "run where the network is" in result.stderr and f"hf download {HUB_ID}" in \
        result.stderr
    assert not os.path.exists(tmp_path / "w")
