"""Drafting over part of the vocabulary (`decoding.draft_vocab`, `heads.vocab_subset`): greedy
output identical to the independent per-step reference for every drafter with a vocabulary
head, a subset that is the whole vocabulary drafting exactly what the full head drafts, the
draft head a product with N rows, the ranking (`io.draft_vocab`) and its command."""

import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.drafters.calm import CalmDraft
from specjax.decoding.drafters.calm_exit import EarlyExit
from specjax.decoding.drafters.eagle import Eagle
from specjax.decoding.drafters.kangaroo import Kangaroo
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.drafters.medusa import Medusa
from specjax.decoding.drafters.mixed import Mixed
from specjax.decoding.drafters.mtp import Mtp
from specjax.decoding.drafters.ngram import PromptLookup
from specjax.decoding.drafters.skip import SkipLayers
from specjax.decoding.drafters.specdec import SpecDecHead
from specjax.decoding.engine import Generator
from specjax.decoding.registry import DecodingConfig, make_strategy, require_used
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.heads.eagle import EAGLE
from specjax.heads.kangaroo import init_adapter
from specjax.heads.medusa import init_medusa
from specjax.heads.mtp import MTP
from specjax.heads.specdec import init_acceptance_head
from specjax.heads.vocab_subset import DraftVocab, exit_head_logits
from specjax.io.checkpoint import (
    Checkpointer,
    CheckpointError,
    load_model_config,
    load_params,
)
from specjax.io.draft_vocab import rank_ids, read_ranking, within, write_ranking
from tests.support.decoding import export_decode_loop, per_step_argmax
from tests.support.models import TINY_MODEL, damped_params, noisy
from tests.support.scripts import run_script

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 59))]
NEW = 16
RANKING = np.random.default_rng(0).permutation(CFG.vocab_size)  # a ranking unrelated to the text


@pytest.fixture(scope="module")
def params():
    return damped_params(CFG, jax.random.PRNGKey(0), 0.5)


@pytest.fixture(scope="module")
def generator(params):
    """The model with a Kangaroo adapter and a SpecDec++ head at exit 1, fresh EAGLE-3, MTP and
    Medusa heads (plus noise), and the random ranking."""
    return Generator(params, CFG, draft_vocab=RANKING, draft_weights={
        "kangaroo": DraftWeights(noisy(init_adapter(params, CFG, 1), 0.1), exit_layer=1),
        "specdec": DraftWeights(init_acceptance_head(CFG, 8, jax.random.PRNGKey(5)),
                                exit_layer=1),
        "medusa": DraftWeights(noisy(init_medusa(params, CFG, 2), 0.05),
                               exit_layer=CFG.num_layers, settings={"num_heads": 2}),
        **{kind.name: DraftWeights(noisy(kind.init(params, CFG, settings), 0.05),
                                   settings={"exits": kind.exits(CFG, settings)})
           for kind, settings in ((EAGLE, {"layers": "1,2,3"}), (MTP, {"depth": 2}))}})


@pytest.fixture(scope="module")
def reference(generator):
    return per_step_argmax(generator, PROMPTS, NEW)


N = 24  # of 259 ids: most of the target's tokens lie outside the subset

DRAFTERS = {
    "selfspec-chain": SelfSpeculative(1, Chain(3), draft_vocab=N),
    "selfspec-tree": SelfSpeculative(2, StaticTree.from_branching((2, 1)), draft_vocab=N),
    "selfspec-dynamic": SelfSpeculative(1, DynamicTree(5, 2, 3),
                                        draft_vocab=N),
    "skip": SkipLayers((1, 2), Chain(3), draft_vocab=N),
    "kangaroo": Kangaroo(1, Chain(3), draft_vocab=N),
    "specdec": SpecDecHead(1, DynamicTree(5, 2, 3), draft_vocab=N),
    "calmdraft": CalmDraft(EarlyExit((1, 2)), 0.4, 4.0, Chain(3), draft_vocab=N),
    "eagle": Eagle(Chain(3), draft_vocab=N),
    "mtp": Mtp(StaticTree.from_branching((2, 1)), draft_vocab=N),
    "medusa": Medusa(StaticTree.from_branching((2, 1)), draft_vocab=N),
    "mixed": Mixed((Eagle(Chain(2), draft_vocab=N), PromptLookup(shape=Chain(2)))),
}


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_greedy_over_a_subset_is_the_per_step_argmax(generator, reference, name):
    """Every drafter with a vocabulary head, drafting over 24 of 259 ids (most of the target's
    greedy tokens outside them), emits the independent reference's tokens. Catches a draft
    token that is the subset's index rather than its id (the scatter left out), and an
    acceptance that trusts a draft outside the subset."""
    outside = {t for row in reference for t in row} - set(RANKING[:N].tolist())
    assert outside, "the test needs target tokens outside the subset"
    out = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=DRAFTERS[name])
    assert out.tokens == reference


@pytest.mark.parametrize("strategy", [SelfSpeculative(1, Chain(3)), Eagle(Chain(3)),
                                      Kangaroo(1, StaticTree.from_branching((2, 1))),
                                      Medusa(Chain(2)),
                                      CalmDraft(EarlyExit((1, 2)), 0.4, 4.0, Chain(3))],
                         ids=lambda s: s.name)
def test_a_subset_of_every_id_drafts_what_the_full_head_drafts(generator, strategy):
    """draft_vocab = V over a shuffled ranking: the same proposals, so the same acceptance
    counts and rounds, as the full head. Catches the scores placed back at other ids than the
    rows were gathered from (unsorted ids, an off-by-one), which greedy output cannot see:
    only the drafts, and so tau, change; for calmdraft also a confidence read from other
    scores than the exit's (its exits, and so its drafts, would move)."""
    import dataclasses

    full = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=strategy).total
    whole = dataclasses.replace(strategy, draft_vocab=CFG.vocab_size)
    subset = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=whole).total
    assert (subset.rounds, subset.accepted, subset.drafted) == \
        (full.rounds, full.accepted, full.drafted)


def test_the_draft_head_is_a_product_with_n_rows(params):
    """The shared head over a subset multiplies by an [N, D] matrix gathered before, and by no
    [V, D] one. Catches a mask over the full head's logits (the same drafts, none of the
    saving)."""
    ids = jnp.asarray(np.sort(RANKING[:N]), jnp.int32)
    vocab = DraftVocab.gather(params, CFG, ids)
    hidden = jnp.ones((1, 3, CFG.d_model), CFG.compute_dtype)
    jaxpr = str(jax.make_jaxpr(lambda v, h: exit_head_logits(params, CFG, h, v))(vocab, hidden))
    # every product's output, nested jaxprs included (XLA's dot and the CPU kernel's call)
    products = re.findall(r"f32\[([\d,]+)\] = (?:dot_general|ffi_call)", jaxpr)
    assert products and {shape.split(",")[-1] for shape in products} == {str(N)}, products
    logits = exit_head_logits(params, CFG, hidden, vocab)
    full = exit_head_logits(params, CFG, hidden, None)
    np.testing.assert_allclose(logits[..., ids], full[..., ids], rtol=1e-5, atol=1e-5)
    assert logits.shape[-1] == CFG.vocab_size and float(jnp.max(
        jnp.delete(logits, ids, axis=-1))) < -1e8


def test_calms_exit_heads_are_products_with_n_rows(params):
    """CALM's early exit drafting over a subset scores its candidate exits with the [N, D] rows
    and never with the [V, D] table, and its confidence is the top-two margin of the softmax
    over the subset's scores (the reference: numpy over the full head's exit logits at the
    ids). Catches calm_exit reading the full head (`model.exit_logits`) whatever the subset:
    the same drafts, none of the saving, and a confidence over every id."""
    from specjax.decoding.shapes.tree import chain_layout
    from specjax.model import allocate_cache, unstack_layers

    ids = jnp.asarray(np.sort(RANKING[:N]), jnp.int32)
    vocab, layered = DraftVocab.gather(params, CFG, ids), unstack_layers(params, CFG)
    tokens = jnp.asarray([[3, 9, 27]], jnp.int32)
    layout = chain_layout(jnp.zeros((1,), jnp.int32), 3, 8)

    def run(v):  # threshold 2, never reached: every token leaves at the last candidate
        return EarlyExit((1, 2)).run(layered, CFG, {}, allocate_cache(CFG, 1, 8), tokens,
                                     layout, jnp.full((1, 3), 2.0), draft=True, vocab=v)[0]

    jaxpr = str(jax.make_jaxpr(run)(vocab))
    products = {shape.split(",")[-1] for shape in
                re.findall(r"f32\[([\d,]+)\] = (?:dot_general|ffi_call)", jaxpr)}
    assert str(N) in products and str(CFG.vocab_size) not in products, products
    full = np.asarray(run(None).logits, np.float64)[..., np.asarray(ids)]
    probs = np.sort(np.exp(full) / np.exp(full).sum(-1, keepdims=True), axis=-1)
    np.testing.assert_allclose(run(vocab).confidence, probs[..., -1] - probs[..., -2],
                               rtol=1e-4, atol=1e-5)


def test_calm_refuses_a_draft_vocabulary_the_user_sets():
    """`calm`'s exit logits are its output (unverified): --draft_vocab with it is one line, and
    calmdraft reads it. Catches calm declaring the option (its tokens then drawn from a subset,
    silently changing its output)."""
    options = [DecodingConfig(draft_vocab=N)]
    with pytest.raises(ValueError, match=r"^--draft_vocab is not used by strategy calm "):
        require_used(["calm"], options, ["draft_vocab"])
    require_used(["calmdraft"], options, ["draft_vocab"])


@pytest.mark.parametrize("name", ["selfspec-chain", "eagle"])
def test_the_loop_over_a_subset_exports_for_tpu_and_gpu(generator, name):
    """The decode loop drafting over N ids lowers for TPU and CUDA from shapes alone. Catches
    the rows gathered on the host (a numpy gather of traced ids) or a shape that depends on
    the ids' values."""
    strategy, draft_params = generator.with_weights(DRAFTERS[name], None)
    export_decode_loop(generator.params, draft_params, CFG, strategy, draft_ids=N)


def test_eagles_own_head_is_cut_to_the_subset(params):
    """EAGLE-3's `lm_head` columns and `vocab_bias` are gathered at the ids once
    (`restrict_vocab`), and its draft logits there equal the full head's. Catches rows taken
    from the target's head instead of the EAGLE head's own."""
    head = noisy(EAGLE.init(params, CFG, {"layers": "1,2,3"}), 0.05)
    ids = jnp.asarray(np.sort(RANKING[:N]), jnp.int32)
    vocab = DraftVocab.gather(params, CFG, ids)
    cut = Eagle(Chain(2)).restrict_vocab(head, ids)
    assert cut["lm_head"].shape == (CFG.d_model, N)
    features = jax.random.normal(jax.random.PRNGKey(1), (2, CFG.d_model))
    np.testing.assert_allclose(EAGLE.logits(params, cut, CFG, features, vocab)[:, ids],
                               EAGLE.logits(params, head, CFG, features)[:, ids], rtol=1e-5,
                               atol=1e-5)


def test_the_option_reaches_every_vocabulary_head_and_is_checked():
    """--draft_vocab sets N on the drafters with a vocabulary head (through the registry) and
    on no other, and shows in its label; a value above the vocabulary is one line. Catches a
    strategy whose option group is declared but whose drafter never receives N, and a bench
    sweep over --draft_vocab 0,N that keeps one row (the labels equal)."""
    options = DecodingConfig(draft_vocab=N, mix="eagle,ngram")
    for name in ("selfspec", "kangaroo", "specdec", "calmdraft", "eagle", "mtp", "medusa"):
        assert make_strategy(name, options).draft_vocab == N
    assert make_strategy("mixed", options).draft_vocab == N
    assert not hasattr(make_strategy("ngram", options), "draft_vocab")
    labels = {make_strategy("eagle", DecodingConfig(draft_vocab=n)).label() for n in (0, N)}
    assert len(labels) == 2  # the bench's sweep keys rows by label: none may collapse
    with pytest.raises(ValueError, match=r"^decoding.draft_vocab=300 must lie in \[0, "):
        DecodingConfig(draft_vocab=300).check(CFG)


def test_a_subset_without_a_ranking_or_beyond_it_is_one_line(params):
    """Catches a subset silently drafted over the first N ids when the workdir ranks none, and
    an N past the ranking read out of bounds."""
    bare = Generator(params, CFG)
    with pytest.raises(ValueError, match="needs a ranking of the vocabulary: make one with "
                                         "infer/draft_vocab.py"):
        bare.generate(PROMPTS[:1], max_new_tokens=2, strategy=DRAFTERS["selfspec-chain"])
    short = Generator(params, CFG, draft_vocab=RANKING[:10])
    with pytest.raises(ValueError, match="draft_vocab=24 exceeds the 10 ids ranked"):
        short.generate(PROMPTS[:1], max_new_tokens=2, strategy=DRAFTERS["selfspec-chain"])


def test_rank_ids_orders_by_count_then_id():
    """The ranking by hand: most frequent first, ties and unseen ids by ascending id. Catches
    an ascending sort (the rarest first) and ties left in arbitrary order."""
    ranking = rank_ids([[5, 5, 2, 7], [7, 5, 1]], vocab_size=9, size=6)
    assert ranking.tolist() == [5, 7, 1, 2, 0, 3]


def test_within_ranks_a_heads_ids_as_the_ranking_does_then_by_id():
    """An EAGLE-3 head's ids [9, 2, 5, 7] within the partial ranking [5, 1, 9]: 5 and 9 in its
    order, then 2 and 7 by id; with no ranking, by id. Catches the ids the ranking lacks
    dropped (the head's draft vocabulary cut below its d2t) and ranked ids the head cannot
    draft (1) admitted."""
    assert within(np.array([5, 1, 9]), np.array([9, 2, 5, 7])).tolist() == [5, 9, 2, 7]
    assert within(None, np.array([9, 2, 5])).tolist() == [2, 5, 9]


@pytest.mark.parametrize("content,problem", [
    ("{not json", "is unreadable"), ('{"ids": [1, 1]}', "distinct ids"),
    ('{"ids": [3, 400]}', "distinct ids in \\[0, 259\\)"), ('{"idz": [1]}', "is unreadable"),
    ('{"ids": [3, -1]}', "distinct ids in \\[0, 259\\)")])
def test_a_broken_ranking_is_one_line_naming_the_file(tmp_path, content, problem):
    """Catches a ranking read whole though it is not JSON, lacks its ids, lists one twice, or
    names an id outside [0, V): past it, or negative (the lower bound left out: numpy would
    gather id -1 as the head's last row)."""
    (tmp_path / "draft_vocab.json").write_text(content)
    with pytest.raises(ValueError, match=problem) as error:
        read_ranking(str(tmp_path), CFG.vocab_size)
    assert "draft_vocab.json" in str(error.value) and "\n" not in str(error.value)
    write_ranking(str(tmp_path), np.array([4, 2]), {"source": "x"})
    assert read_ranking(str(tmp_path), CFG.vocab_size).tolist() == [4, 2]


def test_a_ranking_naming_the_vocabulary_size_is_refused(tmp_path):
    """An id equal to the vocabulary size (259 of ids 0..258) is outside it: one line, and 258
    is accepted. Catches an upper bound checked with > instead of >= (id V read past the
    head's last row)."""
    (tmp_path / "draft_vocab.json").write_text('{"ids": [1, 259]}')
    with pytest.raises(ValueError, match=r"distinct ids in \[0, 259\)"):
        read_ranking(str(tmp_path), CFG.vocab_size)
    (tmp_path / "draft_vocab.json").write_text('{"ids": [1, 258]}')
    assert read_ranking(str(tmp_path), CFG.vocab_size).tolist() == [1, 258]


def test_an_untied_model_drafts_with_its_unembedding_rows():
    """With tie_embeddings=False the subset's rows are the unembedding's columns at the ids
    (the reference: `unembed.T[ids]`, not the input embedding), and the subset's logits there
    equal the full head's. Catches rows gathered from `embed` whatever the tying."""
    cfg = ModelConfig(**{**TINY_MODEL, "tie_embeddings": False})
    untied = damped_params(cfg, jax.random.PRNGKey(2), 0.5)
    assert not np.allclose(untied["embed"], untied["unembed"].T)
    ids = jnp.asarray(np.sort(RANKING[:N]), jnp.int32)
    vocab = DraftVocab.gather(untied, cfg, ids)
    np.testing.assert_array_equal(
        vocab.rows, np.asarray(untied["unembed"]).T[np.asarray(ids)].astype(vocab.rows.dtype))
    hidden = jax.random.normal(jax.random.PRNGKey(4), (2, 3, cfg.d_model))
    np.testing.assert_allclose(exit_head_logits(untied, cfg, hidden, vocab)[..., ids],
                               exit_head_logits(untied, cfg, hidden, None)[..., ids],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_command_ranks_a_text_and_makes_it_the_default(trained_workdir, tmp_path):
    """infer/draft_vocab.py counts the ids of a text, stores the ranking in the workdir and N as
    its decoding default, which the loaded model then drafts with (its output the model's);
    --max_tokens 40 counts exactly 40 of the 81 tokens (27 then 13 of the second text). Catches
    a ranking written but not used by default, a text counted whole past --max_tokens, and
    --size 259, the whole vocabulary, refused (the bound checked with >=)."""
    texts = tmp_path / "texts.jsonl"
    texts.write_text("\n".join(json.dumps({"text": "def f(x):\n    return x + 1\n"})
                               for _ in range(3)))
    whole = run_script("infer/draft_vocab.py", "--workdir", trained_workdir, "--size", "259",
                       "--texts_file", str(texts))
    assert whole.returncode == 0, whole.stderr
    ranked = json.load(open(os.path.join(trained_workdir, "draft_vocab.json")))["ids"]
    assert sorted(ranked) == list(range(259))  # --size V: every id, once
    done = run_script("infer/draft_vocab.py", "--workdir", trained_workdir, "--size", "12",
                      "--texts_file", str(texts), "--max_tokens", "40")
    assert done.returncode == 0, done.stderr
    stored = json.load(open(os.path.join(trained_workdir, "draft_vocab.json")))
    assert len(stored["ids"]) == 12 and stored["source"]["tokens"] == 40
    assert set(stored["ids"]) <= set(b"def f(x):\n    return x + 1\n")
    calibrated = json.load(open(os.path.join(trained_workdir, "calibrated_decoding.json")))
    assert calibrated["decoding"]["draft_vocab"] == 12
    model = specjax.load(trained_workdir)
    plain = model.generate(["def f("], strategy="ar", max_new_tokens=12)
    drafted = model.generate(["def f("], strategy="selfspec", exit_layer=1, max_new_tokens=12)
    assert model.strategy("selfspec").draft_vocab == 12
    assert [c.text for c in drafted] == [c.text for c in plain]
    refused = run_script("infer/draft_vocab.py", "--workdir", trained_workdir, "--size", "999")
    assert refused.returncode == 1 and refused.stderr.strip().endswith(
        "--size=999 exceeds the model's 259 ids")


def test_the_loop_drafts_over_the_rankings_first_n_ids_ascending(generator):
    """The ids handed to the loop are the ranking's first N in ascending order (the reference:
    Python's `sorted`), since `DraftVocab.expand` scatters with `indices_are_sorted=True`.
    Catches the sort dropped from `Generator.draft_ids`: XLA:CPU happens to scatter unsorted
    ids correctly, so no greedy or tau test sees it, but the hint makes it undefined on GPU
    and TPU."""
    ids = generator.draft_ids(DRAFTERS["selfspec-chain"])
    assert ids.tolist() == sorted(RANKING[:N].tolist())


def test_the_subsets_rows_are_gathered_in_the_compute_dtype():
    """With float32 weights and a bfloat16 compute dtype the gathered rows are bfloat16, the
    weights' rows cast (the reference: numpy's gather then cast). Catches the cast left out:
    the draft head's product then reads float32 rows, twice the bytes the subset saves."""
    cfg = ModelConfig(**{**TINY_MODEL, "dtype": "bfloat16"})
    weights = damped_params(cfg, jax.random.PRNGKey(0), 0.5)
    assert weights["embed"].dtype == jnp.float32
    ids = np.sort(RANKING[:N])
    vocab = DraftVocab.gather(weights, cfg, jnp.asarray(ids, jnp.int32))
    assert vocab.rows.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(vocab.rows, np.float32), np.asarray(
        np.asarray(weights["embed"])[ids].astype(jnp.bfloat16), np.float32))


def test_a_subset_as_large_as_the_vocabulary_is_accepted_and_one_more_refused():
    """--draft_vocab V (every id, the bound of the option's [0, V]) passes the check, V + 1 is
    one line. Catches the bound checked with < (the whole vocabulary refused, while
    `infer/draft_vocab.py --size V` ranks it)."""
    DecodingConfig(draft_vocab=CFG.vocab_size).check(CFG)
    with pytest.raises(ValueError, match=rf"^decoding.draft_vocab={CFG.vocab_size + 1} must "
                                         r"lie in \[0, vocab_size = 259\]"):
        DecodingConfig(draft_vocab=CFG.vocab_size + 1).check(CFG)


def test_the_config_reader_refuses_a_heads_workdir_as_load_params_does(tmp_path):
    """`load_model_config` (what infer/draft_vocab.py reads, weights left unread) returns a
    model checkpoint's config, and refuses a head's checkpoint (its metadata names a base
    model) with `load_params`' one line. Catches the refusal left out: a head's workdir
    ranked as if it were a model, its ranking then read by no drafter."""
    cfg = ModelConfig(**TINY_MODEL)
    for name, extra in (("model", {}), ("head", {"base": {"workdir": "runs/base"},
                                                 "objective": "eagle"})):
        checkpoints = Checkpointer(str(tmp_path / name))
        checkpoints.save(3, {"w": np.zeros(2, np.float32)}, None,
                         {"model": cfg.to_dict(), **extra})
        checkpoints.close()
    assert load_model_config(str(tmp_path / "model"))[0] == cfg
    for read in (load_model_config, load_params):
        with pytest.raises(CheckpointError, match=r"holds a eagle run, not a model \(a head on "
                                                  r"the model in runs/base\)$"):
            read(str(tmp_path / "head"))
