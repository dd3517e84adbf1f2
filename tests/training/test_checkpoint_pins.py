"""A workdir whose checkpoints folder holds no checkpoint, refused in one line by each reader
(issue 52's scan: raise sites no test triggered; a workdir with no checkpoints folder at all
is tested in test_training.py)."""

import pytest

from specjax.io.checkpoint import Checkpointer, CheckpointError, load_model_config, load_params


@pytest.mark.parametrize("read", [
    lambda workdir: load_params(workdir), lambda workdir: load_model_config(workdir),
    lambda workdir: Checkpointer(workdir).read_meta()], ids=["params", "config", "meta"])
def test_an_empty_checkpoints_folder_is_no_checkpoint(tmp_path, read):
    """A training interrupted before its first save leaves checkpoints/ empty. Catches the
    check dropped: zip over no candidates and a raw IndexError, or orbax restoring step None."""
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match="^no checkpoint found in .*checkpoints$"):
        read(str(tmp_path))
