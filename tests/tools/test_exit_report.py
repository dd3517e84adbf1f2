"""The exit report (specjax/tools/exit_report.py, infer/exit_report.py, LanguageModel.exit_report):
per-exit metrics against direct forwards, its predictions against hand values, the CLI end to
end."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

import specjax
import specjax.tools.exit_report as exit_report_module
import specjax.tools.layer_costs as layer_costs_module
from specjax.config import ModelConfig, SsmConfig
from specjax.data import DataConfig, is_validation_key, iter_documents
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.io.checkpoint import Checkpointer
from specjax.model import embed, exit_logits, init_params, run_layers
from specjax.tokenizer import ByteTokenizer
from specjax.tools.exit_report import (
    DraftExitReport,
    exit_report,
    model_exit_report,
    predicted_tau,
    token_windows,
)
from specjax.tools.layer_costs import LayerCosts, measure_costs, monotone
from specjax.training.evaluate import ExitReport
from tests.support import ROOT
from tests.support.models import TINY_MODEL, damped_params
from tests.support.scripts import run_script

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PARAMS = damped_params(CFG, jax.random.PRNGKey(0), 0.5)  # shallow exits agree part of the time
# Distinct made-up seconds per token count: a cost read at the wrong count changes the result.
COSTS = LayerCosts(layer={"attention": {n: 2.0 + 0.25 * (n - 1) for n in range(1, 10)},
                          "mamba2": {n: 1.0 + 0.125 * (n - 1) for n in range(1, 10)}},
                   head={n: 0.5 + 0.1 * (n - 1) for n in range(1, 10)})



@pytest.mark.parametrize("num_draft", [[0], [2, 0], []])
def test_a_draft_count_below_one_is_refused_first(num_draft):
    """num_draft with 0 (or none at all) is the one-line error naming the counts, from both
    entry points, before any weights or windows are read. Catches the bound checked as < 0
    (0 drafts let through to a report whose every speedup is the plain pass)."""
    with pytest.raises(ValueError, match=r"must list draft counts >= 1"):
        exit_report(None, None, np.zeros((0, 9), np.int32), COSTS, num_draft=num_draft)
    with pytest.raises(ValueError, match=r"must list draft counts >= 1"):
        model_exit_report(None, None, None, {}, num_draft=num_draft)

def test_per_exit_loss_accuracy_and_agreement_match_direct_forwards():
    """Each record against exit e computed directly (embed, layers [0, e), head, argmax).
    Catches agreement measured against the targets instead of the last layer, and a record
    reading the metrics of the neighbouring exit (off by one)."""
    windows = np.random.default_rng(0).integers(0, 256, (6, 17)).astype(np.int32)
    records = exit_report(PARAMS, CFG, windows, COSTS, batch_size=2).to_records()
    inputs, targets = windows[:, :-1], windows[:, 1:]
    hidden = embed(PARAMS, CFG, inputs)
    logits = [np.asarray(exit_logits(PARAMS, CFG, run_layers(PARAMS, CFG, hidden,
                                                             layers=(0, e))[-1]), np.float64)
              for e in range(1, CFG.num_layers + 1)]
    last = logits[-1].argmax(-1)
    assert [r["exit"] for r in records] == [1, 2, 3, 4]
    for record, exit_logit in zip(records, logits, strict=True):
        log_probs = exit_logit - np.log(np.exp(exit_logit).sum(-1, keepdims=True))
        loss = -np.take_along_axis(log_probs, targets[..., None], -1).mean()
        assert record["loss"] == pytest.approx(loss, rel=1e-5)
        assert record["accuracy"] == pytest.approx(np.mean(exit_logit.argmax(-1) == targets))
        assert record["agreement"] == pytest.approx(np.mean(exit_logit.argmax(-1) == last))
    agreements = [r["agreement"] for r in records]
    assert 0 < agreements[0] < agreements[2] < 1 == agreements[-1]  # the test has teeth


def test_tau_is_the_iid_chain_expectation():
    """tau = 1 + a + ... + a^K. Catches a^K for a^(K+1) (the bonus token left out) and a
    division by zero at a = 1."""
    assert predicted_tau(0.5, 2) == pytest.approx(1.75)
    assert predicted_tau(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    assert predicted_tau(0.0, 5) == 1.0
    assert predicted_tau(1.0, 3) == 4.0


def test_speedup_from_fixed_costs_matches_a_hand_computation():
    """A hybrid model (mamba2, attention, mamba2, mamba2), exit 2, K=3, agreement 0.5 at exit
    2. Catches verification costed at K tokens instead of K+1, a layer costed by another
    kind's time, the last draft's pass through layers [0, E) left out, and the report reading
    the agreement of another exit."""
    kinds = ("mamba2", "attention", "mamba2", "mamba2")
    plain = 1.0 + 2.0 + 1.0 + 1.0 + 0.5                    # every layer's c(1) + h(1)
    shallow = 1.0 + 2.0                                    # layers 0, 1 on one token
    verify = 2 * (1.0 + 0.125 * 3) + (0.5 + 0.1 * 3)       # layers 2, 3 and the head on 4
    round_seconds = 3 * (shallow + 0.5) + shallow + verify  # 3 drafts, the last one's [0, E)
    expected = (1 + 0.5 + 0.25 + 0.125) * plain / round_seconds
    metrics = ExitReport(loss=(3.0, 2.5, 2.2, 2.0), accuracy=(0.1, 0.2, 0.3, 0.4),
                         agreement=(0.3, 0.5, 0.7, 1.0), tokens=100)
    report = DraftExitReport(metrics, COSTS, kinds, num_draft=(2, 3))
    record = report.to_records()[1]
    assert record["exit"] == 2 and record["agreement"] == 0.5
    assert record["tau"] == {"2": pytest.approx(1.75), "3": pytest.approx(1.875)}
    assert record["speedup"]["3"] == pytest.approx(expected)


def test_a_tree_round_is_priced_by_hand():
    """The same hybrid at exit 2 drafting the tree 2,1 (parents -1, -1, 0, 1): draft passes
    of layers [0, 2) and the head on the pending token, then on the 2 nodes of depth 1; the
    2 leaves through layers [0, 2) in the verification, and layers 2, 3 and the head on 5
    tokens; with a draft head, the draft passes' head scaled by it. A table measured at 1,
    3 and 5 tokens prices the tree as the whole table does (lines between and past them).
    A leaf above the last depth (-1, -1, 0: node 1) takes no draft pass. Catches a depth's
    width counted over its leaves too, the leaves left out (or run twice), the verification
    on N tokens instead of N + 1, sizes between the measured ones read as the nearest one,
    and a line past the largest drawn through the first two sizes."""
    kinds = ("mamba2", "attention", "mamba2", "mamba2")
    shallow = {n: COSTS.layer["mamba2"][n] + COSTS.layer["attention"][n] for n in (1, 2)}
    head = COSTS.head
    drafts = shallow[1] + head[1] + shallow[2] + head[2]
    verify = shallow[2] + 2 * COSTS.layer["mamba2"][5] + head[5]
    parents = StaticTree.from_parents((-1, -1, 0, 1))
    assert COSTS.tree_round(kinds, 2, parents) == pytest.approx(drafts + verify)
    smaller = dataclasses.replace(COSTS, draft_head=0.2)
    assert smaller.tree_round(kinds, 2, parents) == pytest.approx(
        drafts - head[1] - head[2] + 0.2 + 0.2 * head[2] / head[1] + verify)
    sparse = LayerCosts(layer={k: {n: t[n] for n in (1, 3, 5)} for k, t in COSTS.layer.items()},
                        head={n: head[n] for n in (1, 3, 5)})
    wide = StaticTree.from_branching((2, 2, 1))  # drafts on 1, 2, 4 nodes; 11 verified
    assert sparse.tree_round(kinds, 1, wide) == pytest.approx(COSTS.tree_round(kinds, 1, wide))
    chain = StaticTree.from_parents((-1, 0, 1))
    assert COSTS.tree_round(kinds, 2, chain) == pytest.approx(COSTS.round(kinds, 2, 3))
    leaf_above = (shallow[1] + head[1]) * 2 + shallow[2] + 2 * COSTS.layer["mamba2"][4] + head[4]
    assert COSTS.tree_round(kinds, 2, StaticTree.from_parents((-1, -1, 0))) == pytest.approx(
        leaf_above)
    bent = LayerCosts(layer={"attention": {1: 1.0, 2: 1.5, 4: 4.0}}, head={1: 0.0, 2: 0.0, 4: 0.0})
    # Verification of 5 and 7 tokens past the largest size (4): 4.0 + 1.25 per token.
    assert bent.tree_round(("attention",), 0, StaticTree((-1,) * 4)) == pytest.approx(5.25)
    assert bent.tree_round(("attention",), 0, StaticTree((-1,) * 6)) == pytest.approx(7.75)


def test_the_verification_line_is_a_whole_pass_over_one_token_passes():
    """The table's verification line: a pass of every layer and the head on n tokens over the
    one-token pass, by hand. Catches the line leaving out the head or a layer kind, or
    dividing by the head's one-token cost instead of the whole pass's."""
    kinds = ("mamba2", "attention", "mamba2", "mamba2")
    one = 1.0 + 2.0 + 1.0 + 1.0 + 0.5
    four = 3 * (1.0 + 0.125 * 3) + (2.0 + 0.25 * 3) + (0.5 + 0.1 * 3)
    assert COSTS.whole_pass(kinds, 4) == pytest.approx(four)
    metrics = ExitReport(loss=(3.0, 2.5, 2.2, 2.0), accuracy=(0.1, 0.2, 0.3, 0.4),
                         agreement=(0.3, 0.5, 0.7, 1.0), tokens=100)
    table = DraftExitReport(metrics, COSTS, kinds, num_draft=(3,)).table()
    assert f"4: {four / one:.2f}" in table and "1: 1.00" in table


def test_costs_are_measured_for_every_layer_kind_and_token_count():
    """A hybrid model's layers of both kinds and its head, each timed at every count. Catches a
    kind left unmeasured (its layers could then not be costed) and a failing cached pass of
    one layer of a kind on its own."""
    ssm = SsmConfig(num_heads=4, head_dim=8, state_size=8, groups=2, chunk_size=8)
    cfg = ModelConfig(**{**TINY_MODEL, "ssm": ssm,
                         "layer_pattern": ("mamba2", "attention", "mamba2", "mamba2")})
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(1))  # 3 s eager
    costs = measure_costs(params, cfg, [3], context=16, repeats=1, inner=2)
    assert set(costs.layer) == {"attention", "mamba2"}
    for by_size in (*costs.layer.values(), costs.head):
        assert set(by_size) == {1, 3} and min(by_size.values()) > 0


def test_the_best_pair_is_never_the_last_layer_even_when_it_predicts_highest():
    """Costs made up so that drafting from the last layer (agreement 1) predicts the highest
    speed-up (a head far cheaper on K + 1 tokens than on one), every other exit under 1x:
    best() still picks an exit below L, the fastest of those. Catches the last layer
    recommended (a drafter cannot use it: no layers would be left to verify)."""
    costs = LayerCosts(layer={"attention": {n: 0.01 for n in range(1, 10)}},
                       head={n: 1.0 if n == 1 else 0.1 for n in range(1, 10)})
    metrics = ExitReport(loss=(3.0, 2.5, 2.2, 2.0), accuracy=(0.1, 0.2, 0.3, 0.4),
                         agreement=(0.0, 0.1, 0.2, 1.0), tokens=100)
    report = DraftExitReport(metrics, costs, CFG.layer_kinds, num_draft=(2, 3))
    pairs = [(e, k) for e in range(1, 4) for k in (2, 3)]
    by_hand = max(pairs, key=lambda pair: report.speedup(*pair))
    assert report.speedup(4, 3) > 1 > report.speedup(*by_hand)  # the last layer would win
    assert report.best() == by_hand and by_hand[0] < 4
    assert f"exit {by_hand[0]} with {by_hand[1]} drafts" in report.table()


def fake_timings(monkeypatch, alone: dict, repeats: dict | None = None) -> list[set]:
    """Patches the exit report's loops and timer: a piece on n tokens takes alone[piece][n]
    seconds (a layer alone, the head, the whole model), each repeat of a key the times
    `repeats` lists. Returns the key sets `time_interleaved` was asked to time."""
    last, asked = [], []

    def loop(piece):
        def make(cfg, inner):
            def run(*args):  # the head and the model take the sampling first
                params, *args = args if piece == "layer" else args[1:]
                # (hidden, cache) for a layer or the model, (vocab, hidden) for the head
                hidden = args[-1] if piece == "head" else args[0]
                last.append(alone[piece][hidden.shape[1]] * inner)  # the costs divide by inner
                return (hidden,) if piece == "head" else (hidden, *args[1:])
            return run
        return make

    def interleaved(calls, items, count):
        asked.append(set(calls))
        seconds = {}
        for key, call in calls.items():
            call(0)
            seconds[key] = [list((repeats or {}).get(key, [last[-1]] * count))]
        return seconds, {}

    for name, piece in (("_layer_loop", "layer"), ("_head_loop", "head"),
                        ("_model_loop", "model")):
        monkeypatch.setattr(layer_costs_module, name, loop(piece))
    monkeypatch.setattr(layer_costs_module, "time_interleaved", interleaved)
    return asked


def test_measured_costs_are_scaled_so_the_pieces_sum_to_the_whole_pass(monkeypatch):
    """With the timings monkeypatched (a layer alone 2 s on 1 token and 3 s on 3, the head 4
    and 6, the whole pass 24 and 54), the pieces are scaled by 24 / (4 x 2 + 4) = 2 and
    54 / (4 x 3 + 6) = 3, by hand: a layer 4 and 9 s, the head 8 and 18 s, and a whole pass
    of them the measured one. Catches the scale computed without the head (or without a
    layer), or applied to some pieces only; and pieces timed one after another instead of
    interleaved in one loop (every piece at every size is one key of one timing call)."""
    alone = {"layer": {1: 2.0, 3: 3.0}, "head": {1: 4.0, 3: 6.0}, "model": {1: 24.0, 3: 54.0}}
    asked = fake_timings(monkeypatch, alone)
    costs = measure_costs(PARAMS, CFG, [3], context=4, repeats=3, inner=2)
    assert costs.layer == {"attention": {1: pytest.approx(4.0), 3: pytest.approx(9.0)}}
    assert costs.head == {1: pytest.approx(8.0), 3: pytest.approx(18.0)}
    for n in (1, 3):
        assert costs.whole_pass(CFG.layer_kinds, n) == pytest.approx(alone["model"][n])
    assert asked == [{(piece, n) for piece in ("attention", "head", "model") for n in (1, 3)}]
    assert costs.spread == 0.0


def test_costs_never_fall_with_more_tokens():
    """`monotone` by hand: a lower reading at a larger count takes the smaller count's value.
    Catches costs left as measured (a noisy 3-token reading below the 2-token one made the
    predictions zig-zag with K) and a running minimum in place of the maximum."""
    assert monotone({4: 3.0, 1: 2.0, 2: 1.5, 8: 2.5}) == {1: 2.0, 2: 2.0, 4: 3.0, 8: 3.0}


def test_measured_costs_are_monotone_and_their_spread_warns(monkeypatch):
    """The measured costs pass through `monotone` (a layer timed faster on 3 tokens than on 1
    costs the same on both), the median of each piece's repeats is kept, and the spread of
    the noisiest piece, its interquartile range over its median, is the report's warning; one
    slow repeat among five (which the median ignores) is no spread. Catches costs taken from
    the mean or the first repeat, an unmonotone measurement, a report that stays silent on a
    noisy machine (or warns on a quiet one), and a single outlier called noise (it warned of
    a 44,423% spread on an idle machine)."""
    alone = {"layer": {1: 3.0, 3: 2.0}, "head": {1: 1.0, 3: 1.0}, "model": {1: 16.0, 3: 12.0}}
    noisy = {("head", 1): [1.0, 1.0, 1.0, 3.0, 3.0]}  # median 1, quartiles 1 and 3
    fake_timings(monkeypatch, alone, noisy)
    costs = measure_costs(PARAMS, CFG, [3], context=4, repeats=5, inner=1)
    # n=1: scale 16 / (4 x 3 + 1); n=3: scale 12 / (4 x 2 + 1) = 4/3, the layer 8/3 < 48/13
    assert costs.layer["attention"] == {1: pytest.approx(48 / 13), 3: pytest.approx(48 / 13)}
    assert costs.head == {1: pytest.approx(16 / 13), 3: pytest.approx(4 / 3)}
    assert costs.spread == pytest.approx(2.0)
    report = DraftExitReport(
        ExitReport(loss=[1.0] * 4, accuracy=[0.5] * 4, agreement=[0.5] * 4, tokens=8),
        costs, CFG.layer_kinds, (2,))
    assert "repeats spread over 200% of its median" in report.table()
    quiet = dataclasses.replace(costs, spread=exit_report_module.NOISY_SPREAD)
    assert "warning" not in dataclasses.replace(report, costs=quiet).table()
    fake_timings(monkeypatch, alone, {("head", 1): [1.0, 1.0, 1.0, 1.0, 9.0]})
    assert measure_costs(PARAMS, CFG, [3], context=4, repeats=5, inner=1).spread == 0.0


def test_default_text_is_the_runs_validation_split(tmp_path, monkeypatch):
    """Without texts, the report reads the validation documents of the checkpoint's data (and
    its seq_len), else the embedded corpus's. Catches training documents evaluated as
    held-out text and a saved data section ignored."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n" * 3})
                              + "\n" for i in range(24)))
    data = {"source": "files", "files": [str(corpus)], "val_fraction": 0.3, "seq_len": 16}
    meta = {"config": {"data": data}}
    documents = list(iter_documents(DataConfig.from_dict(data)))
    validation = [text for key, text in documents if is_validation_key(key, 0.3)]
    train = [text for key, text in documents if not is_validation_key(key, 0.3)]
    tokenizer = ByteTokenizer()
    report = model_exit_report(PARAMS, CFG, tokenizer, meta, max_tokens=256, costs=COSTS)
    held_out = model_exit_report(PARAMS, CFG, tokenizer, meta, validation,
                                 max_tokens=256, costs=COSTS)
    trained = model_exit_report(PARAMS, CFG, tokenizer, meta, train,
                                max_tokens=256, costs=COSTS)
    assert report.seq_len == 16 and report.metrics == held_out.metrics != trained.metrics
    seen, many = [], ["x = 1\n" * 20] * 200
    monkeypatch.setattr("specjax.tools.exit_report.validation_texts",
                        lambda cfg: seen.append(cfg) or iter(many))
    model_exit_report(PARAMS, CFG, tokenizer, {}, seq_len=16, max_tokens=64, costs=COSTS)
    assert seen == [DataConfig()]  # the embedded corpus, as a freshly imported model has no data


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """An imported-style workdir (weights only, step 0, no training sections), a JSONL of
    held-out texts, and the CLI's run on them."""
    root = tmp_path_factory.mktemp("exits")
    workdir = str(root / "workdir")
    checkpoints = Checkpointer(workdir)
    checkpoints.save(0, PARAMS, None, {"step": 0, "data_position": 0, "model": CFG.to_dict(),
                                       "tokenizer": "bytes"})
    checkpoints.close()
    with open(os.path.join(ROOT, "specjax", "nn", "cache.py"), encoding="utf-8") as f:
        texts = [part for part in f.read().split("\n\n") if part.strip()]
    texts_file = root / "texts.jsonl"
    texts_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out, plot = root / "exits.json", root / "exits.png"
    result = _run("--workdir", workdir, "--texts_file", str(texts_file), "--seq_len", "32",
                  "--max_tokens", "512", "--context", "64", "--repeats", "2",
                  "--output_json", str(out), "--plot", str(plot))
    return {"workdir": workdir, "texts": texts, "root": root, "result": result, "json": out,
            "plot": plot}


def _run(*args):
    """The command on held-out text alone (the workload's prediction has its own tests:
    tests/tools/test_exit_workload.py)."""
    return run_script("infer/exit_report.py", "--noworkload", *args)


def test_cli_prints_the_table_and_writes_one_record_per_exit_and_a_png(imported):
    """infer/exit_report.py on an imported checkpoint (no training metadata): the table, a JSON list
    of one record per exit (K = 2..8), a PNG, no temporary files left. Catches a report that
    needs a trained run's metadata, outputs left unrenamed and a plot never written."""
    result = imported["result"]
    assert result.returncode == 0, result.stderr[-2000:]
    records = json.loads(imported["json"].read_text())
    assert [r["exit"] for r in records] == [1, 2, 3, 4]
    assert all(0 <= r["agreement"] <= 1 for r in records) and records[-1]["agreement"] == 1
    assert all(list(r["tau"]) == list(r["speedup"]) == [str(k) for k in range(2, 9)]
               for r in records)
    assert imported["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(last layer)" in result.stdout and "bench/bench.py --exit_layer=" in result.stdout
    assert "512 held-out tokens in windows of 32" in result.stdout
    assert not list(imported["root"].glob(".*partial"))


def test_cli_plots_in_its_extensions_format_and_reads_a_named_text_field(imported, tmp_path):
    """Catches `--plot x.svg` writing PNG bytes under an .svg name, an extension matplotlib
    cannot write refused only after the report, and a texts file whose field is not "text"
    pointed to data.text_field, a setting exit_report.py has no flag for (it has --text_field)."""
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"body": t}) + "\n" for t in imported["texts"]))
    plot = tmp_path / "exits.svg"
    args = ["--workdir", imported["workdir"], "--texts_file", str(texts), "--seq_len", "32",
            "--max_tokens", "512", "--context", "64", "--repeats", "2"]
    for extra, message in ((["--plot", str(tmp_path / "x.docx")], "matplotlib writes no .docx"),
                           ([], "no field 'text' (fields: ['body']; set --text_field)")):
        result = _run(*args, *extra)
        assert result.returncode == 1 and message in result.stderr, result.stderr[-2000:]
        assert "(last layer)" not in result.stdout
    result = _run(*args, "--text_field", "body", "--plot", str(plot))
    assert result.returncode == 0, result.stderr[-2000:]
    assert plot.read_text().startswith("<?xml") and "<svg" in plot.read_text()


def test_cli_bad_input_is_one_line_and_keeps_an_existing_output(imported, tmp_path):
    """Too little text for one window, a missing workdir, a texts file that is a directory:
    exit status 1, one `error:` line, no traceback; the failed run leaves an existing JSON
    output as it was. Catches a traceback, and an output truncated before the work succeeded
    (or its temporary file left behind)."""
    short, out = tmp_path / "short.txt", tmp_path / "old.json"
    short.write_text("x = 1\n")
    out.write_text("old")
    for args, message in (
            (["--workdir", imported["workdir"], "--texts_file", str(short), "--seq_len", "64",
              "--output_json", str(out)], "too few for one window of seq_len + 1 = 65"),
            (["--workdir", str(tmp_path / "none"), "--texts_file", str(short)],
             "no checkpoints in"),
            (["--workdir", imported["workdir"], "--texts_file", str(tmp_path)],
             "is a directory")):
        result = _run(*args)
        assert result.returncode == 1 and message in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert out.read_text() == "old" and not list(tmp_path.glob(".*partial"))


def test_api_reports_the_agreement_the_cli_wrote(imported):
    """`specjax.load(workdir).exit_report(texts)` gives the CLI's per-exit agreement and loss.
    Catches the API evaluating other params (its decoding layout restacked wrongly) or other
    windows."""
    cli = json.loads(imported["json"].read_text())
    report = specjax.load(imported["workdir"]).exit_report(
        imported["texts"], workload=False, seq_len=32, max_tokens=512, costs=COSTS)
    records = report.to_records()
    assert [r["agreement"] for r in records] == [r["agreement"] for r in cli]
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in cli], rel=1e-6)


@pytest.mark.parametrize("seq_len, max_tokens", [(4, 12), (7, 30), (3, 3)])
def test_token_windows_are_the_documents_cut_by_hand(seq_len, max_tokens):
    """The windows of many short texts are exactly `max_tokens // seq_len` rows of
    seq_len + 1 ids: the texts as training documents ([BOS] bytes [EOS] each, the byte
    tokenizer's convention), concatenated and cut by hand, with no text read past the last
    window's. Catches the EOS left off each text (`add_eos` dropped) and texts no longer read
    once `wanted * seq_len` ids are in (fewer windows than asked for)."""
    tokenizer = ByteTokenizer()
    texts = [f"t{i}" + "x" * (i % 4) for i in range(100)]
    stream = [t for text in texts for t in [256, *text.encode(), 257]]
    wanted = max_tokens // seq_len
    expected = np.asarray(stream[:wanted * (seq_len + 1)]).reshape(wanted, seq_len + 1)
    given = iter(texts)
    windows = token_windows(given, tokenizer, seq_len, max_tokens)
    np.testing.assert_array_equal(windows, expected)
    read = len(texts) - len(list(given))  # the texts it took: just enough for the windows
    ends = np.cumsum([0] + [len(text) + 2 for text in texts])  # where each text's ids end
    assert ends[read - 1] < expected.size <= ends[read]
