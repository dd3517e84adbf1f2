"""The measured choice between the CPU kernels and XLA's ops (`specjax.kernels.decision`): a kernel
runs a shape only where it measured clearly faster and not slower at worst, the measurement runs
once per CPU (cached beside the kernel's library, a corrupt cache measured again), a pinned switch
skips it, and either choice decodes the same tokens."""

import json
import logging
import time

import jax
import numpy as np
import pytest

from specjax.config import ModelConfig
from specjax.decoding.engine import AUTOREGRESSIVE, Generator
from specjax.decoding.loop import generate_tokens
from specjax.kernels import KERNELS, cpu_attention, cpu_matmul, decision, library
from specjax.model import init_params

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

needs_kernels = pytest.mark.skipif(not all(k.available() for k in KERNELS.values()),
                                   reason="no C++ compiler")
CFG = ModelConfig(vocab_size=64, d_model=64, num_layers=2, num_heads=2, num_kv_heads=1,
                  mlp_dim=128)


@pytest.fixture
def auto(monkeypatch, tmp_path):
    """Both switches at auto, this process's decisions forgotten, decisions cached in tmp_path."""
    for kernel in KERNELS.values():
        monkeypatch.setenv(kernel.SWITCH, "auto")
    monkeypatch.setattr(decision, "_decided", {})
    monkeypatch.setattr(library, "decisions_file", lambda source: tmp_path / f"{source}.json")
    return tmp_path


def _decode_hlo_and_tokens() -> tuple[str, list[int]]:
    """The greedy decode program's HLO and its tokens, traced afresh."""
    jax.clear_caches()
    generator = Generator(init_params(CFG, jax.random.PRNGKey(0)), CFG)
    prompt = [[1, 2, 3, 4]]
    args, static = generator._inputs(prompt, 6, AUTOREGRESSIVE, None, 0, None, None)
    hlo = generate_tokens.lower(*args, **static).as_text()
    return hlo, generator.generate(prompt, max_new_tokens=6).tokens[0]


@needs_kernels
@pytest.mark.parametrize("typical, worst, on_kernel", [
    (0.5, 0.5, False), (2.0, 0.8, False), (1.05, 1.0, False), (2.0, 1.0, True)],
    ids=["slower", "loses-when-busy", "not-clearly-faster", "faster"])
def test_decoding_runs_a_kernel_only_where_it_measured_faster(auto, monkeypatch, typical,
                                                              worst, on_kernel):
    """A forced measurement decides what the decode program calls: catches a kernel used although
    it measured slower, one chosen on its idle speed alone although it loses on a busy machine
    (worst), and one chosen within the noise. Either way the tokens are XLA's."""
    measured = []

    def fake(*args):
        measured.append(args)
        return {"typical": typical, "worst": worst}

    monkeypatch.setattr(cpu_matmul, "_measure", fake)
    monkeypatch.setattr(cpu_attention, "_measure", fake)
    hlo, tokens = _decode_hlo_and_tokens()
    assert measured
    for kernel in KERNELS.values():
        assert (kernel.TARGET in hlo) == on_kernel
    with library.xla_only():
        _, reference = _decode_hlo_and_tokens()
    assert tokens == reference
    summary = decision.summary()
    matmuls = len([a for a in measured if len(a) == 5])  # _measure(rows, k, n, transposed, xla)
    assert summary[cpu_matmul.SWITCH] == (f"auto: kernel for {matmuls * on_kernel} of {matmuls} "
                                          "shapes")


@needs_kernels
def test_a_decision_is_measured_once_per_cpu_and_a_corrupt_cache_again(auto, monkeypatch,
                                                                       caplog):
    """Catches a measurement repeated in every process (it is cached in a file), a corrupt cache
    file that raises instead of being measured again, and a cache shared between CPUs (its name
    follows the library's, which follows the CPU signature)."""
    calls = []

    def measure():
        calls.append(1)
        return {"typical": 1.5, "worst": 1.2}

    cache = auto / "decisions.json"
    caplog.set_level(logging.DEBUG)
    assert decision.use_kernel("matmul", cpu_matmul.SWITCH, cache, "1x8x8", measure)
    assert "measured for 1x8x8: 1.50x XLA's speed, 1.20x at worst -> kernel" in caplog.text
    monkeypatch.setattr(decision, "_decided", {})  # a new process
    assert decision.use_kernel("matmul", cpu_matmul.SWITCH, cache, "1x8x8", measure)
    assert len(calls) == 1 and json.loads(cache.read_text())["matmul 1x8x8"]["worst"] == 1.2
    cache.write_text('{"matmul 1x8')
    monkeypatch.setattr(decision, "_decided", {})
    assert decision.use_kernel("matmul", cpu_matmul.SWITCH, cache, "1x8x8", measure)
    assert len(calls) == 2 and json.loads(cache.read_text())  # healed
    paths = {library._library_path(library._DIRECTORY / cpu_matmul.SOURCE, "c++", library.FLAGS)}
    monkeypatch.setattr(library, "cpu_signature", lambda: "another CPU")
    paths.add(library._library_path(library._DIRECTORY / cpu_matmul.SOURCE, "c++",
                                    library.FLAGS))
    assert len(paths) == 2


@needs_kernels
def test_measuring_logs_one_info_line_per_process_and_prints_nothing(auto, monkeypatch,
                                                                     caplog, capsys):
    """Catches a line per measured shape class on stderr (dozens in a notebook's cells) or at
    INFO: three measurements leave one INFO line and each result at DEBUG, nothing printed."""
    monkeypatch.setattr(decision, "_announced", False)  # a new process
    caplog.set_level(logging.DEBUG)
    for shape in ("1x8x8", "2x8x8", "4x8x8"):
        decision.use_kernel("matmul", cpu_matmul.SWITCH, auto / "decisions.json", shape,
                            lambda: {"typical": 1.5, "worst": 1.2})
    levels = [record.levelno for record in caplog.records if "specjax: " in record.getMessage()]
    assert levels == [logging.INFO] + [logging.DEBUG] * 3
    assert capsys.readouterr() == ("", "")


@needs_kernels
def test_pinned_and_bad_switches(auto, monkeypatch):
    """1 pins the kernel without measuring (bitwise-reproducible runs across machines), 0 is
    XLA; catches a mistyped value silently read as on or off."""
    def never():
        raise AssertionError("measured although pinned")

    monkeypatch.setenv(cpu_matmul.SWITCH, "1")
    assert decision.use_kernel("matmul", cpu_matmul.SWITCH, None, "1x8x8", never)
    assert decision.summary()[cpu_matmul.SWITCH] == "pinned: kernel"
    monkeypatch.setenv(cpu_matmul.SWITCH, "0")
    assert not cpu_matmul.available()
    monkeypatch.setenv(cpu_matmul.SWITCH, "yes")
    with pytest.raises(ValueError, match="SPECJAX_CPU_MATMUL='yes': use auto"):
        cpu_matmul.available()


@needs_kernels
def test_a_real_measurement_inside_a_trace_decides_and_is_cached(auto):
    """The first trace of a shape on this CPU times kernel and XLA outside the trace (catches a
    measurement staged into the program being traced, or one that fails under jit) and stores
    both ratios."""
    x = np.ones((3, 48), np.float32)
    w = np.ones((48, 40), np.float32)
    from specjax.nn.linear import matmul

    out = jax.jit(lambda x, w: matmul(x, w))(x, w)
    np.testing.assert_allclose(out, x @ w)
    entries = json.loads((auto / f"{cpu_matmul.SOURCE}.json").read_text())
    (ratios,) = entries.values()
    assert list(entries) == ["matmul 4x48x40"]
    assert ratios["worst"] <= ratios["typical"] and ratios["worst"] > 0


def test_a_measurement_plan_keeps_the_turns_and_copies_of_quick_calls():
    """Quick calls (a pass over 32 copies in 0.3 ms) keep every copy and `REPEATS` turns, each
    loop about `LOOP_SECONDS`: catches a time bound that thins the measurement of the small
    shapes decoding's decisions rest on."""
    passes = {"xla": 2e-4, "kernel": 1e-4}
    assert decision.copies_within(passes, 32, 4) == 32
    calls, turns = decision.loop_plan(passes, 4)
    assert (calls, turns) == (round(decision.LOOP_SECONDS / 2e-4), decision.REPEATS)


def test_a_measurement_plan_bounds_the_time_of_long_calls():
    """Long calls (a pass over 32 copies in 0.1 s) get fewer copies, one call per loop and
    `MIN_REPEATS` turns, within `MEASURE_SECONDS`; calls too long for even one copy within it
    (a pass over 12 copies in 1.45 s, as attention over 2,000 rows) keep one. Catches the
    unbounded plan (9 turns of at least 4 passes over every copy: 285 s for that attention)."""
    passes = {"xla": 0.05, "kernel": 0.05}
    copies = decision.copies_within(passes, 32, 4)
    fewer = {name: seconds * copies / 32 for name, seconds in passes.items()}
    calls, turns = decision.loop_plan(fewer, 4)
    assert 1 < copies < 32 and (calls, turns) == (1, decision.MIN_REPEATS)
    assert 4 * (1 + turns) * sum(fewer.values()) <= decision.MEASURE_SECONDS * 1.001
    assert decision.copies_within({"xla": 0.7, "kernel": 0.75}, 12, 4) == 1


def test_a_measurement_of_long_calls_makes_few_of_them(monkeypatch):
    """The real measurement of a program whose calls take 20 ms, over operands small enough
    for 32 copies and under 4 conditions, makes a bounded number of calls (a first pass over
    the copies, then on fewer copies a probe and a few turns per condition): catches
    a plan that ignores the calls' length (about 10,000 calls here, over 3 minutes). A call
    past the bound fails at once rather than after minutes."""
    made = []

    def slow(x):
        made.append(1)
        if len(made) > 300:
            raise RuntimeError("the measurement made over 300 calls of 20 ms")
        time.sleep(0.02)
        return x

    def program(x, w):
        return jax.pure_callback(slow, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + w[0, 0]

    monkeypatch.setattr(decision, "_last_level_cache_bytes", lambda: 32 * 4096 * 4)
    x, w = np.ones((4,), np.float32), np.ones((64, 64), np.float32)
    ratios = decision.ratios_per_call({"xla": program, "kernel": program}, [(x, w)] * 4)
    assert len(ratios) == 4 and all(0.5 < r["kernel"] < 2 for r in ratios)
    assert len(made) <= 2 * 32 + 4 * 2 * (1 + decision.MIN_REPEATS) * 2
