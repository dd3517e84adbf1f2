"""The tuner: which drafter, with which options, decodes a model's prompts fastest.

Every strategy the workdir can run is a candidate (`candidates`): the model-free ones (ngram,
suffix, lookahead), selfspec at the exits the exit report ranks first, each strategy whose
trained weights are loaded, each chain with a small grid of `num_draft`, and a static tree for
each strategy that drafts trees. A candidate's prediction is a short measurement against `ar`
on a few prompts (a probe), except for selfspec's chains, which the exit report predicts on
the same prompts: played over the model's continuations of them (greedy, or sampled:
`exit_report.on_workload`) and calibrated on the real decode loop in the same mode, its
figures are the benchmark's, so they compete with the probes as they are; so do the figures
of the drafters that copy from the text (ngram, suffix: `played_speedup`), whose rounds are
played over the same continuations, greedy or sampled, and costed by the same calibrated
loop; so do selfspec's static trees, played over the exits' chances along the same
continuations (`DraftExitReport.tree_speedup`; sampled, at most two children per node), and
Kangaroo's and a draft model's chains and trees, played over runs of their own drafts from
one teacher-forced pass (`exit_workload.ForcedPlays`) and priced by `FORCED_ROUNDS`.
The best of each kind (a strategy's chains, its trees), the few best kinds, are confirmed
on all the prompts with the benchmark's interleaved measurement (`tools.bench.run_benchmark`);
the fastest wins, plain decoding when none beats it. Probes decode as many tokens as the
confirmation, whose programs they compile, a few candidates to a benchmark beside one `ar`
(`PROBE_BATCH`).

A time budget stops the search: no batch of probes starts after it is spent, and then the best
prediction so far wins unconfirmed (the table says so).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from specjax.config import ModelConfig
from specjax.decoding.drafter import Drafter
from specjax.decoding.engine import AUTOREGRESSIVE, Generator
from specjax.decoding.registry import STRATEGIES, DecodingConfig, make_strategy, options_read
from specjax.decoding.sampling import SamplingParams
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.tools.bench import StrategyResult, run_benchmark
from specjax.tools.copied_play import play_copied
from specjax.tools.exit_report import DraftExitReport
from specjax.tools.exit_workload import ForcedPlays

NUM_DRAFTS = (2, 4, 6)  # the grid of a chain's drafts per round
TREE = "2,2,1,1"  # the static tree tried for each strategy that drafts trees
# Candidates probed together beside one `ar` (which then compiles once, not once each); the
# budget is read between such batches.
PROBE_BATCH = 4
EXITS = "selfspec"  # the strategy that drafts from the model's own exits
FORCED_ROW = 1  # a drafter's own runs (`exit_workload.exit_runs` with it): their one row
# The baseline, a lossy early exit, a drafter that needs its own search (skip_layers) or its
# own classifier, and a composite of the others: not candidates.
LEFT_OUT = ("ar", "calm", "calmdraft", "skip", "mixed")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A strategy with options overriding the workdir's decoding defaults, and the exit
    report's predicted speed-up when it has one."""

    strategy: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    predicted: float | None = None

    @property
    def label(self) -> str:
        return " ".join([self.strategy, *(f"{k}={v}" for k, v in self.options.items())])

    @property
    def kind(self) -> str:
        """Candidates of one kind compete on prediction; the best of each may be confirmed."""
        return self.strategy + (" tree" if "tree" in self.options else "")


@dataclasses.dataclass(frozen=True)
class Row:
    """One candidate's line of the table: its prediction and where it came from ("exit
    report", "probe", "out of budget", "refused: ..."), and its confirmed result, if any."""

    candidate: Candidate
    predicted: float | None
    source: str
    confirmed: StrategyResult | None = None


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The table, the winner (strategy "ar": nothing beat plain decoding), whether it was
    confirmed (False: the budget ran out first), the seconds spent and the prompts used."""

    rows: list[Row]
    winner: Candidate
    confirmed: bool
    seconds: float
    num_prompts: int

    @property
    def winner_speedup(self) -> float | None:
        """The winner's confirmed speed-up over ar (1 for ar), else its prediction."""
        if self.winner.strategy == "ar":
            return 1.0
        row = next(r for r in self.rows if r.candidate == self.winner)
        return row.confirmed.speedup if row.confirmed else row.predicted

    def table(self) -> str:
        lines = [f"{'candidate':<40}{'report':>7}{'predicted':>10}  {'from':<14}"
                 f"{'confirmed':>10}{'tau':>6}"]
        for row in sorted(self.rows, key=_rank):
            predicted = "-" if row.predicted is None else f"{row.predicted:.2f}x"
            report = row.candidate.predicted
            report = "" if report is None else f"{report:.2f}x"
            done = row.confirmed
            lines.append(f"{row.candidate.label:<40}{report:>7}{predicted:>10}  {row.source:<14}"
                         + (f"{done.speedup:9.2f}x{done.stats.tau:6.2f}" if done else ""))
        how = (f"confirmed over ar on {self.num_prompts} prompts" if self.confirmed else
               "unconfirmed: the budget ran out before the confirmation; the best prediction")
        lines.append(f"winner: {self.winner.label}, {self.winner_speedup:.2f}x ({how}; "
                     f"{self.seconds:.0f} s)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"winner": {"strategy": self.winner.strategy, "options": dict(self.winner.options),
                           "speedup": self.winner_speedup},
                "confirmed": self.confirmed, "seconds": self.seconds,
                "num_prompts": self.num_prompts,
                "rows": [{"candidate": r.candidate.label, "report": r.candidate.predicted,
                          "predicted": r.predicted, "from": r.source,
                          "confirmed_speedup": r.confirmed.speedup if r.confirmed else None,
                          "tau": r.confirmed.stats.tau if r.confirmed else None}
                         for r in self.rows]}


def tunable(weights: Collection[str]) -> list[str]:
    """The strategies a workdir can run: every registered one but `LEFT_OUT`, those that draft
    with trained weights only when theirs are loaded (`weights`: their strategy names)."""
    return [name for name in STRATEGIES if name not in LEFT_OUT
            and (name in weights or not make_strategy(name, DecodingConfig()).needs_weights)]


def candidates(strategies: Sequence[str], defaults: DecodingConfig,
               report: DraftExitReport | None = None, *, exits: int = 2,
               num_draft: Sequence[int] = NUM_DRAFTS,
               trees: Sequence[str] = (TREE,)) -> list[Candidate]:
    """Each strategy's candidates: a chain per `num_draft` where it reads num_draft (one
    candidate with its defaults where it does not), and each of `trees` where it reads a tree.
    Selfspec's are at the `exits` exits with the best predicted speed-up in `report` (which
    must predict `num_draft`), its chains carrying their predictions (its trees at the best
    exit); none without a report."""
    found = []
    for name in strategies:
        at_exits: list[dict[str, Any]] = [{}]
        if name == EXITS:
            at_exits = [{"exit_layer": e} for e in _best_exits(report, exits, num_draft)]
        for base in at_exits:
            chain = options_read(name, defaults)
            if "num_draft" in chain:
                found += [Candidate(name, {**base, "num_draft": k},
                                    report.speedup(base["exit_layer"], k) if base else None)
                          for k in num_draft]
            else:
                found.append(Candidate(name, base))
            if "tree" in chain and base == at_exits[0]:
                found += [Candidate(name, {**base, "tree": tree}) for tree in trees]
    return found


def _best_exits(report: DraftExitReport | None, count: int,
                num_draft: Sequence[int]) -> list[int]:
    """The `count` exits (1..L-1) whose best predicted speed-up over `num_draft` is highest."""
    if report is None:
        return []
    exits = range(1, report.num_layers)
    return sorted(exits, key=lambda e: -max(report.speedup(e, k) for k in num_draft))[:count]


def tune(generator: Generator, build: Callable[[Candidate], Drafter],
         found: Sequence[Candidate], prompts: Sequence[Sequence[int]], *,
         max_new_tokens: int, budget_s: float, started: float,
         sampling: SamplingParams | None = None,
         played: Callable[[Drafter], float | None] | None = None,
         confirm: int = 3, probe_prompts: int = 2,
         repeats: int = 3,
         progress: Callable[[str], None] = lambda line: None) -> Tuning:
    """Predicts each candidate (`build` makes its drafter; a ValueError refuses it), confirms
    the best `confirm` kinds on `prompts` and picks the fastest (see the module docstring).
    A candidate's `predicted` (the exit report's on these prompts, played and calibrated in
    `sampling`'s mode: `exit_report.on_workload` with the same sampling) stands as its
    prediction; `played` predicts a drafter without a probe where it can (None where it
    cannot). The budget counts from `started` (`time.perf_counter()`), so that work done
    before, such as the exit report, counts too; at least one candidate is always
    predicted."""
    rows: list[Row | None] = []  # None: a probe pending in `batch`, by its row's index
    drafters: dict[str, Drafter] = {}  # by label
    batch: dict[int, Candidate] = {}

    def probe() -> None:
        """The pending candidates probed in one benchmark beside one `ar`."""
        progress(f"probing {', '.join(c.label for c in batch.values())} ...")
        results = run_benchmark(generator, {"ar": AUTOREGRESSIVE, **{
            c.label: drafters[c.label] for c in batch.values()}}, prompts[:probe_prompts],
            max_new_tokens=max_new_tokens, repeats=1, sampling=sampling)
        speedups = {result.name: result.speedup for result in results}
        for index, candidate in batch.items():
            rows[index] = Row(candidate, speedups[candidate.label], "probe")
        batch.clear()

    for candidate in found:
        spent = time.perf_counter() - started >= budget_s
        if spent and (batch or any(row.predicted is not None for row in rows)):
            rows.append(Row(candidate, None, "out of budget"))
            continue
        try:
            drafters[candidate.label] = build(candidate)
        except ValueError as error:
            rows.append(Row(candidate, None, f"refused: {error}"))
            continue
        predicted = None if played is None else played(drafters[candidate.label])
        if predicted is not None:
            rows.append(Row(candidate, predicted, "played"))
            continue
        if candidate.predicted is not None:
            rows.append(Row(candidate, candidate.predicted, "exit report"))
            continue
        batch[len(rows)] = candidate
        rows.append(None)
        if len(batch) == PROBE_BATCH:
            probe()
    if batch:
        probe()
    best = _best_of_kinds(rows, confirm)
    if not best:
        raise ValueError("no candidate could be built: " + "; ".join(
            f"{row.candidate.label}: {row.source}" for row in rows))
    if time.perf_counter() - started >= budget_s:
        return Tuning(rows, best[0].candidate, False, time.perf_counter() - started,
                      len(prompts))
    progress(f"confirming {', '.join(row.candidate.label for row in best)} on {len(prompts)} "
             "prompts ...")
    results = run_benchmark(generator, {"ar": AUTOREGRESSIVE, **{
        row.candidate.label: drafters[row.candidate.label] for row in best}}, prompts,
        max_new_tokens=max_new_tokens, repeats=repeats, sampling=sampling)
    by_label = {result.name: result for result in results}
    rows = [dataclasses.replace(row, confirmed=by_label.get(row.candidate.label))
            if row in best else row for row in rows]
    fastest = max((row for row in rows if row.confirmed), key=lambda r: r.confirmed.speedup)
    winner = fastest.candidate if fastest.confirmed.speedup > 1 else Candidate("ar")
    return Tuning(rows, winner, True, time.perf_counter() - started, len(prompts))


def played_speedup(report: DraftExitReport, cfg: ModelConfig, drafter: Drafter,
                   forced: ForcedPlays | None = None) -> float | None:
    """The speed-up of a drafter that copies from the text, played over the report's
    continuations (`copied_play.play_copied`) in their mode (greedy or sampled, its
    proposal drawn with the runs' sampling), costed by the report's calibrated loop and the
    proposal's measured seconds; of selfspec with a static tree the runs can play
    (`ExitRuns.plays_tree`: greedy, or sampled with at most two children per node), played
    over the exit's chances there (`DraftExitReport.tree_speedup`); of Kangaroo and a draft
    model (drafters that `plays_forced`), played over their own runs (`forced`:
    `exit_workload.ForcedPlays`) as selfspec's chains and trees are, each round priced by
    `FORCED_ROUNDS`: Kangaroo's is selfspec's plus the adapter's block in each draft pass
    and on the leaves (when the report timed the adapter), a draft model's its own passes
    (its pieces timed once) and the target's whole verification. None for any other
    drafter or shape (a chain that stops early), or a report not on a workload."""
    runs = report.runs
    if runs is None or report.loop is None:
        return None
    if drafter.name == EXITS:
        if (isinstance(drafter.shape, StaticTree) and runs.plays_tree(drafter.shape)
                and drafter.draft_vocab == report.costs.draft_vocab):
            return report.tree_speedup(drafter.exit_layer, drafter.shape)
        return None
    if drafter.plays_forced:
        return None if forced is None else _forced_speedup(report, drafter, forced)
    if not drafter.copies_text:
        return None
    played = play_copied(drafter, cfg, runs)
    return report.copied_speedup(played.tau, drafter.shape.num_draft, played.draft_seconds)


def _forced_speedup(report: DraftExitReport, drafter: Drafter,
                    forced: ForcedPlays) -> float | None:
    """The speed-up of a drafter that `plays_forced`, played over its own runs and priced by
    its entry in `FORCED_ROUNDS` (`played_speedup`); None for a chain that stops early, a
    tree its runs cannot play, or a round its entry cannot price."""
    shape = drafter.shape
    if shape.is_chain and not (shape.stop_below or shape.stop_risk):
        tree = StaticTree.from_branching((1,) * shape.num_draft)
    elif isinstance(shape, StaticTree):
        tree = shape
    else:
        return None
    price = FORCED_ROUNDS.get(drafter.name)
    own = None if price is None else forced(drafter, report.runs)
    if own is None or not own.plays_tree(tree):
        return None
    seconds = price(report, drafter, tree, forced)
    return None if seconds is None else report.round_speedup(own.tree_tau(FORCED_ROW, tree),
                                                             seconds)


def _kangaroo_round(report: DraftExitReport, drafter: Drafter, tree: StaticTree,
                    forced: ForcedPlays) -> float | None:
    """Selfspec's round at the adapter's exit plus the adapter's block in each draft pass and
    on the leaves (None when the report did not time the adapter, or drafts over another
    vocabulary than the drafter's)."""
    if not report.costs.adapter or drafter.draft_vocab != report.costs.draft_vocab:
        return None
    return report.costs.tree_round(report.layer_kinds, drafter.exit_layer, tree, adapter=True)


def _draft_model_round(report: DraftExitReport, drafter: Drafter, tree: StaticTree,
                       forced: ForcedPlays) -> float:
    """The draft model's passes (its own pieces, timed once per draft model in the runs'
    mode: `ForcedPlays.draft_costs`) and the target's whole verification."""
    draft, draft_kinds = forced.draft_costs(drafter, report.costs, report.runs.sampling)
    return report.costs.drafted_round(report.layer_kinds, tree, draft, draft_kinds)


# How the tuner prices a round of each drafter that `plays_forced`, by strategy name.
FORCED_ROUNDS: dict[str, Callable[..., float | None]] = {
    "kangaroo": _kangaroo_round, "draft": _draft_model_round}


def _best_of_kinds(rows: Sequence[Row], count: int) -> list[Row]:
    """The best predicted row of each kind, the `count` best of those."""
    best: dict[str, Row] = {}
    for row in rows:
        kind = row.candidate.kind
        if row.predicted is not None and (kind not in best
                                          or row.predicted > best[kind].predicted):
            best[kind] = row
    return sorted(best.values(), key=lambda row: -row.predicted)[:count]


def _rank(row: Row) -> tuple:
    """Table order: confirmed rows fastest first, then by prediction, then the rest."""
    if row.confirmed:
        return (0, -row.confirmed.speedup)
    return (1, -row.predicted) if row.predicted is not None else (2, 0.0)
