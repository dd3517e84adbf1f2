"""The Generator's prompt checks pinned where the fresh audit's plant got past the suite: ids
at the vocabulary's edge, by hand."""

import jax
import pytest

from specjax.config import ModelConfig
from specjax.decoding.engine import Generator
from specjax.model import init_params

CFG = ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                  mlp_dim=64)


def test_a_prompt_id_equal_to_the_vocabulary_size_is_refused():
    """Ids run 0..vocab_size - 1: id 63 pads into the batch, id 64 is a one-line error naming
    the prompt. Catches the bound taken as `>` (id 64 accepted: the embedding gather clamps it
    to row 63 and the model silently reads another token)."""
    generator = Generator(init_params(CFG, jax.random.PRNGKey(0)), CFG)
    tokens, lengths = generator.pad([[1, 2], [CFG.vocab_size - 1]])
    assert tokens[1, 0] == CFG.vocab_size - 1 and lengths.tolist() == [2, 1]
    with pytest.raises(ValueError, match=r"^prompt 1 has token ids outside \[0, 64\)$"):
        generator.pad([[1, 2], [CFG.vocab_size]])
