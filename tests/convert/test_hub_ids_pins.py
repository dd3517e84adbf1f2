"""Hub ids pinned where the fresh audit's plants got past tests/test_hub_ids.py: an existing
file whose relative path reads like "org/name", and missing paths the Hub would refuse as ids
(huggingface_hub's own `validate_repo_id` the reference)."""

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


@pytest.mark.parametrize("name", ["../model", ".hidden/model", "-x/y", "runs/-tmp",
                                  "org/.cache"])
def test_a_missing_path_the_hub_would_refuse_as_an_id_stays_a_path(name, monkeypatch):
    """A missing path of two parts that the Hub itself refuses as a repository id (a part
    starting with "." or "-": `huggingface_hub.utils.validate_repo_id`, the reference) comes
    back as given, for the import to name the missing folder. Catches the id pattern loosened
    to any two parts of word characters, dots and dashes ("../model", a typo in a relative
    path, then sent to the Hub and reported as a Hub failure)."""
    import huggingface_hub
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    with pytest.raises(HFValidationError):
        validate_repo_id(name)

    def no_hub(*args, **kwargs):
        raise AssertionError("sent to the Hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    assert checkpoint_folder(name) == name
