"""Figures for notebooks and reports. Each function returns a matplotlib `Figure` of its own (no
pyplot state): a notebook displays it, `figure.savefig(path)` renders it with Agg.

    from specjax import plots
    plots.training_curves("runs/tiny")
    plots.highlight_drafts(model.tokenizer, model.generate("def main("))  # HTML in a notebook
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from specjax.decoding.shapes.static_tree import node_depths
from specjax.tokenizer import Tokenizer
from specjax.training.metrics_log import MetricsLog

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from specjax.api import Completion
    from specjax.tools.exit_report import DraftExitReport

DRAFT_COLOURS = ("#c7e9c0", "#a1d99b", "#74c476", "#41ab5d", "#238b45", "#006d2c")


def image_format(path: str, flag: str = "--plot") -> str:
    """The image format `path`'s extension names ("png" without one), for `savefig`'s
    `format=` (an output is written under a temporary name whose extension says nothing); a
    one-line error naming `flag` for one matplotlib cannot write, before any work."""
    from matplotlib.backend_bases import FigureCanvasBase

    extension = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    supported = FigureCanvasBase.get_supported_filetypes()
    if extension not in supported:
        raise ValueError(f"{flag} {path}: matplotlib writes no .{extension} images; use one of "
                         f"{', '.join('.' + name for name in sorted(supported))}")
    return extension


def _figure(width: float = 10, height: float = 4) -> Figure:
    from matplotlib.figure import Figure  # only for plots: `import specjax` stays light

    return Figure(figsize=(width, height), layout="constrained")


def training_curves(workdir_or_records: str | Sequence[Mapping[str, Any]]) -> Figure:
    """A run's `metrics.jsonl` (a workdir, or its records): the training cross-entropy of every
    supervised exit by step, and at each evaluation every supervised exit's held-out loss and
    agreement with the last layer (the greedy acceptance of a draft from it)."""
    records = workdir_or_records
    if isinstance(records, str):
        records = MetricsLog(records, writable=False).read()
    train = [r for r in records if r.get("split") == "train"]
    evals = [r for r in records if r.get("split") == "eval"]
    exits = sorted({int(e) for r in train for e in r.get("exit_ce", {})})
    figure = _figure(13, 4)
    ce, loss, agree = figure.subplots(1, 3)
    for e in exits:
        steps = [r["step"] for r in train if str(e) in r["exit_ce"]]
        ce.plot(steps, [r["exit_ce"][str(e)] for r in train if str(e) in r["exit_ce"]],
                label=f"exit {e}")
        if evals:
            eval_steps = [r["step"] for r in evals]
            loss.plot(eval_steps, [r["exit_loss"][e - 1] for r in evals], "o-", label=f"exit {e}")
            agree.plot(eval_steps, [r["exit_agreement"][e - 1] for r in evals], "o-",
                       label=f"exit {e}")
    for axis, title in ((ce, "training cross-entropy"), (loss, "held-out loss"),
                        (agree, "agreement with the last layer")):
        axis.set_title(title)
        axis.set_xlabel("step")
        if exits:
            axis.legend(fontsize=8)
    return figure


def exit_report(report: DraftExitReport) -> Figure:
    """An exit report (`infer/exit_report.py`, `LanguageModel.exit_report`): agreement with the last
    layer and top-1 accuracy by exit, and the predicted speed-up by draft exit for a few K."""
    figure = _figure()
    quality, speed = figure.subplots(1, 2)
    exits = list(range(1, report.num_layers + 1))
    quality.plot(exits, report.metrics.agreement, "o-", label="agreement with last layer")
    quality.plot(exits, report.metrics.accuracy, "s--", label="top-1 accuracy")
    quality.set_xticks(exits)
    quality.set_xlabel("exit (layers run)")
    quality.set_ylim(0, 1.02)
    quality.legend()
    draft_exits = exits[:-1] or exits
    drafts = report.num_draft
    for k in sorted({drafts[0], drafts[len(drafts) // 2], drafts[-1]}):
        speed.plot(draft_exits, [report.speedup(e, k) for e in draft_exits], "o-",
                   label=f"K={k}")
    speed.axhline(1.0, color="grey", linewidth=0.8)
    speed.set_xticks(draft_exits)
    speed.set_xlabel("draft exit E")
    speed.set_ylabel("predicted speed-up over plain decoding")
    speed.legend()
    figure.suptitle(f"exit report ({report.metrics.tokens} held-out tokens; estimates)")
    return figure


def speedup_heatmap(rows: Sequence[Mapping[str, Any]], *, row_key: str = "exit_layer",
                    column_key: str = "num_draft", value_key: str = "speedup") -> Figure:
    """A grid of `value_key` (e.g. a bench sweep's speed-up over `ar`) by two settings, each
    cell annotated; `rows` are dicts holding the three keys (missing cells stay blank)."""
    ys = sorted({r[row_key] for r in rows})
    xs = sorted({r[column_key] for r in rows})
    grid = np.full((len(ys), len(xs)), np.nan)
    for r in rows:
        grid[ys.index(r[row_key]), xs.index(r[column_key])] = r[value_key]
    figure = _figure(1.2 * len(xs) + 3, 0.8 * len(ys) + 2)
    axis = figure.subplots()
    image = axis.imshow(grid, cmap="viridis", aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        if not np.isnan(value):
            axis.text(j, i, f"{value:.2f}", ha="center", va="center", color="white", fontsize=9)
    axis.set_xticks(range(len(xs)), [str(x) for x in xs])
    axis.set_yticks(range(len(ys)), [str(y) for y in ys])
    axis.set_xlabel(column_key)
    axis.set_ylabel(row_key)
    figure.colorbar(image, ax=axis, label=value_key)
    return figure


def acceptance_by_depth(curves: Mapping[str, Sequence[float]]) -> Figure:
    """Per labelled run, the fraction of rounds whose accepted drafts reach depth d
    (`Completion.acceptance_by_depth`), against d."""
    figure = _figure(6, 4)
    axis = figure.subplots()
    for label, fractions in curves.items():
        axis.plot(range(1, len(fractions) + 1), fractions, "o-", label=label)
    axis.set_xlabel("draft depth d")
    axis.set_ylabel("rounds that accept a draft at depth d")
    axis.set_ylim(0, 1.02)
    axis.legend(fontsize=8)
    return figure


def draw_tree(parents: Sequence[int], axis: Axes | None = None, title: str = "") -> Figure:
    """A proposal tree from its parents list (-1: the pending token, drawn as the root), one
    level per depth, each node's children side by side under it."""
    depth = [int(d) for d in node_depths(parents)]
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(int(parent), []).append(node)
    x: dict[int, float] = {}

    def place(node: int, left: float) -> float:
        kids = children.get(node, [])
        if not kids:
            x[node] = left
            return left + 1
        right = left
        for kid in kids:
            right = place(kid, right)
        x[node] = (x[kids[0]] + x[kids[-1]]) / 2
        return right

    place(-1, 0.0)
    if axis is None:
        figure = _figure(max(3, 0.5 * len(parents) + 1), 0.6 * (max(depth, default=0) + 2))
        axis = figure.subplots()
    else:
        figure = axis.figure
    for node, parent in enumerate(parents):
        axis.plot([x[int(parent)], x[node]], [-(depth[node] - 1), -depth[node]], color="grey",
                  linewidth=1)
    axis.scatter([x[-1]], [0], s=60, color="black")
    axis.scatter([x[n] for n in range(len(parents))], [-d for d in depth], s=40,
                 color="tab:green")
    axis.set_axis_off()
    axis.set_title(title or f"{len(parents)} nodes, depth {max(depth, default=0)}", fontsize=9)
    return figure


def calm_curve(rows: Sequence[Mapping[str, float]], num_layers: int, title: str,
               calibrated: float | None = None) -> Figure:
    """CALM's quality against its speed-up, one point per threshold λ (`bench/calm_quality.py`'s
    rows: threshold, mean_exit, speedup, agreement, log_loss), the calibrated λ marked."""
    figure = _figure()
    agree, loss = figure.subplots(1, 2)
    speedups = [r["speedup"] for r in rows]
    for axis, key, label in ((agree, "agreement", "ROUGE-L F1 with full greedy output"),
                             (loss, "log_loss", "per-token loss on held-out text (nats)")):
        axis.plot(speedups, [r[key] for r in rows], "o-")
        for r in rows:
            mark = " (calibrated)" if r["threshold"] == calibrated else ""
            axis.annotate(f"λ={r['threshold']:g}, exit {r['mean_exit']:.1f}{mark}",
                          (r["speedup"], r[key]), fontsize=7, xytext=(4, 4),
                          textcoords="offset points")
        axis.axvline(1.0, color="grey", linewidth=0.8)
        axis.set_xlabel("speed-up over ar (batch 1)")
        axis.set_ylabel(label)
    figure.suptitle(f"CALM on a {num_layers}-layer model: {title}")
    return figure


def risk_curve(grid: Sequence[float], risks: Sequence[float], p_values: Sequence[float],
               delta: float, epsilon: float, chosen: float | None = None) -> Figure:
    """Learn then Test over a grid of thresholds (`tools.learn_then_test.Calibration`): the
    empirical risk against δ and each point's p-value against ε, the certified value marked."""
    figure = _figure()
    risk, p_value = figure.subplots(1, 2)
    risk.plot(grid, risks, "o-")
    risk.axhline(delta, color="tab:red", linestyle="--", label=f"δ = {delta:g}")
    risk.set_ylabel("empirical risk")
    p_value.semilogy(grid, np.maximum(p_values, 1e-12), "o-")
    p_value.axhline(epsilon, color="tab:red", linestyle="--", label=f"ε = {epsilon:g}")
    p_value.set_ylabel("Hoeffding–Bentkus p-value")
    for axis in (risk, p_value):
        if chosen is not None:
            axis.axvline(chosen, color="tab:green", label=f"certified λ = {chosen:g}")
        axis.set_xlabel("threshold λ")
        axis.invert_xaxis()  # from the safest value, as the fixed-sequence test walks
        axis.legend(fontsize=8)
    return figure


def exit_heatmap(exits: Sequence[Sequence[int]], num_layers: int) -> Figure:
    """The exit layer of every generated token (rows: prompts, columns: tokens; CALM's
    `trace["exit"]`), darker for tokens that ran more layers."""
    width = max((len(row) for row in exits), default=0)
    grid = np.full((len(exits), width), np.nan)
    for i, row in enumerate(exits):
        grid[i, :len(row)] = row
    figure = _figure(10, 0.4 * len(exits) + 1.5)
    axis = figure.subplots()
    image = axis.imshow(grid, cmap="Blues", vmin=0, vmax=num_layers, aspect="auto",
                        interpolation="nearest")
    axis.set_xlabel("generated token")
    axis.set_ylabel("prompt")
    figure.colorbar(image, ax=axis, label="exit layer")
    return figure


class DraftHighlight:
    """A completion's text with each accepted draft shaded by its depth (darker: deeper) and
    the target's own tokens plain; a notebook renders it as HTML (`_repr_html_`)."""

    def __init__(self, pieces: Sequence[tuple[str, int]]):
        self.pieces = list(pieces)

    def _repr_html_(self) -> str:
        spans = []
        for text, depth in self.pieces:
            escaped = html.escape(text)
            if depth > 0 and text:
                colour = DRAFT_COLOURS[min(depth, len(DRAFT_COLOURS)) - 1]
                escaped = (f'<span style="background:{colour}" title="draft at depth {depth}">'
                           f"{escaped}</span>")
            spans.append(escaped)
        return ('<pre style="white-space:pre-wrap;font-family:monospace">' + "".join(spans)
                + "</pre>")

    def __str__(self) -> str:
        return "".join(text for text, _ in self.pieces)


def highlight_drafts(tokenizer: Tokenizer, completion: Completion) -> DraftHighlight:
    """`completion`'s tokens as text pieces tagged with the depth of the draft that produced
    each (0: the target's token). A piece is what the token adds to the decoded text, so a
    character spread over several byte tokens lands on the last of them."""
    pieces, decoded = [], ""
    depths = completion.trace["depth"]
    for i, depth in enumerate(depths):
        text = tokenizer.decode(completion.tokens[:i + 1])
        if text.endswith("\ufffd") and i + 1 < len(depths):  # a character not yet complete
            pieces.append(("", int(depth)))
            continue
        pieces.append((text[len(decoded):], int(depth)))
        decoded = text
    return DraftHighlight(pieces)
