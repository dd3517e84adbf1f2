"""What `train.feature_cache` saves a run on a frozen model: the train step's time with the
frozen model run in the step (no cache), while the cache fills (the model run once, its states
written), and reading the cache (only the drafter runs), and the cache's disk bytes per token
and layer.

    python bench/feature_cache_bench.py --config eagle --config.base_workdir=runs/smollm2 \\
        --config.train.batch_size=8 --steps 3
    python bench/feature_cache_bench.py --config tiny_code:smollm2_draft --steps 3

The cache is a fresh folder under --cache_dir, removed at the end. Step k (after one warm-up
step of each mode) takes the batch at data position k x batch size in the three modes one after
another, so all three see the same machine load; the medians are compared.
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import os
import shutil
import statistics
import tempfile
import time

from absl import app, flags

from specjax.cli.decoding import require_positive_flags
from specjax.cli.entrypoint import define_config, parse_flags, run_cli
from specjax.data import BatchSampler, Corpus
from specjax.training.config import config_reference
from specjax.training.feature_cache import FeatureCache
from specjax.training.registry import HEADS, make_objective

__doc__ += "\n" + config_reference({name: head.config_class for name, head in HEADS.items()})

_CONFIG = define_config(None, "A head's config (eagle, kangaroo...) with base_workdir, or a "
                        "distilled draft model's (tiny_code:smollm2_draft).")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed steps per mode.")
_CACHE_DIR = flags.DEFINE_string("cache_dir", None, "Where the temporary cache is made "
                                 "(default: the system's temporary folder).")
flags.mark_flags_as_required(["config"])

MODES = ("no cache", "filling", "reading")


def bench(config: dict, steps: int, cache_dir: str | None) -> dict:
    objective = make_objective(config)
    frozen = objective.frozen_layers()
    if frozen is None:
        raise ValueError("the config trains the whole model: no frozen model to cache")
    run = objective.run
    corpus = Corpus.build(run.data)
    sampler = BatchSampler(corpus.train, run.train.batch_size, run.train.seed)
    folder = tempfile.mkdtemp(prefix="feature_cache_bench.", dir=cache_dir)
    try:
        cache = FeatureCache(folder, *frozen, corpus.key, corpus.train)
        state = objective.init_state()
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for step in range(steps + 1):
            position = step * run.train.batch_size
            batch, windows = sampler.batch(position), sampler.indices(position)
            for mode in MODES:
                tick = time.perf_counter()
                features = None if mode == "no cache" else cache.states(windows, batch)
                state, metrics = objective.train_step(state, batch, step, features)
                float(metrics["loss"])
                if step:  # the first of each mode compiles
                    times[mode].append(time.perf_counter() - tick)
        tokens = run.train.batch_size * run.data.seq_len
        filled_tokens = cache.filled() * run.data.seq_len
        disk = sum(os.stat(os.path.join(cache.folder, name)).st_blocks * 512
                   for name in os.listdir(cache.folder) if name.endswith(".bin"))
        per_token_layer = disk / filled_tokens / len(frozen[1])
        report = {"layers": list(frozen[1]), "bytes_per_token_layer": per_token_layer}
        base = statistics.median(times["no cache"])
        print(f"layers cached {list(frozen[1])}: {per_token_layer:,.0f} bytes a token and layer "
              f"on disk ({cache.dtype.name}, width {cache.row_shape[1]})")
        for mode in MODES:
            median = statistics.median(times[mode])
            report[mode] = {"step_s": median, "tokens_per_hour": tokens / median * 3600}
            print(f"{mode:10s} {median:7.2f} s/step  {base / median:5.2f}x  "
                  f"{tokens / median * 3600:12,.0f} tokens/hour")
        return report
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv):
    del argv

    def body() -> dict:
        require_positive_flags("steps")
        return bench(_CONFIG.value.to_dict(), _STEPS.value, _CACHE_DIR.value)

    run_cli(body)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
