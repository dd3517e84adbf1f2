"""GGUF import pinned where the fresh audit's plants got past tests/test_gguf.py: metadata
every test file wrote with Llama-2's default value, and the EOS the workdir's own
generation_config.json ends at (read by transformers, against the gguf package's reader),
and a partial-rotary file refused rather than imported as fully rotated."""

import jax
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specjax import model as M  # noqa: E402
from specjax.convert.gguf import GgufCheckpoint  # noqa: E402
from specjax.convert.hf import import_checkpoint  # noqa: E402
from specjax.convert.hf_config import ConversionError  # noqa: E402
from specjax.io.checkpoint import load_params  # noqa: E402
from tests.convert import test_gguf  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_rope_base_is_read_from_the_file(tmp_path, monkeypatch):
    """Catches `llama.rope.freq_base` ignored (the base fixed at Llama-2's 10,000, where
    SmolLM2's is 100,000 and Llama-3's 500,000): a file written with a base of 500,000 imports
    with that rope_theta, and its logits over 11 positions equal transformers' on the model it
    was written from (the base changes every position after the first)."""
    monkeypatch.setitem(test_gguf.SIZES, "rope_theta", 500000.0)
    hf_model = test_gguf.hf_llama(initializer_range=0.2)
    path = tmp_path / "theta.gguf"
    test_gguf.write_gguf(path, hf_model, {})
    assert GgufCheckpoint(str(path)).hf_config()["rope_theta"] == 500000.0
    tokens = np.random.default_rng(0).integers(0, test_gguf.SIZES["vocab_size"], (2, 11))
    with torch.no_grad():
        expected = hf_model(torch.tensor(tokens)).logits.numpy()
    cfg = import_checkpoint(str(path), str(tmp_path / "w"))
    assert cfg.rope_theta == 500000.0
    params, _, _ = load_params(str(tmp_path / "w"))
    logits = jax.jit(M.forward, static_argnames="cfg")(params, cfg, tokens)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=2e-4)


def test_the_imported_generation_config_ends_at_the_files_eos(tmp_path):
    """The workdir's generation_config.json (what transformers' `generate` reads from the
    folder) ends generations at the GGUF's `tokenizer.ggml.eos_token_id`, read here with the
    gguf package's own reader. Catches the import's stop ids left empty: specjax itself falls
    back to config.json's EOS, but transformers on the workdir's files never stops at EOS."""
    path = tmp_path / "t.gguf"
    test_gguf.write_gguf(path, test_gguf.hf_llama(), {})
    field = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.eos_token_id"]
    eos = int(field.contents())
    import_checkpoint(str(path), str(tmp_path / "w"))
    generation = transformers.GenerationConfig.from_pretrained(str(tmp_path / "w"))
    assert generation.eos_token_id == eos == 2


def test_rope_over_part_of_each_head_is_refused_in_one_line(tmp_path):
    """A GGUF whose `llama.rope.dimension_count` (8) is less than its head width (16: 64 wide,
    4 heads), as llama.cpp writes a partial-rotary model, is a one-line error naming both, and
    nothing is written. Catches the check dropped: the file imported with every dimension
    rotated, its logits silently unlike the model it was written from."""
    path = tmp_path / "partial.gguf"
    test_gguf.write_gguf(path, test_gguf.hf_llama(), {}, uints={"llama.rope.dimension_count": 8})
    assert gguf.GGUFReader(str(path)).fields["llama.rope.dimension_count"].contents() == 8
    with pytest.raises(ConversionError, match=r"RoPE over 8 of 16 head dimensions is not "
                                              r"supported") as caught:
        import_checkpoint(str(path), str(tmp_path / "w"))
    assert "\n" not in str(caught.value) and not (tmp_path / "w").exists()
