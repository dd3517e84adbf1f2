"""DistillSpec-style training of a draft model (Zhou et al. 2024): the model learns the target's
next-token distribution on the corpus rather than the corpus' tokens, which is what decides how
often the target accepts its drafts. The teacher is a frozen model (`frozen_base.FrozenBase`,
fingerprinted into every checkpoint); the student is an ordinary model, so its workdir decodes,
drafts (`--draft_workdir`) and exports like any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.config import ModelConfig
from specjax.io.checkpoint import CheckpointError
from specjax.model import Params, forward
from specjax.tokenizer import get_tokenizer
from specjax.training.config import RunConfig
from specjax.training.evaluate import sum_over_batches
from specjax.training.frozen_base import Features, FrozenBase, base_features
from specjax.training.optimizer import make_optimizer
from specjax.training.run_mesh import RunMesh
from specjax.training.train_step import TrainState, init_train_state


@dataclasses.dataclass(frozen=True)
class DistillReport:
    """Per validation token: the student's loss on the corpus, its soft cross-entropy to the
    teacher and its top-1 agreement with the teacher (its greedy acceptance rate)."""

    loss: float
    soft_ce: float
    agreement: float
    tokens: int

    def table(self) -> str:
        return (f"student: {self.loss:.4f} nats/token on the corpus, soft CE to the teacher "
                f"{self.soft_ce:.4f}, top-1 agreement with the teacher {self.agreement:.3f} "
                f"over {self.tokens} validation tokens")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def make_distill_step(cfg: ModelConfig, teacher_cfg: ModelConfig,
                      optimizer: optax.GradientTransformation) -> Callable:
    """Returns train_step(state, teacher params, batch [B, T+1], features) -> (state, metrics);
    `features`: the teacher's last hidden state (`base_features`), or None to run it here."""

    def train_step(state: TrainState, teacher: Params, batch: jax.Array,
                   features: Features | None) -> tuple[TrainState, dict[str, jax.Array]]:
        inputs = batch[:, :-1]
        _, teacher_logits = base_features(teacher, teacher_cfg, (), inputs, features)
        target = jax.nn.softmax(teacher_logits)

        def loss_fn(params):
            return jnp.mean(optax.softmax_cross_entropy(forward(params, cfg, inputs), target))

        return state.descend(loss_fn, optimizer)

    return train_step


def make_distill_eval_step(cfg: ModelConfig, teacher_cfg: ModelConfig) -> Callable:
    def eval_step(params: Params, teacher: Params, batch: jax.Array) -> dict[str, jax.Array]:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        logits = forward(params, cfg, inputs)
        teacher_logits = forward(teacher, teacher_cfg, inputs)
        return {"loss": jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets)),
                "soft_ce": jnp.sum(optax.softmax_cross_entropy(
                    logits, jax.nn.softmax(teacher_logits))),
                "agree": jnp.sum(jnp.argmax(logits, -1) == jnp.argmax(teacher_logits, -1))}

    return eval_step


class Distill:
    """The run's model, trained to the frozen `teacher`'s distribution."""

    name: ClassVar[str] = "distill"
    memory = None  # no memory estimate (a draft model is small)

    def __init__(self, run: RunConfig, config: dict[str, Any], teacher: FrozenBase):
        self.run, self.config, self.teacher = run, config, teacher
        tokenizer = teacher.meta.get("tokenizer", "bytes")
        same = (get_tokenizer(tokenizer, teacher.workdir).fingerprint()
                == run.data.make_tokenizer().fingerprint())
        if not same or teacher.cfg.vocab_size != run.model.vocab_size:
            raise ValueError(f"the teacher in {teacher.workdir} has tokenizer {tokenizer!r} with "
                             f"{teacher.cfg.vocab_size} ids, this model {run.data.tokenizer!r} "
                             f"with {run.model.vocab_size}: a draft model must share them")
        self.optimizer = make_optimizer(run.train)
        self.on_mesh = RunMesh(run)
        self.batch_rows = self.on_mesh.batch_rows
        self.teacher_params = self.on_mesh.place(teacher.params)

        def init(key: jax.Array) -> TrainState:
            return init_train_state(run.model, self.optimizer, key)

        self.state_shardings = self.on_mesh.shardings(jax.eval_shape(init, jax.random.PRNGKey(0)))
        self._init = jax.jit(init, out_shardings=self.state_shardings)
        self._train_step = self.on_mesh.jit_step(
            make_distill_step(run.model, teacher.cfg, self.optimizer), self.state_shardings)
        self._eval_step = jax.jit(make_distill_eval_step(run.model, teacher.cfg))

    def init_state(self) -> TrainState:
        return self._init(jax.random.PRNGKey(self.run.train.seed))

    def frozen_layers(self) -> tuple[FrozenBase, tuple[int, ...]]:
        """The teacher and its last layer, whose hidden state gives its logits."""
        return self.teacher, (self.teacher.cfg.num_layers,)

    def train_step(self, state: TrainState, batch: np.ndarray, step: int,
                   features: Mapping[int, np.ndarray] | None = None
                   ) -> tuple[TrainState, dict[str, jax.Array]]:
        del step
        return self._train_step(state, self.teacher_params, self.on_mesh.train_batch(batch),
                                self.on_mesh.train_features(features))

    def evaluate(self, state: TrainState, batches: Sequence[np.ndarray]) -> DistillReport:
        totals, tokens = sum_over_batches(
            lambda batch: self._eval_step(state.params, self.teacher_params,
                                          self.on_mesh.eval_batch(batch)), batches)
        return DistillReport(float(totals["loss"]) / tokens, float(totals["soft_ce"]) / tokens,
                             float(totals["agree"]) / tokens, tokens)

    def meta(self) -> dict[str, Any]:
        return {"teacher": self.teacher.record()}

    def check_resume(self, meta: dict[str, Any]) -> None:
        if meta.get("objective") != self.name:
            raise CheckpointError(f"the workdir holds a {meta.get('objective', 'layerskip')} "
                                  "run, not a distilled one; use a new --workdir")
        self.teacher.check_unchanged(meta["teacher"], "this draft model")
