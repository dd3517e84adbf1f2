"""Pins of the exit report's workload prediction (issue 50, item 2) that a bug-planting audit
found unpinned: the teacher-forced pass past one batch of prompts, the loop's calibration by
hand, the draft vocabulary's head (timed, scaled, handed on), the prompt counts of the end to
end speed-up and of the table's check, the sampled report's continuations, acceptance and
play handed on by mode, the report's figures standing in a sampled tuning, within their
kind too, and the copying drafters' play: each prompt's rows and target p(y) past the first
pass, each text played with its own target, and a right draft its drafter marks invalid."""

import dataclasses
import re
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import specjax.tools.copied_play as copied_play_module
import specjax.tools.exit_report as exit_report_module
import specjax.tools.layer_costs as layer_costs_module
import specjax.tools.loop_calibration as loop_calibration_module
import specjax.tools.tune as tune_module
from specjax import api
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.drafters.ngram import PromptLookup
from specjax.decoding.drafters.suffix import SuffixDecoding
from specjax.decoding.engine import Generator
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.chain import Chain
from specjax.heads.kangaroo import init_adapter
from specjax.heads.vocab_subset import DraftVocab
from specjax.model import allocate_cache, unstack_layers
from specjax.tools.copied_play import CopiedPlay, copied_rounds
from specjax.tools.exit_report import DraftExitReport, on_workload
from specjax.tools.exit_workload import (
    ROWS_PER_PASS,
    SAMPLED_PLAYS,
    ExitRuns,
    ForcedPlays,
    exit_runs,
    model_continuations,
)
from specjax.tools.layer_costs import measure_costs
from specjax.tools.loop_calibration import LoopCalibration, calibrate_loop
from tests.tools.test_exit_report import PARAMS, fake_timings
from tests.tools.test_exit_workload import CFG, COSTS, METRICS, PROMPTS
from tests.tools.test_tune import SELFSPEC_FOUND, _scripted_bench

LOOP = LoopCalibration(token_seconds=3.0, prefill_seconds=2.0, scale=0.5, overhead=1.0,
                       exit_layer=2, points=((3, 9.0, 8.0, 4.0),), prompts=1)


def test_exit_runs_read_each_prompts_own_offset_past_the_first_pass():
    """Six prompts of distinct lengths (two teacher-forced passes of ROWS_PER_PASS rows): the
    last exit is the model, so its argmax agrees with the greedy continuation at every
    position of every prompt. Catches a prompt's offset read by its row in the pass instead
    of its index (the fifth prompt read at the first one's length), invisible with fewer
    prompts than one pass holds."""
    prompts = [list(range(10, 10 + n)) for n in (3, 5, 7, 9, 11, 2)]
    assert len(prompts) > ROWS_PER_PASS
    continuations = model_continuations(Generator(PARAMS, CFG), prompts, max_new_tokens=10)
    runs = exit_runs(PARAMS, CFG, prompts, continuations)
    assert [bool(row[-1].all()) for row in runs.accept] == [True] * len(prompts)
    assert runs.rate(1) < 1  # a shallow exit disagrees somewhere: the rows are read


def test_the_loop_calibration_by_hand(monkeypatch):
    """With the benchmark scripted over 2 prompts (ar: 10 s, 2 s of it the prefill call, 40
    rounds; K=2: 8 s, 2 s, 20 rounds; K=4: 6 s, 2 s, 10 rounds) and pieces of 0.1 x K s a
    round: ar 0.2 s a token and 1 s of prefill per prompt, rounds of 0.3 and 0.4 s against
    the pieces' 0.2 and 0.4, so scale 0.5 and overhead 0.2; only the smallest and largest K
    are run. Catches the line fitted with its axes swapped, the prefill not divided by the
    prompts, and a round's seconds including the prefill call's."""
    timed = {"ar": (10.0, 2.0, 40, 1.0), "K=2": (8.0, 2.0, 20, 1.5), "K=4": (6.0, 2.0, 10, 2.5)}
    asked = []

    def bench(generator, strategies, prompts, **kwargs):
        asked.append(strategies)
        return [types.SimpleNamespace(name=name, seconds=timed[name][0],
                                      prefill_seconds=timed[name][1],
                                      stats=types.SimpleNamespace(rounds=timed[name][2],
                                                                  tau=timed[name][3]))
                for name in strategies]

    monkeypatch.setattr(loop_calibration_module, "run_benchmark", bench)
    loop = calibrate_loop(None, lambda e, k: (e, k), [[1], [2]], lambda e, k: 0.1 * k,
                          max_new_tokens=8, exit_layer=2, num_draft=(4, 2, 3))
    assert asked[0] == {"ar": asked[0]["ar"], "K=2": (2, 2), "K=4": (2, 4)}
    assert (loop.token_seconds, loop.prefill_seconds) == (pytest.approx(0.2), 1.0)
    assert (loop.scale, loop.overhead) == (pytest.approx(0.5), pytest.approx(0.2))
    assert [x for point in loop.points for x in point] == pytest.approx(
        [2, 0.3, 0.2, 1.5, 4, 0.4, 0.4, 2.5])
    assert (loop.exit_layer, loop.prompts) == (2, 2)


def test_the_draft_heads_measured_cost_is_scaled_like_the_others(monkeypatch):
    """With the timings monkeypatched (the head alone 4 s on one token, the pieces scaled by
    24 / (4 x 2 + 4) = 2 on one token), the draft head over 16 ids is timed beside the other
    pieces and costs 8 s, on the whole pass's scale. Catches the draft head's raw timing kept
    (a piece timed alone runs from the CPU's caches: 3x too cheap on a 54 MB model) and the
    draft head left untimed."""
    alone = {"layer": {1: 2.0, 3: 3.0}, "head": {1: 4.0, 3: 6.0}, "model": {1: 24.0, 3: 54.0}}
    asked = fake_timings(monkeypatch, alone)
    costs = measure_costs(PARAMS, CFG, [3], context=4, repeats=3, inner=2, draft_vocab=16)
    assert ("draft head", 1) in asked[0]
    assert (costs.draft_head, costs.draft_vocab) == (pytest.approx(8.0), 16)


def test_the_sampled_proposal_is_timed_with_its_sampling(monkeypatch):
    """`play_copied` over sampled runs times the proposal drawn with their sampling (suffix
    decoding's timed loop then traces the sampling's branches, which the greedy one does not
    hold). Catches the sampled proposal timed greedy."""
    timed_args = []
    drafter = SuffixDecoding(shape=Chain(2))
    loop = copied_play_module._proposal_loop(drafter, CFG)
    monkeypatch.setattr(copied_play_module, "_proposal_loop",
                        lambda drafter, cfg: lambda *a: timed_args.append(a) or loop(*a))
    sampling = SamplingParams(0.8, 0, 0.95)
    runs = ExitRuns((), ((5, 6, 5, 6, 5),), (2,), sampling, (np.full(2, 0.5),))
    copied_play_module.play_copied(drafter, CFG, runs, repeats=1)
    assert all(args[-1] is sampling for args in timed_args) and timed_args
    text, end = timed_args[0][:2]
    branches = [str(jax.make_jaxpr(loop)(text, end, mode)).count("cond[")
                for mode in (sampling, None)]
    assert branches[0] > branches[1]


def test_sampled_pieces_time_the_heads_sampled_distribution(monkeypatch):
    """With `sampling`, the timed head and whole pass turn their logits into the sampled
    distribution (temperature, then top-k and top-p behind runtime branches: more `cond`s
    than greedy), and `model_exit_report` hands its sampling to `measure_costs`. Catches a
    sampled tuning's pieces timed greedy: the calibrated line cannot carry the filters
    selfspec's rounds pay over to ngram's, whose sampled K=4 was then predicted 0.71x against
    a bench's 0.56x on SmolLM2."""
    head = {k: PARAMS[k] for k in ("embed", "final_norm", "unembed") if k in PARAMS}
    hidden = jnp.ones((1, 2, CFG.d_model), CFG.compute_dtype)
    sampling = SamplingParams(0.8, 0, 0.95)
    heads = [str(jax.make_jaxpr(layer_costs_module._head_loop(CFG, 1))(mode, head, None,
                                                                       hidden)).count("cond[")
             for mode in (sampling, None)]
    assert heads[0] > heads[1]
    model = unstack_layers(PARAMS, CFG)
    cache = allocate_cache(CFG, 1, 8, window=2)
    passes = [str(jax.make_jaxpr(layer_costs_module._model_loop(CFG, 1))(
        mode, model, hidden, cache)).count("cond[") for mode in (sampling, None)]
    assert passes[0] > passes[1]
    seen = {}
    monkeypatch.setattr(exit_report_module, "measure_costs",
                        lambda *a, **k: seen.update(k) or COSTS)
    monkeypatch.setattr(exit_report_module, "exit_report", lambda *a, **k: "report")
    monkeypatch.setattr(exit_report_module, "token_windows", lambda *a: np.zeros((1, 9)))
    exit_report_module.model_exit_report(PARAMS, CFG, None, {}, ["a"], seq_len=8,
                                         sampling=sampling)
    assert seen["sampling"] is sampling


def test_the_timed_draft_head_multiplies_only_its_rows():
    """The head loop `measure_costs` times, given a draft vocabulary of 16 of the 259 ids,
    multiplies by the [16, D] rows and by no [V, D] table (the products' shapes, as
    tests/decoding/test_draft_vocab.py reads them). Catches the vocabulary dropped in the
    loop (the full head timed as the draft head: the subset's saving never predicted)."""
    head = {k: PARAMS[k] for k in ("embed", "final_norm", "unembed") if k in PARAMS}
    vocab = DraftVocab.gather(PARAMS, CFG, jnp.arange(16, dtype=jnp.int32))
    hidden = jnp.ones((1, 1, CFG.d_model), CFG.compute_dtype)
    jaxpr = str(jax.make_jaxpr(layer_costs_module._head_loop(CFG, 1))(None, head, vocab,
                                                                       hidden))
    products = {shape.split(",")[-1] for shape in
                re.findall(r"f32\[([\d,]+)\] = (?:dot_general|ffi_call)", jaxpr)}
    assert "16" in products and str(CFG.vocab_size) not in products, products


def test_the_end_to_end_speed_up_counts_the_workloads_prompts():
    """Three prompts played, the loop calibrated on the first one: the speed-up takes the
    prefill of all three (2 s each) and their 18 decoded tokens (3 s each), by hand. Catches
    the calibration's prompt count used for the workload's (a prefill share 3x too small)."""
    agree = np.ones((4, 6), bool)
    report = DraftExitReport(METRICS, COSTS, CFG.layer_kinds, num_draft=(3,),
                             runs=ExitRuns((agree,) * 3), loop=LOOP)
    decode = report.decode_speedup(2, 3)
    assert report.speedup(2, 3) == pytest.approx((3 * 2.0 + 18 * 3.0)
                                                 / (3 * 2.0 + 18 * 3.0 / decode))


def test_the_tables_played_tau_is_over_the_timed_prompts_only():
    """The loop timed on the first prompt, whose 6 positions all agree (K=3: 2 rounds, tau
    3), and a second prompt that never agrees (6 rounds): the table's check shows tau 3.00
    played beside the measured one, not 12 / 8 = 1.50. Catches the played tau taken over
    every prompt, which reads as a disagreement with the measured loop."""
    agree = (np.ones((4, 6), bool), np.zeros((4, 6), bool))
    report = DraftExitReport(METRICS, COSTS, CFG.layer_kinds, num_draft=(3,),
                             runs=ExitRuns(agree), loop=LOOP)
    assert "K=3: 9000.00 ms a round (pieces 8000.00 ms), tau 4.00 (played 3.00)" in \
        report.table()


def test_a_sampled_tables_check_and_hint_take_every_seed_and_the_sampling():
    """Sampled runs of 2 prompts x 4 seeds (seed-major), the loop timed on the first prompt:
    the table's played tau is over that prompt's 4 continuations (seed 0's all accepted, 2
    rounds; the others' none, 6 each: 24 / 20 = 1.20), and its bench hint carries the
    sampling. Catches the check read from seed 0 alone (3.00: one sample, 1.36-1.90 across
    seeds on the default model) or from the other prompt's rows, and a hint that measures
    greedy decoding."""
    first = [np.ones((4, 6), np.float32)] + [np.zeros((4, 6), np.float32)] * 3
    other = np.full((4, 6), 0.5, np.float32)
    rows = tuple(row for seed in range(SAMPLED_PLAYS) for row in (first[seed], other))
    sampling = SamplingParams(0.8, 0, 0.95)
    report = DraftExitReport(METRICS, COSTS, CFG.layer_kinds, num_draft=(3,),
                             runs=ExitRuns(rows, sampling=sampling), loop=LOOP)
    table = report.table()
    assert "tau 4.00 (played 1.20)" in table
    assert re.search(r"--num_draft=3 --temperature=0.8 --top_k=0 --top_p=0.95 --seeds=4$",
                     table, re.MULTILINE)


def test_with_top_k_1_a_sampled_draft_is_accepted_as_greedy_and_never_off_the_models_text():
    """A text made greedily by exit 1 alone (a one-layer model with the same head), played
    sampled at top-k 1 (p and q point masses): each exit's acceptance is its greedy agreement
    where the text is the model's own argmax, and 0 where the text leaves it (p(y) = 0: the
    verification rejects any draft there). Catches p floored to a tiny value there (exit 1,
    which agrees with that text everywhere, accepted with probability 1 where the model
    never emits its token), q without the sampling's filters (softmax of the raw logits: q(y)
    < 1 where the exit agrees; the statistical test of the sampled loop let it through at
    top-p 0.9), p read from an exit rather than the last layer, and q read from a
    neighbouring exit."""
    unstacked = unstack_layers(PARAMS, CFG)
    shallow = dataclasses.replace(CFG, num_layers=1, layer_pattern=None, exit_layers=None)
    text = model_continuations(Generator({**unstacked, "layers": unstacked["layers"][:1]},
                                         shallow), PROMPTS, max_new_tokens=12)
    greedy = exit_runs(PARAMS, CFG, PROMPTS, text)
    sampled = exit_runs(PARAMS, CFG, PROMPTS, text,
                        sampling=SamplingParams(temperature=1.0, top_k=1, top_p=1.0))
    for agree, accept in zip(greedy.accept, sampled.accept, strict=True):
        np.testing.assert_array_equal(accept, agree * agree[-1])
    assert greedy.rate(1) > 0.95 > greedy.rate(4)  # the text is exit 1's, not the model's


def test_on_workload_calibrates_on_its_first_prompts_over_the_draft_vocabulary(monkeypatch):
    """With the continuations, runs and calibration patched: the runs are played over the
    given draft ids, the loop is timed on the first `calibration_prompts` prompts at the exit
    the played report ranks first, and the report carries both. Catches every prompt timed (the
    calibration 4x longer on the default 8 prompts) and the draft ids dropped (agreement
    played over the whole vocabulary where the drafter drafts over N ids), and a sampled
    tuning's loop timed greedy (its rounds then costed without their sampling)."""
    prompts = [[1, 2], [3], [4, 5, 6], [7], [8]]
    ids, seen = np.arange(8), {}
    runs = ExitRuns((np.ones((4, 3), bool),) * len(prompts))

    def played(params, cfg, prompts, continuations, draft_ids=None, sampling=None):
        seen["draft_ids"] = draft_ids
        return runs

    def calibrated(generator, selfspec, prompts, pieces, **kwargs):
        seen.update(prompts=prompts, exit_layer=kwargs["exit_layer"],
                    sampling=kwargs["sampling"])
        return LOOP

    monkeypatch.setattr(exit_report_module, "model_continuations",
                        lambda generator, prompts, **_: [[9, 9, 9, 9]] * len(prompts))
    monkeypatch.setattr(exit_report_module, "exit_runs", played)
    monkeypatch.setattr(exit_report_module, "calibrate_loop", calibrated)
    report = DraftExitReport(METRICS, COSTS, CFG.layer_kinds, num_draft=(2, 3))
    sampling = SamplingParams(0.8, 0, 0.95)
    out = on_workload(report, PARAMS, CFG, None, None, prompts, max_new_tokens=4,
                      calibration_prompts=2, draft_ids=ids, sampling=sampling)
    assert seen.pop("draft_ids") is ids
    ranked = dataclasses.replace(report, runs=runs).best()[0]
    assert seen == {"prompts": prompts[:2], "exit_layer": ranked, "sampling": sampling}
    assert out.runs is runs and out.loop is LOOP
    assert out.workload == "5 prompts x 4 new tokens, sampled (4 seeds of each)"


class _Report:
    """A report of the tiny model's 4 layers, every exit predicted 2x, its loop calibrated."""

    num_layers = 4
    loop = LOOP

    @staticmethod
    def speedup(exit_layer, num_draft):
        return 2.0


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_tuning_plays_the_copying_drafters_over_the_reports_runs(base_workdir, monkeypatch,
                                                                 temperature):
    """`model.tune`, greedy and sampled, hands the tuner `played_speedup` bound to its
    workload report. Catches the played prediction dropped in one mode (every copying
    drafter probed: 13% of noise in tau where the play over 16 continuations has 5%) or bound
    to another report."""
    seen, report = {}, _Report()
    monkeypatch.setattr(api.LanguageModel, "_tune_report",
                        lambda self, *a, **k: seen.update(report=k) or report)
    monkeypatch.setattr(api, "tune", lambda *a, **k: seen.update(k) or "tuned")
    model = specjax.load(base_workdir)
    assert model.tune(["def f("], strategies=["selfspec"], num_draft=[2], trees=[], exits=1,
                      temperature=temperature, write=False) == "tuned"
    assert seen["played"].func is tune_module.played_speedup
    assert seen["played"].args == (report, model.config)
    forced = seen["played"].keywords["forced"]
    assert isinstance(forced, ForcedPlays) and forced.generator is model.generator
    assert seen["report"] == {"adapter": None}  # no Kangaroo loaded: no adapter timed


def test_tuning_times_a_loaded_kangaroos_adapter(base_workdir, monkeypatch):
    """With Kangaroo's weights loaded and Kangaroo among the strategies, `model.tune` has its
    report time the adapter (which prices Kangaroo's played rounds); without Kangaroo among
    them, not. Catches Kangaroo left to the probe (four compiled loops) for want of the
    adapter's cost."""
    seen = []
    monkeypatch.setattr(api.LanguageModel, "_tune_report",
                        lambda self, *a, **k: seen.append(k["adapter"]) or _Report())
    monkeypatch.setattr(api, "tune", lambda *a, **k: "tuned")
    model = specjax.load(base_workdir)
    adapter = init_adapter(model._loaded.params, CFG, 1)
    model._loaded = dataclasses.replace(model._loaded, draft_weights={
        "kangaroo": DraftWeights(adapter, exit_layer=1)})
    for strategies in (["selfspec", "kangaroo"], ["selfspec"]):
        model.tune(["def f("], strategies=strategies, num_draft=[2], trees=[], exits=1,
                   write=False)
    assert seen == [adapter, None]


def test_the_workload_report_drafts_over_the_workdirs_draft_vocabulary(base_workdir,
                                                                       monkeypatch):
    """The API's workload report times the draft head over the defaults' draft_vocab and
    plays the runs over the ids the generator drafts over. Catches the ids left out (tau
    played over the whole vocabulary for a workdir that drafts over N ids)."""
    seen = {}
    model = specjax.load(base_workdir)
    monkeypatch.setattr(model, "decoding_defaults",
                        dataclasses.replace(model.decoding_defaults, draft_vocab=4))
    monkeypatch.setattr(model.generator, "draft_ids", lambda defaults: jnp.arange(4))
    monkeypatch.setattr(api, "model_exit_report", lambda *a, **k: seen.update(k) or "report")
    monkeypatch.setattr(api, "on_workload", lambda *a, **k: seen.update(k) or "played")
    assert model._workload_report([[1, 2]], 4, print, None) == "played"
    assert seen["draft_vocab"] == 4
    np.testing.assert_array_equal(seen["draft_ids"], np.arange(4))


def test_exit_runs_carry_each_prompt_with_its_continuation_and_its_length():
    """Two prompts of distinct lengths: `texts` is each prompt followed by its continuation and
    `prompt_lengths` each prompt's own length (what `play_copied` starts its rounds after).
    Catches the texts missing the prompt (copying drafters played without the text they copy
    from) and a prompt length off by one (every played round shifted a position)."""
    prompts, continuations = [[1, 2, 3], [7]], [[4, 5, 6], [8, 9]]
    runs = exit_runs(PARAMS, CFG, prompts, continuations)
    assert runs.texts == ((1, 2, 3, 4, 5, 6), (7, 8, 9))
    assert runs.prompt_lengths == (3, 1)


def test_a_copied_proposals_seconds_are_one_proposals(monkeypatch):
    """With every timed loop scripted at 8 s, the drafter's `draft_seconds` is 8 s over the
    loop's TIMED_PROPOSALS proposals. Catches the proposal's time not divided by the loop's
    count (each round charged a whole loop of proposals)."""
    monkeypatch.setattr(copied_play_module, "timed", lambda f: (f(), 8.0)[1])
    runs = ExitRuns((), (tuple(range(1, 13)),), (4,))
    played = copied_play_module.play_copied(PromptLookup(shape=Chain(2)), CFG, runs,
                                              repeats=3)
    assert played.draft_seconds == pytest.approx(8.0 / copied_play_module.TIMED_PROPOSALS)


def test_the_timed_proposal_loop_alternates_its_end():
    """The timed loop's checksum is that of TIMED_PROPOSALS proposals, half at `end` and half
    one token earlier, by `_propose_at` directly. Catches every timed proposal made at the same
    end (a loop XLA may hoist the proposal out of: its time then counted once for eight)."""
    drafter = PromptLookup(shape=Chain(2))
    text = copied_play_module._padded([5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7])
    end = 10

    def checksum(at):
        tokens, valid, _ = jax.jit(lambda t, e: copied_play_module._propose_at(
            drafter, CFG, t, e))(text, jnp.int32(at))
        return int(jnp.sum(jnp.where(valid, tokens, 0)))

    assert checksum(end) != checksum(end - 1)  # the two ends propose differently: teeth
    loop = copied_play_module._proposal_loop(drafter, CFG)
    half = copied_play_module.TIMED_PROPOSALS // 2
    assert int(loop(text, jnp.int32(end), None)) == half * (checksum(end) + checksum(end - 1))


def test_an_uncalibrated_copying_prediction_charges_its_proposal():
    """Without a workload or a loop, a copying drafter's speed-up is tau x the pieces' plain
    token (4 x 2.0 + 0.5) over the verification of K + 1 tokens (4 x 2.75 + 0.8) plus its
    proposal's 0.5 s, by hand. Catches the proposal's seconds dropped from the pieces-only
    prediction."""
    report = DraftExitReport(METRICS, COSTS, CFG.layer_kinds, num_draft=(3,))
    assert report.copied_speedup(2.5, 3, 0.5) == pytest.approx(2.5 * 8.5 / (11.8 + 0.5))


def test_played_speedup_charges_the_played_proposals_seconds(monkeypatch):
    """With the play scripted (tau 2.5, 0.5 s a proposal), the tuner's played figure for ngram
    K=3 is the report's copied speed-up with those seconds, and None for selfspec or a report
    without a calibrated loop. Catches the played proposal's seconds dropped (suffix decoding
    predicted 18% high on SmolLM2) and a drafter that does not copy played anyway."""
    monkeypatch.setattr(tune_module, "play_copied",
                        lambda drafter, cfg, runs, **_: CopiedPlay(2.5, 0.5))
    report = DraftExitReport(METRICS, COSTS, CFG.layer_kinds, num_draft=(3,),
                             runs=ExitRuns((np.ones((4, 6), bool),)), loop=LOOP)
    drafter = PromptLookup(shape=Chain(3))
    assert tune_module.played_speedup(report, CFG, drafter) == pytest.approx(
        report.copied_speedup(2.5, 3, 0.5))
    assert report.copied_speedup(2.5, 3, 0.5) != pytest.approx(report.copied_speedup(2.5, 3))
    assert tune_module.played_speedup(report, CFG, SelfSpeculative(1, Chain(3))) is None
    assert tune_module.played_speedup(dataclasses.replace(report, loop=None), CFG,
                                      drafter) is None


def test_a_sampled_report_plays_every_copying_drafter_over_its_runs(monkeypatch):
    """Over a report's sampled runs, ngram and suffix decoding are both played over those
    runs (whose sampling the play reads), selfspec is not. Catches suffix decoding left to a
    probe in a sampled tuning (2 prompts, one seed: about 13% of noise in tau), and a
    copying drafter played over other runs than the report's."""
    seen = []
    monkeypatch.setattr(tune_module, "play_copied", lambda drafter, cfg, runs, **k: seen.append(
        (drafter.name, runs)) or CopiedPlay(2.5, 0.5))
    sampled = ExitRuns((np.ones((4, 2), np.float32),), ((1, 2, 3),), (1,),
                       SamplingParams(0.8, 0, 0.95), (np.full(2, 0.5),))
    report = DraftExitReport(METRICS, COSTS, CFG.layer_kinds, num_draft=(3,), runs=sampled,
                             loop=LOOP)
    for drafter in (PromptLookup(shape=Chain(3)), SuffixDecoding(shape=Chain(3))):
        assert tune_module.played_speedup(report, CFG, drafter) == pytest.approx(
            report.copied_speedup(2.5, 3, 0.5))
    assert seen == [("ngram", sampled), ("suffix", sampled)]
    assert tune_module.played_speedup(report, CFG, SelfSpeculative(1, Chain(3))) is None


def _mode(sampling):
    """A `SamplingParams`' settings as numbers (its fields are float32 device scalars: the
    tests' settings are exact in float32)."""
    return float(sampling.temperature), int(sampling.top_k), float(sampling.top_p)


def test_sampled_tuning_calibrates_its_report_in_its_mode(base_workdir, monkeypatch):
    """`model.tune` asks for its exit report with the tuning's sampling (None greedy), which
    times the report's loop (`_tune_report`, `on_workload`). Catches a sampled tuning whose
    report's loop is calibrated greedy (its rounds costed without their sampling: ngram K=2
    predicted 1.20x where sampled costs give 1.02x)."""
    asked = []
    monkeypatch.setattr(api.LanguageModel, "_tune_report",
                        lambda self, *a, **k: asked.append(a[-1]) or _Report())
    monkeypatch.setattr(api, "tune", lambda *a, **k: "tuned")
    model = specjax.load(base_workdir)
    for temperature in (0.5, 0.0):
        model.tune(["def f("], temperature=temperature, strategies=["selfspec"], num_draft=[2],
                   trees=[], exits=1, write=False)
    assert [None if s is None else _mode(s) for s in asked] == [(0.5, 0, 1.0), None]


def test_the_workload_reports_selfspec_is_built_in_its_mode(base_workdir, monkeypatch):
    """The API's workload report hands `model_exit_report` (which times the pieces) and
    `on_workload` the sampling, and the latter a selfspec factory that builds the strategy
    with that sampling (its tree="auto", if stored, is then the sampled mode's plan). Catches
    the factory built greedy (None) in a sampled tuning (the loop calibrated on the greedy
    mode's drafter), and the pieces timed greedy (ngram's sampled K=4 then predicted 0.71x
    against a bench's 0.56x on SmolLM2)."""
    seen, built, pieces = {}, [], {}
    model = specjax.load(base_workdir)
    monkeypatch.setattr(api, "model_exit_report",
                        lambda *a, **k: pieces.update(k) or "report")
    monkeypatch.setattr(api, "on_workload",
                        lambda report, params, cfg, generator, selfspec, *a, **k:
                        seen.update(k, selfspec=selfspec) or "played")
    monkeypatch.setattr(model, "strategy",
                        lambda name, sampling, prompts, **options:
                        built.append((name, sampling, options)) or "drafter")
    sampling = SamplingParams(0.8, 0, 0.95)
    assert model._workload_report([[1, 2]], 4, print, None, sampling) == "played"
    assert seen["sampling"] is sampling and seen["selfspec"](2, 3) == "drafter"
    assert pieces["sampling"] is sampling
    assert built == [("selfspec", sampling, {"exit_layer": 2, "num_draft": 3})]


@pytest.mark.parametrize("sampled", [False, True])
def test_on_workload_plays_each_mode_over_its_own_continuations(monkeypatch, sampled):
    """Greedy, `on_workload` plays the exits over one greedy continuation of each prompt;
    sampled, over SAMPLED_PLAYS continuations of each drawn with its sampling (seeds 0, 1,
    ...), seed by seed each prompt with its own continuation, and the exits' acceptance
    computed with that sampling. Catches a sampled report played over the greedy text (its
    tau greedy's), over one seed's (tau spread 1.36-1.90 across seeds on the default model),
    the prompts repeated prompt by prompt against continuations made seed by seed (each
    played after another prompt), and the acceptance computed greedy."""
    asked, played = [], {}
    sampling = SamplingParams(0.8, 0, 0.95) if sampled else None

    def continued(generator, prompts, *, max_new_tokens, sampling, seed):
        asked.append((sampling, seed))
        return [[100 + 10 * seed + i] * max_new_tokens for i in range(len(prompts))]

    def runs(params, cfg, prompts, continuations, draft_ids, sampling):
        played.update(prompts=prompts, continuations=continuations, sampling=sampling)
        return ExitRuns((np.ones((4, 2), np.float32),) * len(prompts), sampling=sampling)

    monkeypatch.setattr(exit_report_module, "model_continuations", continued)
    monkeypatch.setattr(exit_report_module, "exit_runs", runs)
    monkeypatch.setattr(exit_report_module, "calibrate_loop", lambda *a, **k: LOOP)
    report = DraftExitReport(METRICS, COSTS, CFG.layer_kinds, num_draft=(2,))
    prompts = [[1], [2, 3]]
    out = on_workload(report, PARAMS, CFG, None, None, prompts, max_new_tokens=3,
                      sampling=sampling)
    seeds = range(SAMPLED_PLAYS if sampled else 1)
    assert asked == [(sampling, seed) for seed in seeds]
    assert played["prompts"] == prompts * len(seeds)
    assert played["continuations"] == [[100 + 10 * seed + i] * 3 for seed in seeds
                                       for i in range(2)]
    assert played["sampling"] is sampling and out.runs.sampling is sampling


def test_the_loop_is_calibrated_in_its_mode(monkeypatch):
    """`calibrate_loop` benchmarks ar and selfspec with its `sampling` (greedy by default).
    Catches the sampling dropped: a sampled tuning's rounds costed as greedy ones (sampling
    took 31% of ar's token on the default model)."""
    asked, timed = [], {"ar": (10.0, 40), "K=2": (8.0, 20), "K=4": (6.0, 10)}

    def bench(generator, strategies, prompts, **kwargs):
        asked.append(kwargs.get("sampling"))
        return [types.SimpleNamespace(name=name, seconds=timed[name][0], prefill_seconds=2.0,
                                      stats=types.SimpleNamespace(rounds=timed[name][1],
                                                                  tau=1.5))
                for name in strategies]

    monkeypatch.setattr(loop_calibration_module, "run_benchmark", bench)
    sampling = SamplingParams(0.8, 0, 0.95)
    for mode in (sampling, None):
        calibrate_loop(None, lambda e, k: (e, k), [[1]], lambda e, k: 0.1 * k,
                       max_new_tokens=8, exit_layer=2, num_draft=(2, 4), sampling=mode)
    assert asked == [sampling, None]


def test_the_exit_report_is_sampled_at_a_temperature(base_workdir, monkeypatch):
    """`model.exit_report(temperature=, top_k=, top_p=)` hands its workload report that
    sampling (None at temperature 0), and a sampled report without the workload is a
    one-line error. Catches the settings dropped (a sampled user shown greedy rounds at
    greedy costs: sampling took 31% of ar's token on the default model) and a sampled
    held-out estimate (greedy agreement under a sampled label)."""
    asked = []
    monkeypatch.setattr(api.LanguageModel, "_workload_report",
                        lambda self, encoded, new, progress, texts, sampling, **o:
                        asked.append(sampling) or "report")
    model = specjax.load(base_workdir)
    assert model.exit_report(prompts=["def f("], temperature=0.8, top_p=0.95) == "report"
    assert model.exit_report(prompts=["def f("]) == "report"
    assert _mode(asked[0]) == pytest.approx((0.8, 0, 0.95)) and asked[1] is None
    with pytest.raises(ValueError, match="^a sampled report plays .* it needs workload=True$"):
        model.exit_report(workload=False, temperature=0.8)
    with pytest.raises(ValueError, match="^unknown option 'sampling'"):
        model.exit_report(sampling=asked[0])


def test_a_sampled_tuning_keeps_the_reports_figures_unprobed(monkeypatch):
    """Sampled, the exit report's figures are sampled too (its chains played over sampled
    continuations, its loop calibrated sampled): no selfspec chain is probed, each keeps its
    figure, and the report's best (exit 1, K=4) is confirmed with the tuning's sampling.
    Catches the report's figures trusted only greedy (the old ranking-only sampled mode: each
    exit's chains probed, two compilations each, and a probe's 13% noise for the play's)."""
    probed, modes = [], []
    bench = _scripted_bench({"selfspec exit_layer=1 num_draft=4": 2.2}, probed)
    monkeypatch.setattr(tune_module, "run_benchmark",
                        lambda *a, **k: modes.append(k["sampling"]) or bench(*a, **k))
    sampling = SamplingParams(0.8, 0, 0.95)
    tuning = tune_module.tune(None, lambda c: c.label, SELFSPEC_FOUND, [[1, 2]],
                              max_new_tokens=4, budget_s=60, started=time.perf_counter(),
                              sampling=sampling)
    assert probed == [] and modes == [sampling]
    assert [(row.source, row.predicted) for row in tuning.rows] == [
        ("exit report", c.predicted) for c in SELFSPEC_FOUND]
    assert [row.candidate for row in tuning.rows if row.confirmed] == [SELFSPEC_FOUND[1]]


def test_a_kinds_best_is_its_highest_prediction_whatever_its_source(monkeypatch):
    """Selfspec's report chains (best 2.5x at exit 1, K=4) beside a selfspec chain the report
    does not predict (exit 3, probed at 1.2x): the kind's best, the one confirmed, is the
    report's 2.5x. Catches a probe preferred over the report's figures within a kind (the
    old rule, when sampled figures were greedy's): the slow probed chain confirmed and the
    report's best never benchmarked."""
    probed = []
    monkeypatch.setattr(tune_module, "run_benchmark", _scripted_bench(
        {"selfspec exit_layer=3 num_draft=2": 1.2, "selfspec exit_layer=1 num_draft=4": 2.2},
        probed))
    unpredicted = tune_module.Candidate("selfspec", {"exit_layer": 3, "num_draft": 2})
    tuning = tune_module.tune(None, lambda c: c.label, [*SELFSPEC_FOUND, unpredicted],
                              [[1, 2]], max_new_tokens=4, budget_s=60,
                              started=time.perf_counter())
    assert probed == [unpredicted.label]
    assert [row.candidate for row in tuning.rows if row.confirmed] == [SELFSPEC_FOUND[1]]
    assert tuning.winner == SELFSPEC_FOUND[1]


def test_sampled_runs_cut_each_prompts_rows_at_its_own_continuation_past_the_first_pass():
    """Six prompts (two teacher-forced passes of ROWS_PER_PASS rows) whose continuations have
    six distinct lengths, sampled: each prompt's acceptance and target hold one column per
    token its rounds make, its own continuation's length less one. Catches a prompt's rows
    cut at the length of the continuation in its row of the pass instead of its own (the
    fifth prompt's at the first's), invisible when every continuation has the same length."""
    prompts = [list(range(10, 10 + n)) for n in (3, 5, 7, 9, 11, 2)]
    continuations = [list(range(60, 60 + n)) for n in (4, 9, 2, 6, 7, 3)]
    assert len(prompts) > ROWS_PER_PASS
    runs = exit_runs(PARAMS, CFG, prompts, continuations,
                     sampling=SamplingParams(temperature=1.0, top_k=0, top_p=1.0))
    made = [len(c) - 1 for c in continuations]
    assert [row.shape for row in runs.accept] == [(4, m) for m in made]
    assert [row.shape for row in runs.target] == [(m,) for m in made]


def test_the_runs_target_is_the_models_probability_of_each_of_its_tokens():
    """At top-k 1 the target's p(y) is 1 where the text's token is the model's argmax and 0
    elsewhere: over six prompts (two passes) continued by exit 1 alone (a text that leaves the
    model's argmax here and there), each prompt's `target` equals the last exit's greedy
    agreement along it. Catches p floored to 1 where it is 0 (a copy of a token the model
    never emits then accepted with its q), p read a position off, and a prompt's p read from
    another row of its pass."""
    unstacked = unstack_layers(PARAMS, CFG)
    shallow = dataclasses.replace(CFG, num_layers=1, layer_pattern=None, exit_layers=None)
    prompts = [list(range(10, 10 + n)) for n in (3, 5, 7, 9, 11, 2)]
    text = model_continuations(Generator({**unstacked, "layers": unstacked["layers"][:1]},
                                         shallow), prompts, max_new_tokens=12)
    greedy = exit_runs(PARAMS, CFG, prompts, text)
    sampled = exit_runs(PARAMS, CFG, prompts, text,
                        sampling=SamplingParams(temperature=1.0, top_k=1, top_p=1.0))
    agree = [row[-1].astype(np.float32) for row in greedy.accept]
    for p, model in zip(sampled.target, agree, strict=True):
        np.testing.assert_array_equal(p, model)
    assert 0 < np.concatenate(agree).mean() < 1  # the text leaves the model: teeth
    assert len({row.tobytes() for row in agree}) == len(prompts)  # rows differ: teeth


def test_each_sampled_text_is_played_with_its_own_target():
    """Two copies of a repeating text played sampled by prompt lookup (K=2, its drafts point
    masses): with the first copy's target p(y) 1 everywhere, a draft is accepted wherever it
    is the text's token (3 rounds, as greedy); with the second's 0 everywhere, none is (7
    rounds over its 7 positions). Catches every text played with the first text's target
    (or another's): the rounds of a text then depend on another's probabilities."""
    text = (5, 6, 7, 8) * 3
    drafter = PromptLookup(shape=Chain(2))
    runs = ExitRuns((), (text, text), (4, 4), SamplingParams(1.0, 0, 1.0),
                    (np.ones(7), np.zeros(7)))
    assert copied_rounds(drafter, CFG, runs).tolist() == [3.0, 7.0]
    assert copied_rounds(drafter, CFG, ExitRuns((), (text,), (4,))).tolist() == [3.0]


def test_a_right_draft_its_drafter_marks_invalid_is_not_played_accepted():
    """Greedy suffix decoding (K=2, factor 1) over the prompt 1 2 3 5 9 and the continuation
    1 2 3 6: the first round, after the pending 1 (matched by 1 token: one draft allowed),
    drafts 2 and an invalid 3 that the text has next: it accepts the 2 and makes the 3; the
    second drafts 5 against the text's 6: 2 rounds, not 1. Catches the greedy play ignoring
    `valid` (the loop never verifies an invalid draft), which the played rounds' tests let
    through: none of their invalid drafts was right."""
    drafter = SuffixDecoding(depth=4, min_prob=0.1, factor=1.0, shape=Chain(2))
    text = (1, 2, 3, 5, 9, 1, 2, 3, 6)
    tokens, valid, _ = copied_play_module._propose_at(
        drafter, CFG, copied_play_module._padded(text), jnp.int32(6))
    assert (tokens.tolist(), valid.tolist()) == ([2, 3], [True, False])  # teeth
    assert copied_rounds(drafter, CFG, ExitRuns((), (text,), (5,))).tolist() == [2.0]
