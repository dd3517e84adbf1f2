"""The tuner pinned where the fresh audit's plants got past tests/test_tune.py: which kinds the
confirmation runs, against a hand-picked answer on a scripted benchmark."""

import time
import types

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
        if labels != ["probe"]:
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
