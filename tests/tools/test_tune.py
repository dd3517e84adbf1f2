"""The tuner (`infer/tune.py`, `model.tune`): it picks a drafter known to be the best, stores
it as the workdir's default for its mode, which `generate` then decodes with; the budget stops
the search; bad input is refused before any work."""

import dataclasses
import json
import os
import shutil
import time
import types

import jax
import pytest

import specjax
from specjax import api
from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.registry import DecodingConfig
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.heads.medusa import init_medusa
from specjax.io.calibrated_defaults import FILE, read_calibrated, write_calibrated
from specjax.loading import load_model
from specjax.model import init_params
from specjax.tools import tune as tuner
from tests.support.models import TINY_MODEL, model_workdir
from tests.support.scripts import run_script

PROMPTS = ["def f(x):\n    return x", "import os\nclass A:\n"]
TUNE = dict(max_new_tokens=24, num_draft=[4], trees=[], exits=1, confirm=3, budget_s=600)


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    """A target of 8 layers whose first 7 add nothing to the residual stream (zero output
    projections) and a 1-layer draft model holding its 8th layer: the draft computes the
    target's function exactly (it accepts every draft) at an eighth of its layers, while
    selfspec's exits see only the embedding, which the untied head reads wrongly once the
    8th layer's output (scaled up) dominates the stream. Wide enough that layers, not the
    loop, are the cost."""
    sizes = {**TINY_MODEL, "d_model": 128, "mlp_dim": 512, "tie_embeddings": False}
    cfg = ModelConfig(**{**sizes, "num_layers": 8})
    params = init_params(cfg, jax.random.PRNGKey(0))
    layers = params["layers"]
    for part, leaf in (("attn", "out"), ("mlp", "down")):
        layers[part][leaf] = layers[part][leaf].at[:7].set(0.0).at[7].multiply(8.0)
    draft_cfg = ModelConfig(**{**sizes, "num_layers": 1})
    draft = {**params, "layers": jax.tree.map(lambda w: w[7:], layers)}
    root = tmp_path_factory.mktemp("tune")
    return (model_workdir(str(root / "target"), params, cfg),
            model_workdir(str(root / "draft"), draft, draft_cfg))


@pytest.fixture(scope="module")
def tuned(workdirs):
    target, draft = workdirs
    model = specjax.load(target, draft_workdir=draft)
    return model.tune(PROMPTS, strategies=["selfspec", "draft", "ngram"], **TUNE)


def test_the_tuner_picks_the_draft_model_that_is_the_target(tuned):
    """Selfspec at the exit the report ranks first (its greedy figure, calibrated on these
    prompts, not probed), ngram (played over the same continuations, not probed) and the
    draft model (played over its own teacher-forced runs, priced with its own pieces, not
    probed) are all confirmed, and the draft model, which accepts everything at an eighth
    of the cost, wins by its confirmed speed-up and is predicted the fastest. Catches the
    slowest confirmed row taken as the winner, a loaded draft model left out of the
    candidates, and a copying drafter or a draft model probed (a compilation) where its
    rounds can be played."""
    assert tuned.confirmed
    assert (tuned.winner.strategy, dict(tuned.winner.options)) == ("draft", {"num_draft": 4})
    sources = {row.candidate.strategy: row.source for row in tuned.rows}
    assert sources == {"selfspec": "exit report", "draft": "played", "ngram": "played"}
    predicted = {row.candidate.strategy: row.predicted for row in tuned.rows}
    assert predicted["draft"] > max(predicted["selfspec"], predicted["ngram"])
    confirmed = {row.candidate.strategy: row.confirmed for row in tuned.rows}
    assert confirmed["draft"].stats.acceptance_rate >= 0.9  # all but the last round's ends
    assert confirmed["draft"].speedup > max(1.0, confirmed["selfspec"].speedup)
    assert "winner: draft num_draft=4" in tuned.table()


def test_generate_then_decodes_greedy_with_the_stored_winner(tuned, workdirs, monkeypatch):
    """After tuning, a fresh load's `generate` without a strategy decodes greedy with draft
    K=4 (the strategy handed to the decode loop), a sampled call still with selfspec (only the
    greedy default was tuned), and a load without the draft workdir falls back to selfspec.
    Catches the stored default not read back by `generate` (selfspec K=3 from the checkpoint),
    greedy and sampled tunings sharing one entry, or a failure when the drafter is absent."""
    target, draft = workdirs
    assert read_calibrated(target)["tuned"]["greedy"] == {"strategy": "draft",
                                                          "options": {"num_draft": 4}}
    model = specjax.load(target, draft_workdir=draft)
    used = []
    decode = model.generator.generate
    monkeypatch.setattr(model.generator, "generate",
                        lambda *a, **k: used.append(k["strategy"]) or decode(*a, **k))
    model.generate(PROMPTS[0], max_new_tokens=4)
    assert used[0].label() == "draft K=4"
    assert model.default_strategy(temperature=0.8).label().startswith("selfspec")
    assert specjax.load(target).default_strategy().label().startswith("selfspec")


def test_the_budget_stops_the_search(workdirs):
    """With a budget spent before the first probe ends, one candidate is measured, the rest
    are marked out of budget and the winner is that one, unconfirmed. Catches a search that
    ignores --budget_s (every candidate probed and confirmed)."""
    model = specjax.load(workdirs[0])
    found = [tuner.Candidate("ngram", {"num_draft": k}) for k in (2, 3, 4)]
    tuning = tuner.tune(model.generator, lambda c: model.strategy(c.strategy, **c.options),
                        found, [model.tokenizer.encode(p) for p in PROMPTS], max_new_tokens=8,
                        budget_s=1e-9, started=0.0)
    assert [row.source for row in tuning.rows] == ["probe", "out of budget", "out of budget"]
    assert not tuning.confirmed and tuning.winner == found[0]
    assert "unconfirmed" in tuning.table()


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompts=[]), "prompts must be a string, a list of token ids or a non-empty list"),
    (dict(budget_s=0), "budget_s=0 must be a number of seconds > 0"),
    (dict(budget_s=-5.0), "budget_s=-5.0 must be"),
    (dict(strategies=["calm"]), "strategy 'calm' cannot be tuned here"),
    (dict(strategies=["draft"]), "strategy 'draft' cannot be tuned here"),
    (dict(num_draft=[]), "num_draft=\\[\\] must be a non-empty list"),
])
def test_bad_input_is_refused_before_any_work(workdirs, monkeypatch, kwargs, message):
    """No prompts, a budget <= 0, a strategy it cannot run (lossy calm; draft without its
    workdir loaded) or no draft counts: a one-line error before the exit report or any probe.
    Catches a check made after the expensive work, or missing (an empty prompt list silently
    replaced by held-out windows)."""
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the input was checked")

    monkeypatch.setattr(api, "model_exit_report", no_work)
    monkeypatch.setattr(api, "tune", no_work)
    model = specjax.load(workdirs[0])
    with pytest.raises(ValueError, match=message):
        model.tune(**{"prompts": PROMPTS, **kwargs})


def test_greedy_and_sampled_defaults_are_stored_separately(tmp_path):
    """Storing a sampled winner after a greedy one keeps both (and the decoding section);
    a tuned strategy that is not registered is a one-line error naming the file on load.
    Catches the second tuning replacing the first mode's entry."""
    workdir = str(tmp_path)
    write_calibrated(workdir, 3, {"draft_vocab": 64}, {},
                     tuned={"greedy": {"strategy": "ngram", "options": {"num_draft": 2}}})
    write_calibrated(workdir, 3, {}, {},
                     tuned={"sampled": {"strategy": "suffix", "options": {}}})
    record = read_calibrated(workdir)
    assert record["decoding"] == {"draft_vocab": 64}
    assert set(record["tuned"]) == {"greedy", "sampled"}
    record["tuned"]["greedy"]["strategy"] = "nope"
    with open(os.path.join(workdir, FILE), "w", encoding="utf-8") as f:
        json.dump(record, f)
    from specjax.io.calibrated_defaults import with_calibrated

    with pytest.raises(ValueError, match=f"{FILE}: tuned.greedy is not a mode"):
        with_calibrated({"step": 3}, workdir, ModelConfig(**TINY_MODEL))


def test_the_command_refuses_a_budget_of_zero_and_an_empty_prompts_file(workdirs, tmp_path):
    """`infer/tune.py --budget_s 0` and a prompts file without prompts end in one-line errors
    naming them, before the model loads. Catches the command passing them on unchecked."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    for args, message in ((["--budget_s", "0"], "--budget_s=0 must be > 0"),
                          (["--prompts_file", str(empty)], "no prompts")):
        result = run_script("infer/tune.py", "--workdir", workdirs[0], *args)
        assert result.returncode != 0 and message in result.stderr, result.stderr[-1000:]
        assert "Traceback" not in result.stderr


def test_the_command_line_generates_with_the_tuned_default(workdirs, tmp_path):
    """`infer/generate.py` without --strategy decodes with the workdir's tuned greedy default
    (here `ar`: no acceptance to report), and --strategy still overrides it. Catches
    generate.py keeping selfspec as its fixed default after tuning."""
    workdir = shutil.copytree(workdirs[0], str(tmp_path / "w"))
    write_calibrated(workdir, 0, {}, {}, tuned={"greedy": {"strategy": "ar", "options": {}}})
    args = ["--workdir", workdir, "--prompt", "def f(", "--max_new_tokens", "4"]
    tuned = run_script("infer/generate.py", *args)
    named = run_script("infer/generate.py", *args, "--strategy", "selfspec")
    assert tuned.returncode == named.returncode == 0, tuned.stderr[-1000:] + named.stderr[-1000:]
    assert "acceptance=n/a" in tuned.stdout and "acceptance=n/a" not in named.stdout


def _scripted_bench(speeds: dict, probed: list):
    """A `run_benchmark` stand-in: each label's speed-up from `speeds` (1.0 by default), the
    labels of a probe (one repeat) recorded in `probed`."""
    def bench(generator, strategies, prompts, **kwargs):
        labels = [label for label in strategies if label != "ar"]
        if kwargs["repeats"] == 1:
            probed.extend(labels)
        return [types.SimpleNamespace(name=label, speedup=speeds.get(label, 1.0),
                                      stats=types.SimpleNamespace(tau=2.0))
                for label in ["ar", *labels]]
    return bench


SELFSPEC_FOUND = [tuner.Candidate("selfspec", {"exit_layer": e, "num_draft": k}, predicted)
                  for e, k, predicted in ((1, 2, 2.0), (1, 4, 2.5), (2, 2, 1.5), (2, 4, 1.4))]


def test_a_measuring_report_is_not_probed_and_its_best_is_confirmed(monkeypatch):
    """The exit report's figures (played over these prompts, its loop calibrated on them, in
    either mode): no selfspec chain is probed, each keeps the report's figure, and the kind's
    best by the report (exit 1, K=4) is the one confirmed, beside a probed ngram. Catches the
    calibrated figures probed anyway (two wasted compilations per exit) or ignored in favour
    of the probes."""
    probed = []
    monkeypatch.setattr(tuner, "run_benchmark", _scripted_bench(
        {"selfspec exit_layer=1 num_draft=4": 2.2, "ngram num_draft=2": 1.3}, probed))
    found = [*SELFSPEC_FOUND, tuner.Candidate("ngram", {"num_draft": 2})]
    tuning = tuner.tune(None, lambda c: c.label, found, [[1, 2]], max_new_tokens=4,
                        budget_s=60, started=time.perf_counter())
    assert probed == ["ngram num_draft=2"]
    assert [row.source for row in tuning.rows] == ["exit report"] * 4 + ["probe"]
    confirmed = [row.candidate for row in tuning.rows if row.confirmed]
    assert confirmed == [SELFSPEC_FOUND[1], found[-1]]
    assert tuning.winner == SELFSPEC_FOUND[1]


def test_a_played_figure_is_not_probed(monkeypatch):
    """`played` predicts ngram (the greedy rounds of a drafter that copies from the text) and
    not lookahead: ngram keeps the played figure unprobed and is confirmed, lookahead is
    probed. Catches a played figure probed anyway, or ignored for the probe's."""
    probed = []
    monkeypatch.setattr(tuner, "run_benchmark", _scripted_bench(
        {"lookahead": 1.1, "ngram num_draft=2": 1.5}, probed))
    found = [tuner.Candidate("ngram", {"num_draft": 2}), tuner.Candidate("lookahead")]
    tuning = tuner.tune(None, lambda c: c.label, found, [[1, 2]], max_new_tokens=4,
                        budget_s=60, started=time.perf_counter(),
                        played=lambda label: 1.7 if label.startswith("ngram") else None)
    assert probed == ["lookahead"]
    assert [(row.source, row.predicted) for row in tuning.rows] == [("played", 1.7),
                                                                    ("probe", 1.1)]
    assert tuning.winner == found[0]


def test_a_selfspec_tree_is_played_where_the_runs_can_play_it():
    """`played_speedup` prices selfspec's static trees from the report (`tree_speedup`, at
    the drafter's exit and parents) when the runs can play the tree (`plays_tree`) and the
    drafter drafts over the report's vocabulary; runs that cannot, a dynamic tree, another
    draft vocabulary or a chain are left to the probe or the report. Catches a tree still
    probed (two compilations each), or played over chances of another vocabulary."""
    calls = []
    runs = types.SimpleNamespace(plays_tree=lambda tree: True, texts=())
    report = types.SimpleNamespace(
        runs=runs, loop=object(), costs=types.SimpleNamespace(draft_vocab=0),
        tree_speedup=lambda exit_layer, tree: calls.append((exit_layer, tree)) or 1.4)
    tree = StaticTree.from_branching((2, 1))
    assert tuner.played_speedup(report, None, SelfSpeculative(2, tree)) == 1.4
    assert calls == [(2, tree)]
    for drafter in (SelfSpeculative(2, tree, draft_vocab=100),
                    SelfSpeculative(2, DynamicTree(4, 2, 2)), SelfSpeculative(2, Chain(3))):
        assert tuner.played_speedup(report, None, drafter) is None
    runs.plays_tree = lambda tree: False
    assert tuner.played_speedup(report, None, SelfSpeculative(2, tree)) is None
    assert len(calls) == 1


class _Report:
    """An exit report of 6 layers whose predicted speed-up grows with the exit and with K:
    the model's own last layer would look best, were it an exit."""

    num_layers = 6

    @staticmethod
    def speedup(exit_layer, num_draft):
        return exit_layer + num_draft / 10


def test_selfspec_candidates_are_exits_below_the_last_with_trees_at_the_best():
    """Catches the model's last layer (no draft: the model itself) tried as a selfspec exit,
    and tree candidates made at every exit instead of only the best one: the candidates are
    the report's two best exits below the last, chains carrying the report's figure, and one
    tree at the best exit."""
    found = tuner.candidates(["selfspec"], DecodingConfig(), _Report(), exits=2,
                             num_draft=[2, 4], trees=["2,1"])
    assert [(c.options, c.predicted) for c in found] == [
        ({"exit_layer": 5, "num_draft": 2}, 5.2), ({"exit_layer": 5, "num_draft": 4}, 5.4),
        ({"exit_layer": 5, "tree": "2,1"}, None),
        ({"exit_layer": 4, "num_draft": 2}, 4.2), ({"exit_layer": 4, "num_draft": 4}, 4.4)]


def test_a_winner_slower_than_ar_stores_ar(monkeypatch):
    """Catches the fastest confirmed candidate stored even when it is slower than plain
    decoding: every confirmed speed-up below 1 makes `ar` the winner."""
    def bench(generator, strategies, prompts, **kwargs):
        return [types.SimpleNamespace(name=label, speedup=1.0 if label == "ar" else 0.7,
                                      stats=types.SimpleNamespace(tau=1.0))
                for label in strategies]

    monkeypatch.setattr(tuner, "run_benchmark", bench)
    found = [tuner.Candidate("ngram", {"num_draft": 2}), tuner.Candidate("suffix")]
    tuning = tuner.tune(None, lambda c: c.label, found, [[1, 2]], max_new_tokens=4,
                        budget_s=60, started=time.perf_counter())
    assert tuning.confirmed and all(row.confirmed for row in tuning.rows)
    assert tuning.winner == tuner.Candidate("ar")


def test_the_tuners_report_reads_one_batch_of_held_out_windows(workdirs, monkeypatch):
    """The tuner's exit report, whose predictions come from the workload, evaluates one
    batch of 4 held-out windows for the metrics its table shows, and is then run on the
    tuner's prompts, its loop timed in the tuning's mode. Catches the default 32,768 held-out
    tokens passed through every exit's head (49,152-way on SmolLM2) for figures the tuner
    never reads, and a sampled tuning costing its rounds as greedy ones (sampling took 31% of
    `ar`'s token on the default model)."""
    seen, workload = {}, []
    monkeypatch.setattr(api, "model_exit_report", lambda *a, **k: seen.update(k) or "report")
    monkeypatch.setattr(api, "on_workload",
                        lambda report, *a, **k: workload.append((a[4], k)) or report)
    model = specjax.load(workdirs[0])
    encoded = [model.tokenizer.encode(p) for p in PROMPTS]
    sampling = SamplingParams(0.8, 0, 0.95)
    assert model._tune_report(encoded, [2], 8, print, sampling) == "report"
    assert seen["max_tokens"] == 4 * seen["seq_len"] and seen["batch_size"] == 4
    assert workload[0][0] == encoded and workload[0][1]["max_new_tokens"] == 8
    assert workload[0][1]["sampling"] is sampling


def test_a_candidate_its_weights_cannot_serve_is_refused_not_fatal(workdirs):
    """Two Medusa heads, num_draft 2 and 4: K=4 is refused before its probe (the heads' own
    one-line reason in the table) and the search goes on with K=2. Catches the candidate
    built without binding its weights: on SmolLM2 (4 heads) the tuner ended at K=6, 14
    minutes in, with only the error to show."""
    loaded = load_model(workdirs[0])
    heads = DraftWeights(init_medusa(loaded.params, loaded.cfg, 2), exit_layer=8,
                         settings={"num_heads": 2})
    model = api.LanguageModel(dataclasses.replace(loaded, draft_weights={"medusa": heads}))
    tuning = model.tune(PROMPTS, strategies=["medusa"], max_new_tokens=8, num_draft=[2, 4],
                        trees=[], confirm=1, write=False)
    sources = {row.candidate.label: row.source for row in tuning.rows}
    assert sources["medusa num_draft=2"] == "probe"
    assert sources["medusa num_draft=4"].startswith("refused: the proposal is 4 deep but the "
                                                    "model has 2 Medusa heads")
    assert tuning.confirmed


def test_probes_share_one_ar_a_batch_and_keep_their_own_figures(monkeypatch):
    """Five probed candidates run in two benchmarks (4 + 1), each beside one `ar`, and every
    row keeps its own candidate's speed-up, in the order found. Catches a benchmark per
    candidate (`ar` compiled again for each: on SmolLM2 a third of a probe's 37 s), and a
    batch's figures handed to the wrong rows."""
    calls = []

    def bench(generator, strategies, prompts, **kwargs):
        calls.append(list(strategies))
        return [types.SimpleNamespace(name=label, speedup=1.0 if label == "ar" else
                                      float(label.split("=")[1]),
                                      stats=types.SimpleNamespace(tau=2.0))
                for label in strategies]

    monkeypatch.setattr(tuner, "run_benchmark", bench)
    found = [tuner.Candidate("ngram", {"num_draft": k}) for k in (5, 3, 4, 2, 6)]
    tuning = tuner.tune(None, lambda c: c.label, found, [[1, 2]], max_new_tokens=4,
                        budget_s=60, started=time.perf_counter(), confirm=1)
    assert [call.count("ar") for call in calls] == [1, 1, 1]  # two batches, one confirmation
    assert [len(call) for call in calls[:2]] == [tuner.PROBE_BATCH + 1, 2]
    assert [row.predicted for row in tuning.rows] == [5.0, 3.0, 4.0, 2.0, 6.0]
    assert tuning.winner == found[4]
