"""Hugging Face Hub ids ("org/name") import through huggingface_hub, offline only: a folder
laid out like the Hub cache resolves with HF_HUB_OFFLINE=1, neither a cache nor a network is one
line naming the id and the fix, and a local folder stays a folder."""

import os

import jax
import numpy as np
import pytest

import specjax
from specjax.convert.hf import export_checkpoint
from specjax.convert.hub import checkpoint_folder
from specjax.io.checkpoint import load_params
from tests.support.models import model_workdir
from tests.support.scripts import run_script

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
    result = run_script("tools/convert.py", "--hf_id", HUB_ID, "--workdir", str(tmp_path / "c"),
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
    result = run_script("tools/convert.py", "--hf_id", HUB_ID, "--workdir", str(tmp_path / "w"),
                        env={**env, "HF_HUB_CACHE": str(tmp_path / "empty")})
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: '{HUB_ID}' is not a local folder, and the Hugging "
                                    "Face Hub cannot give it here (")
    assert "run where the network is" in result.stderr and f"hf download {HUB_ID}" in \
        result.stderr
    assert not os.path.exists(tmp_path / "w")


@pytest.mark.parametrize("source", ["runs/tiny/hf", "./org/name", "org/name/", "/abs/org"])
def test_a_missing_path_that_is_no_hub_id_is_not_sent_to_the_hub(source, monkeypatch):
    """Catches a missing local path that merely starts like "org/name" (a deeper folder, a
    trailing slash, ./ or /) sent to the Hub (a download attempt, then an error about the Hub
    for a typo in a path): it comes back as given, for the import to name the missing folder."""
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("sent to the Hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    assert checkpoint_folder(source) == source


def test_a_hub_download_asks_for_every_file_specjax_reads(tmp_path, monkeypatch):
    """Catches a Hub download that leaves out a file the import reads (the chat template in
    chat_template.jinja: the imported model would refuse chat prompts) or fetches copies it
    never reads (.bin, .gguf): a stand-in Hub copies a repository's files as
    huggingface_hub does, those matching `allow_patterns` (fnmatch), and the import keeps
    the template."""
    pytest.importorskip("transformers")
    import fnmatch
    import shutil

    import huggingface_hub

    from tests.convert.test_tokenizer_conventions import checkpoint

    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    repo = checkpoint(tmp_path / "repo", bos=False)
    (tmp_path / "repo" / "chat_template.jinja").write_text(template)
    (tmp_path / "repo" / "pytorch_model.bin").write_bytes(b"pickle")
    (tmp_path / "repo" / "model.gguf").write_bytes(b"gguf")

    def snapshot_download(repo_id, allow_patterns):
        out = tmp_path / "snapshot"
        out.mkdir()
        for name in os.listdir(repo):
            if any(fnmatch.fnmatch(name, p) for p in allow_patterns):
                shutil.copy(os.path.join(repo, name), out / name)
        return str(out)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.chdir(tmp_path)
    model = specjax.import_hf("someone/chat-model", str(tmp_path / "w"))
    assert model.tokenizer.chat_template == template
    assert sorted(os.listdir(tmp_path / "snapshot")) == sorted(
        n for n in os.listdir(repo) if n not in ("pytorch_model.bin", "model.gguf"))
