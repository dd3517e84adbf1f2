"""The suite's process-wide settings (XLA flags, the kernels pinned, its caches), its pytest hooks
and the fixtures every folder uses; what the tests share besides is in `tests.support`."""

import gc
import os
import shutil
import tempfile

import jax
import pytest

from specjax.config import ModelConfig
from specjax.kernels import KERNELS
from specjax.model import init_params
from tests.support.models import TINY_MODEL, model_workdir, tiny_run
from tests.support.requirements import missing_test_requirements

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


@pytest.fixture(scope="module")
def base_workdir(tiny_cfg, tiny_params, tmp_path_factory) -> str:
    """The tiny random model as a module's own workdir (step 0, bytes tokenizer, no training
    data): a base for heads, or a model as an import leaves it."""
    return model_workdir(str(tmp_path_factory.mktemp("base")), tiny_params, tiny_cfg)


def pytest_sessionstart(session):
    """The suite refuses to pass with the kernel or HF tests skipped, unless asked to: a CI run
    that silently skipped them would prove nothing about them."""
    if os.environ.get("SPECJAX_ALLOW_SKIPS") == "1" or hasattr(session.config, "workerinput"):
        return
    missing = missing_test_requirements()
    if missing:
        pytest.exit(f"missing {', '.join(missing)}: their tests would be skipped; install them "
                    "or set SPECJAX_ALLOW_SKIPS=1", returncode=3)


# The files that take longest (every file of 20 s or more in two full runs, --junitxml,
# 2026-11-28), longest first: `--dist loadfile` hands files to the two workers in collection
# order, so starting these first keeps one worker from running a long file alone at the end
# (tools/test_exit_workload.py, 55-70 s, was missing and ran among the last). Paths relative
# to tests/ (a basename may repeat across folders).
TESTS = os.path.dirname(os.path.abspath(__file__))
SLOWEST_FILES = ("decoding/test_decoding_sampling.py", "cli/test_infer_cli.py",
                 "training/test_head_training.py", "docs/test_notebooks.py",
                 "training/test_sharding.py", "tools/test_exit_workload.py",
                 "decoding/test_decoding_trees.py", "convert/test_smollm2.py",
                 "decoding/drafters/test_feature_heads.py", "docs/test_notebooks_training.py",
                 "cli/test_bad_inputs.py", "decoding/test_draft_vocab.py",
                 "api/test_generate_conveniences.py", "decoding/test_decoding_greedy.py",
                 "cli/test_calm_cli.py", "decoding/drafters/test_mixed_trees.py",
                 "convert/test_hf_interop.py", "decoding/test_hybrid_decoding.py",
                 "decoding/test_compilation.py", "convert/test_hf_families.py",
                 "training/test_continual_training.py", "training/test_feature_cache.py",
                 "docs/test_recipe.py", "tools/test_tune.py", "docs/test_readme.py",
                 "decoding/drafters/test_kangaroo.py", "kernels/test_kernel_decision.py",
                 "cli/test_feature_head_cli.py", "decoding/drafters/test_calm.py",
                 "kernels/test_kernel_library.py", "decoding/drafters/test_draft_model.py",
                 "tools/test_bench.py", "decoding/drafters/test_medusa.py",
                 "training/test_training.py", "tools/test_exit_report.py",
                 "cli/test_entrypoint.py")


def pytest_collection_modifyitems(items):
    """Runs SLOWEST_FILES first, each file's tests in their order; refuses an entry that names
    no file (a test file moved or renamed would otherwise drop silently out of the order)."""
    stale = [path for path in SLOWEST_FILES if not os.path.isfile(os.path.join(TESTS, path))]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py: SLOWEST_FILES names {', '.join(stale)}, "
                                "which is not a file under tests/")
    rank = {path: i for i, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(os.path.relpath(item.path, TESTS), len(rank)))
