"""The tuner pinned where the fresh audit's plants got past tests/test_tune.py: which kinds the
confirmation runs, against a hand-picked answer on a scripted benchmark, and which exits it
tries, against a hand-built report whose best exit changes with num_draft; and a tuning with
no candidate left (issue 52's scan)."""

import time
import types

import pytest

from specjax.decoding.registry import DecodingConfig
from specjax.tools import tune as tuner

SPEEDS = {"ngram": 1.1, "suffix": 1.5, "lookahead": 1.3, "draft num_draft=4": 1.9}


def test_the_confirmation_runs_the_kinds_with_the_best_predictions(monkeypatch):
    """Four kinds probed at 1.1x, 1.5x, 1.3x and 1.9x with `confirm=2`: the confirmation
    benchmarks exactly the two fastest (1.9x, 1.5x) and the fastest of them wins. Catches the
    kinds' best rows sorted the wrong way (the two slowest confirmed, and a slower drafter
    stored as the workdir's default) or cut to other than `confirm` kinds."""
    confirmed = []

    def bench(generator, strategies, prompts, **kwargs):
        labels = [label for label in strategies if label != "ar"]
        if kwargs["repeats"] != 1:  # probes run one repeat
            confirmed.append(sorted(labels))
        return [types.SimpleNamespace(
            name=label, speedup=1.0 if label == "ar" else SPEEDS[strategies[label]],
            stats=types.SimpleNamespace(tau=2.0)) for label in strategies]

    monkeypatch.setattr(tuner, "run_benchmark", bench)
    found = [tuner.Candidate("ngram"), tuner.Candidate("suffix"), tuner.Candidate("lookahead"),
             tuner.Candidate("draft", {"num_draft": 4})]
    tuning = tuner.tune(None, lambda c: c.label, found, [[1, 2]], max_new_tokens=4,
                        budget_s=60, started=time.perf_counter(), confirm=2)
    assert confirmed == [["draft num_draft=4", "suffix"]]
    assert [row.predicted for row in tuning.rows] == [1.1, 1.5, 1.3, 1.9]
    assert tuning.winner == found[3] and tuning.confirmed and tuning.winner_speedup == 1.9


class _CrossingReport:
    """A 4-layer exit report, speed-ups by hand: exit 1 is best with few drafts, exit 3 with
    many (its agreement is high, each round costs more), exit 2 never."""

    num_layers = 4
    TABLE = {(1, 2): 1.6, (1, 6): 1.2, (2, 2): 1.3, (2, 6): 1.4, (3, 2): 1.1, (3, 6): 2.0}

    def speedup(self, exit_layer, num_draft):
        return self.TABLE[exit_layer, num_draft]


def test_selfspec_exits_are_ranked_by_their_best_num_draft():
    """The exits kept are those whose best speed-up over every num_draft is highest: exit 3
    (2.0x at K=6) and exit 1 (1.6x at K=2), not exit 2 (1.4x at best). Catches the exits
    ranked by the first num_draft's figure alone (exit 3, the report's best, would be left
    out, and the tuner would never try it)."""
    found = tuner.candidates(["selfspec"], DecodingConfig(), _CrossingReport(), exits=2,
                             num_draft=[2, 6], trees=[])
    assert [(c.options["exit_layer"], c.options["num_draft"], c.predicted) for c in found] == [
        (3, 2, 1.1), (3, 6, 2.0), (1, 2, 1.6), (1, 6, 1.2)]


def test_a_tuning_where_every_candidate_is_refused_names_each_refusal():
    """Every candidate's build refused (a ValueError each): one line listing each label and
    its refusal, before anything is timed. Catches the check dropped: `max()` of no rows (a
    raw ValueError) or a winner picked from nothing."""
    def refuse(candidate):
        raise ValueError(f"{candidate.strategy} needs its weights")

    found = [tuner.Candidate("eagle"), tuner.Candidate("medusa", {"num_draft": 2})]
    with pytest.raises(ValueError, match="^no candidate could be built: eagle: refused: eagle "
                                         "needs its weights; medusa num_draft=2: refused: "
                                         "medusa needs its weights$"):
        tuner.tune(None, refuse, found, [[1, 2]], max_new_tokens=4, budget_s=60.0,
                   started=time.perf_counter())
