"""Hugging Face Hub ids ("HuggingFaceTB/SmolLM2-135M") as local checkpoint folders, through
`huggingface_hub.snapshot_download`: its cache first (`HF_HUB_CACHE`), the Hub where the network
is (`HF_HUB_OFFLINE=1`: the cache only), the files specjax reads and nothing else."""

from __future__ import annotations

import os
import re

from specjax.convert.hf_config import ConversionError

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # namespace/name
# config.json, the safetensors and their index, the tokenizer's and generation settings, the
# chat template; never the pickled or GGUF copies a repository may also hold.
FILES = ["*.json", "*.safetensors", "*.jinja"]


def checkpoint_folder(source: str) -> str:
    """The folder of the checkpoint `source` names: an existing path as it is (a local folder
    stays a folder), a Hub id ("org/name") downloaded, or found in the cache. A one-line
    error naming the id and the fix when it cannot be had (no network and not cached, no such
    repository, a gated one without a login)."""
    if os.path.exists(source) or not HUB_ID.fullmatch(source):
        return source
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        return snapshot_download(source, allow_patterns=FILES)
    except RepositoryNotFoundError:
        raise ConversionError(
            f"{source!r} is not a local folder, and the Hugging Face Hub has no model of that "
            "id that this machine may read (check the spelling; a gated or private model needs "
            "`hf auth login` and its licence accepted)") from None
    except Exception as error:  # not cached and no network (or HF_HUB_OFFLINE=1), a partial copy
        raise ConversionError(
            f"{source!r} is not a local folder, and the Hugging Face Hub cannot give it here "
            f"({type(error).__name__}): run where the network is (once: it is cached in "
            "HF_HUB_CACHE), or download it elsewhere (`hf download "
            f"{source}`) and give its folder") from None
