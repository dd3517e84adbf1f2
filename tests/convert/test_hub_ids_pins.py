"""Hub ids pinned where the fresh audit's plants got past tests/test_hub_ids.py: an existing
file whose relative path reads like "org/name"."""

import pytest

from specjax.convert.hub import checkpoint_folder


@pytest.mark.parametrize("name", ["models/smollm2.gguf", "org/name"])
def test_an_existing_file_named_like_an_id_is_not_sent_to_the_hub(name, tmp_path, monkeypatch):
    """A GGUF file (or any file) at a relative path such as "models/smollm2.gguf" is a local
    checkpoint: it comes back as given, the Hub never asked. Catches only folders kept local
    (`isdir`): `import_hf("models/smollm2.gguf")` would try a download of a repository of that
    name, then fail about the Hub, or import another model."""
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("sent to the Hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).parent.mkdir()
    (tmp_path / name).write_bytes(b"GGUF")
    assert checkpoint_folder(name) == name
