"""Per-exit validation metrics: loss, top-1 accuracy, and top-1 agreement with the final layer.

Agreement of exit E with the final exit is the greedy acceptance rate of a self-speculative draft
from layer E, so this table predicts decoding speed before any decoding is run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.config import ModelConfig
from specjax.model import Params, embed, exit_logits, run_layers


@dataclasses.dataclass(frozen=True)
class ExitReport:
    """Validation metrics of every exit 1..L (index e-1 is exit e)."""

    loss: tuple[float, ...]
    accuracy: tuple[float, ...]
    agreement: tuple[float, ...]
    tokens: int

    @property
    def final_loss(self) -> float:
        return self.loss[-1]

    @property
    def bits_per_token(self) -> float:
        """Final-layer nats/token in bits (bits/byte for the byte-level tokenizer)."""
        return self.final_loss / math.log(2)

    def table(self) -> str:
        lines = [f"{'exit':>4}  {'loss':>7}  {'top1 acc':>8}  {'agree w/ final':>14}"]
        rows = zip(self.loss, self.accuracy, self.agreement, strict=True)
        for e, (loss, acc, agree) in enumerate(rows, 1):
            lines.append(f"{e:>4}  {loss:7.4f}  {acc:8.3f}  {agree:14.3f}")
        lines.append(f"final layer: {self.final_loss:.4f} nats/token = {self.bits_per_token:.4f} "
                     f"bits/token over {self.tokens} validation tokens")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"exit_loss": list(self.loss), "exit_accuracy": list(self.accuracy),
                "exit_agreement": list(self.agreement), "final_loss": self.final_loss,
                "bits_per_token": self.bits_per_token, "tokens": self.tokens}


def make_eval_step(cfg: ModelConfig) -> Callable:
    """Returns eval_step(params, batch [B, T+1]) -> per-exit sums over the batch."""

    def eval_step(params: Params, batch: jax.Array) -> dict[str, jax.Array]:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        per_layer = run_layers(params, cfg, embed(params, cfg, inputs))

        def one_exit(hidden):
            logits = exit_logits(params, cfg, hidden)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
            return jnp.sum(ce), jnp.argmax(logits, axis=-1)

        ce_sums, predictions = jax.lax.map(one_exit, per_layer)
        return {"ce_sum": ce_sums,
                "correct": jnp.sum(predictions == targets[None], axis=(1, 2)),
                "agree": jnp.sum(predictions == predictions[-1:], axis=(1, 2))}

    return eval_step


def sum_over_batches(eval_batch: Callable[[np.ndarray], dict[str, jax.Array]],
                     batches: Sequence[np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """Each metric of `eval_batch(batch)` summed over the batches, and the number of predicted
    tokens (every position of a [B, T+1] batch but the last)."""
    totals, tokens = None, 0
    for batch in batches:
        sums = jax.device_get(eval_batch(batch))
        totals = sums if totals is None else {k: totals[k] + sums[k] for k in totals}
        tokens += batch.shape[0] * (batch.shape[1] - 1)
    return totals, tokens


def evaluate(eval_step: Callable, params: Params, batches: Sequence[np.ndarray]) -> ExitReport:
    totals, tokens = sum_over_batches(lambda batch: eval_step(params, batch), batches)
    return ExitReport(loss=tuple(float(x) / tokens for x in totals["ce_sum"]),
                      accuracy=tuple(float(x) / tokens for x in totals["correct"]),
                      agreement=tuple(float(x) / tokens for x in totals["agree"]),
                      tokens=tokens)
