"""Training heads on a frozen base (Kangaroo's adapter, SpecDec++'s acceptance head), and
decoding from a head's workdir."""

import glob
import json
import os
import shutil

import jax
import numpy as np
import pytest

import specjax
from specjax.decoding.drafters.specdec import SpecDecHead
from specjax.decoding.shapes.chain import Chain
from specjax.io.checkpoint import Checkpointer, CheckpointError
from specjax.loading import load_model
from specjax.training.frozen_base import load_base, params_checksum
from specjax.training.metrics_log import MetricsLog
from specjax.training.trainer import Trainer
from tests.support.models import TINY_RUN, tiny_run
from tests.support.scripts import run_script

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

BASE_RUN = tiny_run(model=dict(init_std=0.3),  # peaked distributions that exits disagree on
                    train=dict(total_steps=4, warmup_steps=1, eval_every=4, save_every=4))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("base"))
    Trainer(BASE_RUN, path).fit()
    return path


HEADS = {"kangaroo": {"exit_layer": 1}, "specdec": {"exit_layer": 1, "width": 16},
         "calm": {"exits": (1, 2)}}


def head_run(base, name, **train):
    return {"base_workdir": base, name: dict(HEADS[name]),
            "train": {**TINY_RUN["train"], "total_steps": 10, "eval_every": 10,
                      "save_every": 10, "weight_decay": 0.0, **train}}


def adapter_run(base, **train):
    return head_run(base, "kangaroo", **train)


@pytest.fixture(scope="module")
def trained_heads(base, tmp_path_factory):
    """Each head trained 10 steps on `base` (read only by the tests that share them)."""
    heads = {name: str(tmp_path_factory.mktemp(name)) for name in HEADS}
    for name, workdir in heads.items():
        Trainer(head_run(base, name), workdir).fit()
    return heads


def _losses(workdir):
    return {r["step"]: r["loss"] for r in MetricsLog(workdir).read() if r["split"] == "train"}


def test_the_adapter_learns_and_the_base_stays_bit_identical(base, tmp_path):
    """Catches gradients or optimizer updates reaching the base, a donated base buffer (the
    adapter starts from copies of base weights), and an adapter that does not learn."""
    before = load_base(base).checksum
    trainer = Trainer(adapter_run(base, total_steps=30, eval_every=30, save_every=30,
                                  learning_rate=1e-2), str(tmp_path))
    untrained = trainer.objective.evaluate(trainer.fresh_state(), trainer.eval_batches)
    assert untrained.soft_ce[0] == pytest.approx(untrained.soft_ce[1], abs=1e-6)  # = the head
    result = trainer.fit()
    assert result.report.soft_ce[1] < untrained.soft_ce[1] - 0.02
    losses = _losses(str(tmp_path))
    assert np.mean([losses[s] for s in (27, 30)]) < losses[3]
    assert params_checksum(trainer.objective.base.params) == before
    assert load_base(base).checksum == before
    meta = Checkpointer(str(tmp_path)).read_meta()
    assert meta["objective"] == "kangaroo" and meta["base"]["checksum"] == before
    assert meta["config"]["decoding"]["exit_layer"] == 1


@pytest.mark.parametrize("children", [0, 2], ids=["chain", "tree"])
def test_the_acceptance_head_learns_and_the_base_stays_bit_identical(base, tmp_path, children):
    """Catches a head that does not learn (its cross-entropy on validation drafts, or on each
    position's top 2 children for trees, must fall), gradients reaching the base, and settings
    missing from the checkpoint."""
    before = load_base(base).checksum
    run = head_run(base, "specdec", total_steps=30, eval_every=30, save_every=30,
                   learning_rate=1e-2)
    run["specdec"] = {**run["specdec"], "children": children}
    trainer = Trainer(run, str(tmp_path))
    untrained = trainer.objective.evaluate(trainer.fresh_state(), trainer.eval_batches)
    result = trainer.fit()
    assert result.report.bce < untrained.bce - 0.02
    assert 0 < result.report.acceptance < 1 and result.report.auc > 0.5
    assert load_base(base).checksum == before
    meta = Checkpointer(str(tmp_path)).read_meta()
    assert meta["objective"] == "specdec" and meta["base"]["checksum"] == before
    assert meta["acceptance_head"] == {"exit_layer": 1, "width": 16, "temperature": 0.8,
                                       "top_p": 0.95, "children": children}
    assert meta["config"]["decoding"]["exit_layer"] == 1
    with pytest.raises(CheckpointError, match="specdec.width=32 differs from the checkpoint's 16"):
        Trainer({**head_run(base, "specdec"), "specdec": {"width": 32}}, str(tmp_path)).fit()


def test_a_head_saved_before_a_setting_existed_resumes_with_its_default(base, tmp_path):
    """Catches a resume that refuses a checkpoint written before `specdec.children` existed:
    a setting missing from the checkpoint's record reads as its default."""
    run = head_run(base, "specdec", total_steps=4, save_every=2, eval_every=4)
    assert Trainer(run, str(tmp_path)).fit(stop_requested=lambda step: step == 2).step == 2
    for path in glob.glob(str(tmp_path / "checkpoints" / "*" / "meta" / "metadata")):
        with open(path) as file:
            meta = json.load(file)
        del meta["acceptance_head"]["children"]
        with open(path, "w") as file:
            json.dump(meta, file)
    assert Trainer(run, str(tmp_path)).fit().step == 4


@pytest.mark.parametrize("name", sorted(HEADS))
def test_an_interrupted_head_run_resumes_exactly(base, trained_heads, tmp_path, name):
    """Catches a resume that loses optimizer state or (for the sampled acceptance labels) the
    per-step randomness, and a loader that is silent about a head whose run was interrupted
    (a benchmark then times a half-trained head without a word, as happened once)."""
    straight, resumed = trained_heads[name], str(tmp_path / "resumed")
    first = Trainer(head_run(base, name), resumed).fit(stop_requested=lambda step: step == 4)
    assert first.interrupted and first.step == 4
    assert load_model(base, draft_workdir=resumed).unfinished == (
        f"{resumed} holds step 4 of its run's 10: its training stopped early (interrupted, "
        "diverged or still running), so its figures are not the trained model's (an "
        "interrupted run finishes with its train command run again)",)
    assert len(load_model(resumed).unfinished) == 1
    Trainer(head_run(base, name), resumed).fit()
    assert load_model(base, draft_workdir=resumed).unfinished == ()
    assert _losses(straight) == _losses(resumed)
    a, b = (load_model(w).draft_weights[name].params for w in (straight, resumed))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_head_on_a_partly_trained_base_warns_about_the_base(tmp_path):
    """Catches a loader that checks the head's own run but not the base it was trained on (a
    head can be trained on a base whose run was interrupted, and then carries its figures)."""
    partial, head = str(tmp_path / "base"), str(tmp_path / "head")
    Trainer(BASE_RUN, partial).fit(stop_requested=lambda step: step == 2)
    Trainer(head_run(partial, "specdec", total_steps=3, warmup_steps=1, eval_every=3,
                     save_every=3), head).fit()
    notes = load_model(head).unfinished
    assert len(notes) == 1 and notes[0].startswith(f"{partial} holds step 2 of its run's 4")


def test_a_missing_or_changed_base_is_refused(base, tmp_path):
    """Catches an adapter resumed or decoded on a base trained again from scratch in the same
    workdir. A base that merely trained on keeps the step the adapter started on: resuming
    and decoding use that step (checked by its checksum)."""
    with pytest.raises(ValueError, match="config.base_workdir is required"):
        Trainer(adapter_run(""), str(tmp_path / "a")).fit()
    with pytest.raises(CheckpointError, match="does not exist: train the base model first"):
        Trainer(adapter_run(str(tmp_path / "nowhere")), str(tmp_path / "a")).fit()
    with pytest.raises(ValueError, match="takes its model from the base"):
        Trainer({**adapter_run(base), "model": TINY_RUN["model"]}, str(tmp_path / "a")).fit()
    moved = str(tmp_path / "base")
    shutil.copytree(base, moved)
    adapter = str(tmp_path / "adapter")
    Trainer(adapter_run(moved, total_steps=3, warmup_steps=1), adapter).fit()
    with pytest.raises(CheckpointError, match="holds a kangaroo run, not a model"):
        Trainer(adapter_run(adapter), str(tmp_path / "b")).fit()
    with pytest.raises(ValueError, match="holds a kangaroo run"):
        Trainer(BASE_RUN, adapter).fit()
    recorded = Checkpointer(adapter).read_meta()["base"]["checksum"]
    Trainer({**BASE_RUN, "train": {**BASE_RUN["train"], "total_steps": 5}}, moved).fit()
    assert load_base(moved).checksum != recorded  # the base trained on; its step 4 is kept
    assert params_checksum(load_model(adapter).params) == recorded
    Trainer(adapter_run(moved, total_steps=4, warmup_steps=1), adapter).fit()  # on step 4
    shutil.rmtree(moved)
    with pytest.raises(CheckpointError, match="which no longer exists: move that workdir back"):
        load_model(adapter)
    Trainer(tiny_run(model=dict(init_std=0.3), train={**BASE_RUN["train"], "seed": 1}),
            moved).fit()
    with pytest.raises(CheckpointError, match="is not the one this kangaroo head was trained on"):
        Trainer(adapter_run(moved, total_steps=6, warmup_steps=1), adapter).fit()
    with pytest.raises(CheckpointError, match=f"is not the one {adapter} was trained on"):
        load_model(adapter)


@pytest.mark.parametrize("name,strategy,flag", [
    ("kangaroo", "kangaroo", "--draft_threshold=0.3"), ("specdec", "specdec", "--draft_risk=0.8"),
    ("calm", "calmdraft", "--calm_threshold=0.5")])
def test_generate_from_a_head_workdir(base, trained_heads, tmp_path, name, strategy, flag):
    """The CLI as the README runs it: greedy output drafted with the head is the base's `ar`
    output (the CALM classifier's workdir defaults to its measure); a model without the head
    says how to train one."""
    adapter = trained_heads[name]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "import os\\n"}\n{"prompt": "def f(x):"}\n')
    out = tmp_path / "out.jsonl"
    result = run_script("infer/generate.py", "--workdir", adapter, "--strategy", strategy, flag,
                        "--prompts_file", str(prompts), "--max_new_tokens", "24",
                        "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    plain = specjax.load(base).generate(["import os\n", "def f(x):"], max_new_tokens=24,
                                        strategy="ar")
    assert [r["completion"] for r in rows] == [c.text for c in plain]
    assert all(r["drafted"] > 0 for r in rows)
    options = {"calm_measure": "classifier"} if name == "calm" else {}
    with pytest.raises(ValueError, match="needs weights of its own and this model has none"):
        specjax.load(base).generate("x", strategy=strategy, **options)



def test_a_head_workdir_drafts_over_its_bases_ranking_unless_it_has_its_own(base,
                                                                             trained_heads):
    """A head workdir without draft_vocab.json loads its base's ranking (the reference: the
    ids written there), and one of its own wins over the base's. Catches a head that loads no
    ranking (every --draft_vocab N refused on a head workdir whose base was ranked)."""
    from specjax.io.draft_vocab import FILE, write_ranking

    head = trained_heads["kangaroo"]
    written = [os.path.join(base, FILE), os.path.join(head, FILE)]
    try:
        write_ranking(base, np.array([7, 3, 258, 0]), {"source": "base"})
        assert load_model(head).draft_vocab.tolist() == [7, 3, 258, 0]
        write_ranking(head, np.array([5, 1]), {"source": "head"})
        assert load_model(head).draft_vocab.tolist() == [5, 1]
    finally:  # the base and heads are shared by this module's other tests
        for path in written:
            if os.path.exists(path):
                os.remove(path)

def test_a_head_beside_its_model_drafts_from_its_own_exit(base, tmp_path):
    """Catches a head loaded with --draft_workdir taking the target's default exit (2 here)
    instead of the one it was trained on: the bench, generate.py and the API then refused it
    ("trained at exit_layer=2, not 1") unless the user repeated its exit by hand. An exit
    chosen by hand that differs is still refused."""
    head = str(tmp_path / "head")
    Trainer({**head_run(base, "kangaroo"), "kangaroo": {"exit_layer": 2}}, head).fit()
    model = specjax.load(base, draft_workdir=head)
    assert model.decoding_defaults.exit_layer == 1
    assert model.strategy("kangaroo").exit_layer == 2
    drafted = model.generate(["def f(x):"], strategy="kangaroo", max_new_tokens=12)
    plain = specjax.load(base).generate(["def f(x):"], strategy="ar", max_new_tokens=12)
    assert drafted[0].text == plain[0].text and drafted[0].stats.drafted > 0
    with pytest.raises(ValueError, match="trained at exit_layer=2, not 1"):
        model.generate(["x"], strategy="kangaroo", exit_layer=1, max_new_tokens=4)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    for script, extra in (("infer/generate.py", ["--strategy", "kangaroo", "--prompts_file",
                                                  str(prompts)]),
                          ("bench/bench.py", ["--strategies", "kangaroo", "--num_prompts", "1",
                                              "--prompt_len", "8", "--repeats", "1"])):
        result = run_script(script, "--workdir", base, "--draft_workdir", head,
                            "--max_new_tokens", "8", *extra)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "kangaroo E=2" in result.stdout or script.endswith("generate.py")


def test_heads_on_the_same_model_join_it_as_draft_workdirs(base, trained_heads, tmp_path):
    """Every drafter in one process: heads trained on the target load next to it (and next to
    each other). Catches a head attached to a model it was not trained on, and two heads
    silently taking one strategy's place."""
    heads = trained_heads
    loaded = load_model(base, draft_workdir=list(heads.values()))
    assert sorted(loaded.draft_weights) == ["calm", "calmdraft", "kangaroo", "specdec"]
    out = loaded.generator().generate([[5, 6, 7]], max_new_tokens=8,
                                      strategy=SpecDecHead(1, Chain(4, stop_risk=0.5)))
    assert out.tokens == loaded.generator().generate([[5, 6, 7]], max_new_tokens=8).tokens
    with pytest.raises(ValueError, match="adds a second 'kangaroo' drafter"):
        load_model(heads["kangaroo"], draft_workdir=heads["kangaroo"])
    other = str(tmp_path / "other")
    Trainer(tiny_run(train={**BASE_RUN["train"], "total_steps": 2, "seed": 3}), other).fit()
    with pytest.raises(CheckpointError, match="was trained on the model in .* not on the weights"):
        load_model(other, draft_workdir=heads["specdec"])


def test_two_draft_workdirs_of_one_strategy_are_refused(base, tmp_path):
    """Two --draft_workdir heads of the same strategy (two kangaroo adapters, neither in the
    target's own workdir) are a one-line error naming the second, whichever comes first; one
    alone loads. Catches the clash checked only against the target's own drafters: the
    second head silently replaced the first."""
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    Trainer(head_run(base, "kangaroo", total_steps=2, warmup_steps=1,
                     eval_every=2, save_every=2), first).fit()
    shutil.copytree(first, second)
    assert sorted(load_model(base, draft_workdir=[first]).draft_weights) == ["kangaroo"]
    for given in ([first, second], [second, first]):
        with pytest.raises(ValueError) as caught:
            load_model(base, draft_workdir=given)
        assert str(caught.value) == (f"{given[1]} adds a second 'kangaroo' drafter; give one "
                                     "per strategy")
