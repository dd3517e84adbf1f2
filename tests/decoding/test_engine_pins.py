"""The Generator pinned where the fresh audits' plants got past the suite: prompt ids at the
vocabulary's edge, the acceptance-by-depth count, a failing stream's error and the EOS ids'
limit, by hand; and the batch and streaming refusals issue 52's scan found untriggered."""

import jax
import pytest

from specjax.config import ModelConfig
from specjax.decoding import engine
from specjax.decoding.engine import Generator, acceptance_by_depth
from specjax.model import init_params
from specjax.sharding import MeshConfig, make_mesh

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


def test_acceptance_by_depth_counts_rounds_reaching_each_depth_by_hand():
    """Rounds that kept 0, 1 and 3 drafts: depth 1 is reached by 2 of 3, depths 2 and 3 by 1
    of 3; a depth past the deepest is 0. Catches the count taken as `run > d` (a round that
    kept exactly d drafts not counted as reaching d)."""
    assert acceptance_by_depth([0, 1, 3]) == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert acceptance_by_depth([0, 1, 3], 4) == pytest.approx([2 / 3, 1 / 3, 1 / 3, 0.0])
    assert acceptance_by_depth([]) == []


def test_an_error_inside_the_streams_decoding_thread_reaches_the_caller(monkeypatch):
    """A failure inside the decode thread (after the inputs were checked: here the loop
    itself raises) is raised in the caller's thread once the stream ends. Catches the error
    swallowed, the stream ending as if the rows were done (the module's other test fails
    before the thread starts)."""
    def failing(*args, **kwargs):
        raise RuntimeError("the loop failed")

    monkeypatch.setattr(engine, "generate_tokens", failing)
    generator = Generator(init_params(CFG, jax.random.PRNGKey(0)), CFG)
    with pytest.raises(RuntimeError, match="^the loop failed$"):
        list(generator.stream([[1, 2]], max_new_tokens=2))


def test_up_to_eight_eos_ids_end_a_row_and_a_ninth_is_one_line():
    """`MAX_STOP_IDS` (8) ids fill the loop's EOS argument with no -1 padding; nine are a
    one-line error. Catches the bound taken as `>=` (a model whose generation_config lists
    eight EOS ids refused)."""
    assert engine.stop_ids(list(range(8))).tolist() == list(range(8))
    assert engine.stop_ids(3).tolist() == [3] + [-1] * 7
    with pytest.raises(ValueError, match=r"^9 EOS ids given; at most 8 end a row$"):
        engine.stop_ids(list(range(9)))


@pytest.mark.parametrize("prompts, message", [
    ([], "^no prompts given$"),
    ([[1, 2], []], "^prompt 1 is empty; every prompt needs at least one token$")])
def test_no_prompts_or_an_empty_one_is_refused(tiny_cfg, tiny_params, prompts, message):
    """Catches either check dropped: an empty batch reaching `max()` of nothing, or an empty
    prompt padded to a row whose "last token" is padding (the model continues from token 0)."""
    with pytest.raises(ValueError, match=message):
        Generator(tiny_params, tiny_cfg).generate(prompts, max_new_tokens=2)


def test_streaming_on_a_mesh_is_refused_before_decoding(tiny_cfg, tiny_params):
    """Catches the check dropped: a stream's host thread handed rounds laid out over a mesh
    (each process seeing its rows only), where generate is the mesh's path."""
    generator = Generator(tiny_params, tiny_cfg, mesh=make_mesh(MeshConfig(), jax.devices()[:1]))
    with pytest.raises(ValueError, match="^streaming runs on one device; decode on a mesh with "
                                         "generate$"):
        next(iter(generator.stream([[1, 2]], max_new_tokens=2)))
