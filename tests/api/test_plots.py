"""`specjax.plots` renders every figure to PNG without a display, from the records the library
produces, and shades accepted drafts in text by depth."""

import io
import json

import pytest

from specjax import plots
from specjax.api import Completion
from specjax.decoding.engine import RowStats
from specjax.tokenizer import get_tokenizer

PNG = b"\x89PNG"


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")  # a Figure of its own: Agg, no display, no pyplot
    return buffer.getvalue()


@pytest.fixture
def metrics_workdir(tmp_path):
    records = [{"split": "train", "step": s, "loss": 2.0 / s, "exit_ce": {"1": 2.5 / s, "4": 2 / s}}
               for s in (1, 2, 3)]
    records.append({"split": "eval", "step": 3, "exit_loss": [2.1, 2.0, 1.9, 1.8],
                    "exit_agreement": [0.7, 0.8, 0.9, 1.0], "exit_accuracy": [.3] * 4})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(tmp_path)


def test_every_figure_renders_to_png(metrics_workdir):
    """Catches a figure that needs a display or pyplot state, or that breaks on the records
    training, the bench, calibration and CALM write."""
    figures = [
        plots.training_curves(metrics_workdir),
        plots.speedup_heatmap([dict(exit_layer=1, num_draft=2, speedup=1.5),
                               dict(exit_layer=2, num_draft=4, speedup=1.2)]),
        plots.acceptance_by_depth({"E=1": [0.9, 0.7, 0.4]}),
        plots.draw_tree([-1, -1, 0, 0, 1, 2]),
        plots.calm_curve([dict(threshold=1.0, mean_exit=4, speedup=1.0, agreement=1.0,
                               log_loss=1.5),
                          dict(threshold=0.5, mean_exit=2, speedup=1.6, agreement=0.9,
                               log_loss=1.6)], 4, "softmax", calibrated=0.5),
        plots.risk_curve([1.0, 0.5, 0.0], [0.0, 0.05, 0.3], [1e-9, 0.01, 0.9], 0.1, 0.05, 0.5),
        plots.exit_heatmap([[1, 2, 4], [4, 4]], 4),
    ]
    for figure in figures:
        assert _png(figure).startswith(PNG)


def test_training_curves_draw_every_supervised_exit(metrics_workdir):
    """Catches per-exit curves dropped or mislabelled (an eval list read at the wrong
    index)."""
    ce, loss, agree = plots.training_curves(metrics_workdir).axes
    assert [line.get_label() for line in ce.lines] == ["exit 1", "exit 4"]
    assert list(agree.lines[0].get_ydata()) == [0.7] and list(agree.lines[1].get_ydata()) == [1.0]
    assert list(loss.lines[1].get_ydata()) == [1.8]


def test_drafts_are_shaded_by_depth_and_characters_stay_whole():
    """Catches a shade on the target's own tokens, text lost or duplicated between pieces,
    unescaped HTML, and a multi-byte character split into replacement characters."""
    tokenizer = get_tokenizer("bytes")
    text = "a<é>"
    tokens = tokenizer.encode(text)  # é is two byte tokens
    depths = [0, 1, 2, 3, 0]
    completion = Completion("p", text, RowStats(2, 6, 3), {"depth": depths}, tokens)
    highlight = plots.highlight_drafts(tokenizer, completion)
    assert str(highlight) == text
    assert [depth for _, depth in highlight.pieces] == depths
    html = highlight._repr_html_()
    assert "&lt;" in html and "<é" not in html and "\ufffd" not in html
    assert html.count("<span") == 2 and 'title="draft at depth 3">é<' in html
