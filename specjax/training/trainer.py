"""The training loop: data, jitted steps, evaluation, logging, checkpoints, resume, interrupts.

What is trained (the parameters, the steps, the evaluation) is the run's objective
(`training.registry`: LayerSkip, or a head on a frozen base). A run is a function of
(config, workdir). If the workdir holds a checkpoint of the same model the
run resumes from it, with the same data order and PRNG stream, so an interrupted-and-resumed run
reproduces an uninterrupted one step for step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from specjax import compilation_cache
from specjax.data import BatchSampler, Corpus
from specjax.errors import SpecjaxError
from specjax.io.checkpoint import Checkpointer, abstract_tree, check_model_config
from specjax.io.workdir import exclusive_workdir
from specjax.outputs import check_writable
from specjax.processes import any_process, is_leader
from specjax.sharding import with_shardings
from specjax.timing import tqdm_bar
from specjax.tokenizer import TOKENIZER_FILE, HFTokenizer
from specjax.training.feature_cache import FeatureCache
from specjax.training.init_source import resolve_init
from specjax.training.interrupt import catch_interrupts
from specjax.training.metrics_log import MetricsLog
from specjax.training.objective import Report
from specjax.training.optimizer import learning_rate_schedule
from specjax.training.registry import make_objective
from specjax.training.train_step import TrainState


class TrainingDivergedError(SpecjaxError):
    """The loss became NaN or infinite; training stopped without saving the bad state."""


@dataclasses.dataclass
class TrainResult:
    """How a run ended: `signal_name` is set when a signal (SIGTERM, SIGINT) stopped it after
    saving; `already_done` when the workdir's checkpoint had reached total_steps before it."""

    step: int
    report: Report | None
    interrupted: bool
    wall_seconds: float
    signal_name: str | None = None
    already_done: bool = False


class Trainer:
    """Holds the compiled steps and the data of one run. `explicit`: the dotted config fields
    the user set on purpose (command-line overrides); with `init.source` a model field among
    them must agree with the source (`training.init_source`)."""

    def __init__(self, config: Mapping[str, Any], workdir: str, explicit: Collection[str] = ()):
        config = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        if os.path.exists(workdir) and not os.path.isdir(workdir):
            raise SpecjaxError(f"--workdir {workdir!r} is a file, not a directory")
        check_writable(workdir, f"--workdir {workdir}")  # before the data is read
        compilation_cache.enable()
        self.config, source = resolve_init(config, explicit, workdir)
        self.objective = make_objective(self.config, source)
        self.run = self.objective.run
        if self.run.train.feature_cache and self.objective.frozen_layers() is None:
            raise SpecjaxError("train.feature_cache keeps a frozen model's hidden states: set it "
                               "for a head on base_workdir or a distilled draft model, not a "
                               "run that trains the whole model")
        self.workdir = workdir
        train = self.run.train
        self.tokenizer = self.run.data.make_tokenizer()
        self.corpus = Corpus.build(self.run.data, self.tokenizer)
        os.makedirs(workdir, exist_ok=True)  # only once every input has been read
        self.sampler = BatchSampler(self.corpus.train, train.batch_size, train.seed)
        self.eval_batches = self.corpus.validation_batches(train.batch_size, train.eval_batches)
        self.learning_rate = learning_rate_schedule(train)
        self.checkpoints = Checkpointer(workdir, keep=train.keep_checkpoints)
        self.log = MetricsLog(workdir, writable=is_leader())
        self.features: FeatureCache | None = None  # `train.feature_cache`, opened by `fit`

    def fresh_state(self) -> TrainState:
        """A new initialisation (the objective's `init_state`)."""
        return self.objective.init_state()

    def initial_state(self) -> tuple[TrainState, int]:
        """(state, data position): the workdir's latest checkpoint of this model, or a fresh
        initialisation at the start of the data stream."""
        if self.checkpoints.latest_step() is None:
            return self.fresh_state(), 0
        meta = self.checkpoints.read_meta()
        check_model_config(meta, self.run.model, self.workdir)
        self.objective.check_resume(meta)
        self._check_resume(meta)
        abstract = with_shardings(jax.eval_shape(self.fresh_state),
                                  self.objective.state_shardings)
        params, opt_state, meta = self.checkpoints.restore(
            abstract_tree(abstract.params), abstract_tree(abstract.opt_state))
        tqdm.write(f"resuming {self.workdir} from step {meta['step']}")
        dropped = self.log.drop_after(meta["step"])
        if dropped:
            tqdm.write(f"metrics.jsonl: dropped {dropped} records of steps after {meta['step']} "
                       "(logged before the interruption; they are trained again)")
        state = TrainState(step=jnp.asarray(meta["step"], jnp.int32), params=params,
                           opt_state=opt_state)
        return state, int(meta["data_position"])

    def _check_resume(self, meta: dict[str, Any]) -> None:
        """Refuses a resume that would read different data; says what a changed batch size
        means."""
        saved = meta.get("config", {})
        seq_len = saved.get("data", {}).get("seq_len")
        if seq_len is not None and seq_len != self.run.data.seq_len:
            raise SpecjaxError(
                f"data.seq_len={self.run.data.seq_len} differs from the checkpoint's {seq_len} "
                f"in {self.workdir}: its data position counts sequences of {seq_len} tokens, so "
                "the run would not continue where it stopped; use the checkpoint's seq_len or a "
                "new --workdir")
        batch_size = saved.get("train", {}).get("batch_size")
        if batch_size is not None and batch_size != self.run.train.batch_size:
            tqdm.write(f"resuming with train.batch_size={self.run.train.batch_size} (checkpoint: "
                       f"{batch_size}): the data stream continues at sequence "
                       f"{meta['data_position']}, the learning-rate schedule at step "
                       f"{meta['step']}")

    def save(self, state: TrainState, data_position: int) -> None:
        """`data_position`: sequences of the training stream consumed so far."""
        step = int(state.step)
        self.checkpoints.save(step, state.params, state.opt_state, {
            "step": step, "data_position": data_position, "model": self.run.model.to_dict(),
            "tokenizer": self._tokenizer_spec(), "objective": self.objective.name,
            "config": _jsonable(self.objective.config), **self.objective.meta(),
            **({"init": {"source": os.path.abspath(self.run.init.source)}}
               if self.run.init.source else {})})

    def _tokenizer_spec(self) -> str | dict:
        """The checkpoint's record of the data's tokenizer; its files (tokenizer.json, its
        conventions and chat template) are written into the workdir first, so the workdir
        decodes text on its own."""
        if not isinstance(self.tokenizer, HFTokenizer):
            return self.tokenizer.name
        copy = os.path.join(self.workdir, TOKENIZER_FILE)
        if not os.path.isfile(copy) or not os.path.samefile(copy, self.tokenizer.path):
            self.tokenizer.save_files(self.workdir)
        return self.tokenizer.spec()

    def feature_cache(self) -> FeatureCache | None:
        """`train.feature_cache` for the frozen model the objective now trains on (a resume may
        have switched to the base's step it started on); None when not set."""
        if not self.run.train.feature_cache:
            return None
        base, layers = self.objective.frozen_layers()
        cache = FeatureCache(self.run.train.feature_cache, base, layers, self.corpus.key,
                             self.corpus.train)
        tqdm.write(f"feature cache {cache.folder}: layers {list(layers)}, {cache.filled()} of "
                   f"{len(self.corpus.train)} windows filled")
        return cache

    def evaluate(self, state: TrainState) -> Report:
        report = self.objective.evaluate(state, self.eval_batches)
        self.log.write({"split": "eval", "step": int(state.step), **report.to_dict()})
        return report

    def fit(self, stop_requested: Callable[[int], bool] | None = None) -> TrainResult:
        """Trains until total_steps, a stop request or a signal; always saves before returning.

        `stop_requested(step)` is checked after each step (step = steps completed).
        """
        with exclusive_workdir(self.workdir) if is_leader() else contextlib.nullcontext():
            try:
                return self._fit(stop_requested)
            finally:
                self.log.close()

    def _fit(self, stop_requested: Callable[[int], bool] | None) -> TrainResult:
        train = self.run.train
        started = time.perf_counter()
        state, position = self.initial_state()
        step = int(state.step)
        if step >= train.total_steps:
            tqdm.write(f"the checkpoint in {self.workdir} is at step {step}, which reaches "
                       f"train.total_steps={train.total_steps}: nothing to train (raise "
                       "--config.train.total_steps to continue)")
            return TrainResult(step=step, report=None, interrupted=False,
                               wall_seconds=time.perf_counter() - started, already_done=True)
        last_saved = step if self.checkpoints.latest_step() is not None else None
        self.features = self.feature_cache()
        if jax.process_count() > 1:
            rows = self.objective.batch_rows.indices(train.batch_size)
            tqdm.write(f"process {jax.process_index()} of {jax.process_count()} reads rows "
                       f"{rows[0]}:{rows[1]} of each batch of {train.batch_size}")
        tokens_per_step = train.batch_size * self.run.data.seq_len
        report, interrupted, announced = None, False, False
        bar = tqdm_bar(total=train.total_steps, initial=step, desc="train", mininterval=1.0,
                       dynamic_ncols=True, disable=not is_leader())
        with catch_interrupts() as interrupt:
            while step < train.total_steps:
                tick = time.perf_counter()
                numbers = self.sampler.indices(position, self.objective.batch_rows)
                batch = self.sampler.read(numbers)
                features = (None if self.features is None
                            else self.features.states(numbers, batch))
                state, metrics = self.objective.train_step(state, batch, step, features)
                if not announced and self.objective.memory is not None:
                    tqdm.write(self.objective.memory.line())
                    announced = True
                position += train.batch_size
                loss = float(metrics["loss"])
                if not math.isfinite(loss):
                    raise TrainingDivergedError(
                        f"loss is {loss} at step {step + 1}; training stopped. "
                        + (f"The last good checkpoint (step {last_saved}) is kept in "
                           f"{self.checkpoints.directory}." if last_saved is not None else
                           "No checkpoint had been saved yet.")
                        + " Lower train.learning_rate or raise train.warmup_steps.")
                step += 1
                tokens_per_s = tokens_per_step / (time.perf_counter() - tick)
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:,.0f}")
                if step % train.log_every == 0 or step == train.total_steps:
                    self.log.write({"split": "train", "step": step,
                                    **{name: float(value) for name, value in metrics.items()
                                       if jnp.ndim(value) == 0}, **exit_losses(metrics),
                                    "learning_rate": float(self.learning_rate(step - 1)),
                                    "tokens_per_s": tokens_per_s})
                if step % train.eval_every == 0 or step == train.total_steps:
                    report = self.evaluate(state)
                interrupted = any_process(interrupt.requested
                                          or bool(stop_requested and stop_requested(step)))
                if step % train.save_every == 0 or step == train.total_steps or interrupted:
                    self.save(state, position)
                    last_saved = step
                if interrupted:
                    tqdm.write(f"stopped at step {step}; checkpoint saved")
                    break
        bar.close()
        if report is None and not interrupted:
            report = self.evaluate(state)
        return TrainResult(step=step, report=report, interrupted=interrupted,
                           wall_seconds=time.perf_counter() - started,
                           signal_name=interrupt.signal_name)


def train_and_evaluate(config: Mapping[str, Any], workdir: str, *,
                       stop_requested: Callable[[int], bool] | None = None,
                       explicit: Collection[str] = ()) -> TrainResult:
    """Trains (or resumes) the run described by `config` in `workdir` (`explicit`: see
    `Trainer`)."""
    return Trainer(config, workdir, explicit).fit(stop_requested)


def exit_losses(metrics: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """{"exit_ce": {exit: cross-entropy}} of the exits a LayerSkip step supervised (weight > 0;
    the curriculum's padding left out); {} for objectives that report none."""
    if "exit_ce" not in metrics:
        return {}
    rows = zip(np.asarray(metrics["exit_layers"]), np.asarray(metrics["exit_ce"]),
               np.asarray(metrics["exit_weights"]), strict=True)
    return {"exit_ce": {str(int(e)): float(ce) for e, ce, w in rows if w > 0}}


def _jsonable(value: Any) -> Any:
    """Config values as JSON types (tuples to lists, nested mappings to dicts)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.generic,)):
        return value.item()
    return value
