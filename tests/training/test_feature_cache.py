"""The frozen model's hidden states cached per training window (`train.feature_cache`)."""

import json
import os

import jax
import numpy as np
import pytest

from specjax.io.checkpoint import abstract_tree
from specjax.training.feature_cache import FeatureCache, FeatureCacheError
from specjax.training.frozen_base import base_hidden, load_base
from specjax.training.trainer import Trainer
from tests.support.models import tiny_run

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

# Each objective's section on the tiny base (4 layers); distill is a draft model, not a head.
OBJECTIVES = {"eagle": {"layers": "1,2,3", "unroll": 2}, "medusa": {"num_heads": 2},
              "kangaroo": {"exit_layer": 1}, "specdec": {"exit_layer": 1, "width": 16},
              "calm": {"exits": (1, 2)}, "distill": None}
STEPS = 6  # 24 windows read from a corpus of fewer: the later ones come from the cache


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A corpus of a few windows (its train split under STEPS batches of 4), its token cache
    beside it."""
    folder = tmp_path_factory.mktemp("corpus")
    with open(folder / "docs.jsonl", "w", encoding="utf-8") as f:
        for i in range(40):  # the split hashes the path: 40 documents leave some out
            f.write(json.dumps({"text": f"x{i} = {i * i}\n"}) + "\n")
    return {"source": "files", "files": str(folder / "docs.jsonl"), "val_fraction": 0.3,
            "cache_dir": str(folder / "cache")}


@pytest.fixture(scope="module")
def base(corpus, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("base"))
    Trainer(tiny_run(model=dict(init_std=0.3), data=corpus,
                     train=dict(total_steps=2, warmup_steps=1, eval_every=2, save_every=2)),
            path).fit()
    return path


def run_config(base, corpus, name, **train):
    train = {"batch_size": 4, "total_steps": STEPS, "warmup_steps": 1, "eval_every": STEPS,
             "save_every": STEPS, "eval_batches": 1, "weight_decay": 0.0, **train}
    if name == "distill":
        run = tiny_run(model=dict(num_layers=2, exit_layers=(2,)), data=corpus, train=train)
        return {**run, "distill": {"teacher_workdir": base}}
    return {"base_workdir": base, name: dict(OBJECTIVES[name]), "train": train}


def fitted(config, workdir, **fit):
    trainer = Trainer(config, str(workdir))
    result = trainer.fit(**fit)
    return trainer, result


def assert_same_params(a: Trainer, b: Trainer):
    """The two runs' last checkpoints hold the same trained weights (float32 round-off
    apart)."""
    x, y = (t.checkpoints.restore(abstract_tree(jax.eval_shape(t.fresh_state).params))[0]
            for t in (a, b))
    for u, v in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_a_cached_run_trains_the_weights_an_uncached_one_does(base, corpus, tmp_path, name):
    """Catches a step fed the wrong states from the cache (another layer's, another window's:
    a row written at the wrong offset, the permuted batch order used as the window number),
    logits not recomputed exactly from the cached last state, and a cache that is never read
    (its first epoch fills it, the later ones must compute nothing)."""
    cache = str(tmp_path / "cache")
    cached, _ = fitted(run_config(base, corpus, name, feature_cache=cache), tmp_path / "cached")
    windows = len(cached.corpus.train)
    assert STEPS * 4 >= 2 * windows  # two epochs at least
    assert cached.features.computed == windows and cached.features.read > 0
    plain, _ = fitted(run_config(base, corpus, name), tmp_path / "plain")
    assert_same_params(cached, plain)


def test_another_drafter_on_the_same_base_reads_what_one_wrote(base, corpus, tmp_path):
    """Catches a cache keyed by the drafter (its workdir, its objective, its set of layers)
    rather than by what the states depend on: Medusa's last layer, filled by Kangaroo's run
    (layers 1 and 4), must be read, not computed again."""
    cache = str(tmp_path / "cache")
    fitted(run_config(base, corpus, "kangaroo", feature_cache=cache), tmp_path / "kangaroo")
    medusa, _ = fitted(run_config(base, corpus, "medusa", feature_cache=cache),
                       tmp_path / "medusa")
    assert medusa.features.computed == 0 and medusa.features.read == STEPS * 4


def test_an_interrupted_run_with_the_cache_resumes_exactly(base, corpus, tmp_path):
    """Catches a resumed run that reads the cache by its position in the data stream (or by
    its step) instead of by window, so it trains on another window's states than the
    uninterrupted run did."""
    cache = str(tmp_path / "cache")
    config = run_config(base, corpus, "kangaroo", feature_cache=cache)
    _, first = fitted(config, tmp_path / "resumed", stop_requested=lambda step: step == 3)
    assert first.interrupted and first.step == 3
    resumed, _ = fitted(config, tmp_path / "resumed")
    straight, _ = fitted(run_config(base, corpus, "kangaroo"), tmp_path / "straight")
    assert_same_params(resumed, straight)


@pytest.fixture(scope="module")
def frozen(base):
    return load_base(base)


def _windows(trainer_corpus_seq_len=32, count=6):
    rng = np.random.default_rng(0)
    return rng.integers(0, 259, (count, trainer_corpus_seq_len + 1)).astype(np.int32)


def _states(frozen, layers, batch):
    return jax.device_get(base_hidden(frozen.params, frozen.cfg, layers, batch[:, :-1]))


def test_an_interrupted_fill_is_computed_again(frozen, tmp_path):
    """Catches a window marked filled before its rows are written (or a mark that is not
    checked): a fill interrupted after writing garbage rows, its mark unset, must be
    recomputed, not read."""
    sequences, layers = _windows(), (1, 4)
    cache = FeatureCache(str(tmp_path), frozen, layers, "corpus", sequences)
    ids = np.arange(4)
    cache.states(ids, sequences[ids])
    for layer in layers:  # window 2's rows overwritten with garbage, its mark cleared
        rows = os.path.join(cache.folder, f"layer{layer}.bin")
        with open(rows, "r+b") as f:
            size = 32 * frozen.cfg.d_model * 4
            f.seek(2 * size)
            f.write(b"\x7f" * size)
        with open(os.path.join(cache.folder, f"layer{layer}.filled"), "r+b") as f:
            f.seek(2)
            f.write(b"\x00")
    again = FeatureCache(str(tmp_path), frozen, layers, "corpus", sequences)
    got = again.states(ids, sequences[ids])
    assert again.computed == 1
    want = _states(frozen, layers, sequences[ids])
    for layer in layers:
        np.testing.assert_array_equal(got[layer], want[layer])
    reread = FeatureCache(str(tmp_path), frozen, layers, "corpus", sequences)
    got = reread.states(ids, sequences[ids])
    assert reread.computed == 0
    for layer in layers:
        np.testing.assert_array_equal(got[layer], want[layer])


def test_a_cache_of_another_base_corpus_or_seq_len_is_not_read(frozen, tmp_path):
    """Catches a cache keyed without the base's weights, the corpus or the window length:
    another base's states (or another cut of the text) would train the head silently. And a
    cache folder whose meta.json or files disagree with its name is a one-line error."""
    sequences, layers = _windows(), (4,)
    ids = np.arange(3)
    first = FeatureCache(str(tmp_path), frozen, layers, "corpus", sequences)
    first.states(ids, sequences[ids])
    other = jax.tree.map(lambda x: x * 1.01, frozen.params)
    changed = [frozen.__class__(frozen.workdir, frozen.step, other, frozen.cfg, frozen.meta,
                                "another checksum"), layers, "corpus", sequences]
    for args in (changed,
                 [frozen, layers, "another corpus", sequences],
                 [frozen, layers, "corpus", _windows(16)]):
        cache = FeatureCache(str(tmp_path), *args)
        assert cache.folder != first.folder and cache.filled() == 0
        seqs = args[3]
        got = cache.states(ids, seqs[ids])
        np.testing.assert_array_equal(got[4], _states(args[0], layers, seqs[ids])[4])
    with open(os.path.join(first.folder, "meta.json"), "w", encoding="utf-8") as f:
        json.dump({**first.meta, "base": "edited"}, f)
    with pytest.raises(FeatureCacheError, match=r"\(meta.json differs\); delete that folder"):
        FeatureCache(str(tmp_path), frozen, layers, "corpus", sequences)
    with open(os.path.join(first.folder, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(first.meta, f)
    os.truncate(os.path.join(first.folder, "layer4.bin"), 100)
    with pytest.raises(FeatureCacheError, match="holds 100 bytes"):
        FeatureCache(str(tmp_path), frozen, layers, "corpus", sequences)


def test_a_feature_cache_for_a_run_with_no_frozen_model_is_refused(corpus, tmp_path):
    """Catches `train.feature_cache` silently ignored on a LayerSkip run (the user believes
    the run caches; nothing is)."""
    with pytest.raises(Exception, match="train.feature_cache keeps a frozen model's"):
        Trainer(tiny_run(data=corpus, train=dict(feature_cache=str(tmp_path))),
                str(tmp_path / "w"))
