"""A GGUF reader's refusals pinned by their messages on files of a few bytes written here
(issue 52's scan: raise sites no test triggered). Kept apart from test_gguf_pins.py, whose
imports build transformers models (marked slow): these read metadata only."""

import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from specjax.convert.gguf import GgufCheckpoint  # noqa: E402
from specjax.convert.hf_config import ConversionError  # noqa: E402


def _write(path, heads) -> str:
    """A Llama GGUF holding only its embeddings, with `heads` as its head count (a number, or
    a per-layer list as some llama.cpp conversions write)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.embedding_length", 16)
    if isinstance(heads, list):
        writer.add_array("llama.attention.head_count", heads)
    else:
        writer.add_uint32("llama.attention.head_count", heads)
    writer.add_uint32("llama.attention.head_count_kv", 2)
    writer.add_tensor("token_embd.weight", np.zeros((8, 16), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_per_layer_head_counts_are_refused(tmp_path):
    """Catches the check dropped: a list of head counts reaching `hidden // heads` (a raw
    TypeError) or, worse, one layer's count used for all."""
    with pytest.raises(ConversionError, match="per-layer head counts are not supported$"):
        GgufCheckpoint(_write(tmp_path / "p.gguf", [4, 2])).hf_config()


def test_a_tensor_the_file_lacks_is_named(tmp_path):
    """Catches the lookup unchecked: a KeyError naming a transformers tensor with no file in
    the message, where the file holds only the embeddings."""
    checkpoint = GgufCheckpoint(_write(tmp_path / "e.gguf", 4))
    assert checkpoint.get("model.embed_tokens.weight").shape == (8, 16)
    with pytest.raises(ConversionError, match=r"e\.gguf is missing tensor 'model\.norm\.weight'$"):
        checkpoint.get("model.norm.weight")


def test_without_the_gguf_package_the_install_line_is_given(tmp_path, monkeypatch):
    """Catches the optional import unguarded: a bare ModuleNotFoundError for a user who
    installed specjax without its [gguf] extra."""
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` then raises ImportError
    with pytest.raises(ConversionError, match="^reading a GGUF file needs the gguf package: pip "
                                              "install gguf"):
        GgufCheckpoint(str(tmp_path / "any.gguf"))
