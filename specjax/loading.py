"""Loading a workdir for decoding: a model, or a head trained on a frozen base model, and
optionally more drafters' workdirs.

A model's workdir (trained or imported) gives its params. A head's workdir (Kangaroo's adapter,
SpecDec++'s acceptance head) names its base: the base's params are loaded from there (refused
if its weights changed since) and the head's weights become the draft params of the strategy
of the head's name. Draft workdirs add drafters: a model with the same tokenizer becomes the
`draft` strategy's draft model, a head trained on this very model (same weights) its
strategy's head, so every drafter can run in one process. A checkpoint that stopped before its
run's `total_steps` (an interrupted run, a head's base included) loads with a warning, which
`bench/bench.py` also prints above its table and records in its JSON.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
from absl import logging
from jax.sharding import Mesh

from specjax.config import ModelConfig
from specjax.decoding.drafter import DraftWeights
from specjax.decoding.engine import Generator
from specjax.heads.mtp import MTP
from specjax.io.calibrated_defaults import with_calibrated
from specjax.io.checkpoint import (
    Checkpointer,
    CheckpointError,
    UnreadableCheckpointError,
    load_params,
)
from specjax.io.draft_vocab import read_ranking
from specjax.model import Params, unstack_layers
from specjax.training.frozen_base import params_checksum, trained_base
from specjax.training.heads.feature_head import recorded
from specjax.training.heads.mtp import MtpConfig
from specjax.training.registry import HEADS


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """The target model (params, config), the workdir's checkpoint metadata (decoding defaults,
    tokenizer), the trained drafters' weights by strategy name and the workdir's ranking of ids
    for drafting over part of the vocabulary (`io.draft_vocab`; a head's: its base's)."""

    workdir: str
    params: Params
    cfg: ModelConfig
    meta: dict[str, Any]
    draft_weights: dict[str, DraftWeights]
    mesh: Mesh | None = None
    unfinished: tuple[str, ...] = ()  # `unfinished_training`'s note for each such workdir
    draft_vocab: np.ndarray | None = None

    def warn_long_prompts(self, lengths: Sequence[int]) -> None:
        """Logs a warning when a prompt is longer than the sequences the model was trained on
        (its data's seq_len; nothing for an imported model, which records none): past that
        length a small model's output degrades, often to repeated whitespace."""
        trained = self.meta.get("config", {}).get("data", {}).get("seq_len")
        longest = max(lengths, default=0)
        if trained is not None and longest > trained:
            logging.warning("a prompt of %d tokens is longer than the %d-token sequences the "
                            "model in %s was trained on: expect degraded output", longest,
                            trained, self.workdir)

    def generator(self, **options: Any) -> Generator:
        """A `Generator` over this model (on its mesh, if any) that drafts with its trained
        drafters' weights."""
        return Generator(self.params, self.cfg, draft_weights=self.draft_weights,
                         mesh=self.mesh, draft_vocab=self.draft_vocab, **options)

    def at_head_exit(self, name: str, options: Any, chosen: Collection[str]) -> Any:
        """Decoding `options` for strategy `name`, at the exit its trained head was trained on
        when the user did not choose `exit_layer` (`chosen`: the options set by hand): the
        checkpoint's default exit is the target's own (selfspec's), and a head drafts only
        from its exit (one chosen by hand that differs is refused when the head is bound)."""
        weights = self.draft_weights.get(name)
        if "exit_layer" in chosen or weights is None or weights.exit_layer is None:
            return options
        return dataclasses.replace(options, exit_layer=weights.exit_layer)


def load_model(workdir: str, step: int | None = None,
               draft_workdir: str | Sequence[str] | None = None, *,
               mesh: Mesh | None = None) -> LoadedModel:
    """The workdir's latest checkpoint (or `step`) ready for decoding, with the drafters in
    `draft_workdir` (one or several workdirs, their latest checkpoints): a model (the `draft`
    strategy's draft model) or a head trained on this model. On `mesh`, every weight is
    restored straight into its layout there. Logs a warning for each workdir whose checkpoint
    stopped before its run's total steps, a head's base included (`LoadedModel.unfinished`;
    not for `workdir` when `step` names one)."""
    target = _load_target(workdir, step, mesh)
    notes = list(target.unfinished)
    if step is None:
        notes.append(unfinished_training(workdir, target.meta))
    checksum = functools.cache(lambda: target.meta["base"]["checksum"] if "base" in target.meta
                               else params_checksum(target.params))  # hashed once, if needed
    weights = dict(target.draft_weights)
    extra = [draft_workdir] if isinstance(draft_workdir, str) else list(draft_workdir or [])
    for path in extra:
        added, meta = _drafter(target, checksum, path)
        notes.append(unfinished_training(path, meta))
        clash = sorted(set(added) & set(weights))
        if clash:
            raise ValueError(f"{path} adds a second {clash[0]!r} drafter; give one per strategy")
        weights.update(added)
    notes = tuple(note for note in notes if note)
    for note in notes:
        logging.warning(note)
    return dataclasses.replace(target, draft_weights=weights, unfinished=notes)


def unfinished_training(workdir: str, meta: dict[str, Any]) -> str | None:
    """A one-line note when the checkpoint in `workdir` (its metadata `meta`) stopped before
    its run's total steps, as an interrupted run leaves it; None for a finished run or an
    imported checkpoint (no run recorded)."""
    total = meta.get("config", {}).get("train", {}).get("total_steps")
    step = meta.get("step")
    if total is None or step is None or step >= total:
        return None
    return (f"{workdir} holds step {step} of its run's {total}: its training stopped early "
            "(interrupted, diverged or still running), so its figures are not the trained "
            "model's (an interrupted run finishes with its train command run again)")


def _drafter(target: LoadedModel, target_checksum: Callable[[], str],
             workdir: str) -> tuple[dict[str, DraftWeights], dict[str, Any]]:
    """The draft weights in `workdir`, by strategy, checked to fit the `target` model (whose
    weights' checksum `target_checksum` gives), and the metadata of the checkpoint loaded."""
    meta = _read_meta(workdir, None)
    if "base" in meta:  # a head: it must have been trained on exactly these weights
        if meta["base"].get("checksum") != target_checksum():
            raise CheckpointError(f"the {meta.get('objective')} head in {workdir} was trained "
                                  f"on the model in {meta['base']['workdir']}, not on the "
                                  f"weights of {target.workdir}")
        meta, weights = _load_head(workdir, None, meta, target.mesh)
        return weights, meta
    params, cfg, meta = load_params(workdir, mesh=target.mesh)
    tokenizers = (target.meta.get("tokenizer", "bytes"), meta.get("tokenizer", "bytes"))
    if tokenizers[0] != tokenizers[1] or cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"the draft model in {workdir} has tokenizer {tokenizers[1]!r} "
                         f"with {cfg.vocab_size} ids, the target {tokenizers[0]!r} with "
                         f"{target.cfg.vocab_size}: a draft model must share the target's")
    return {"draft": DraftWeights(unstack_layers(params, cfg), cfg=cfg, workdir=workdir)}, meta


def _read_meta(workdir: str, step: int | None) -> dict[str, Any]:
    """A checkpoint's metadata; {} when unreadable (`load_params` then falls back to a readable
    step, if any)."""
    try:
        return Checkpointer(workdir, create=False).read_meta(step)
    except UnreadableCheckpointError:
        return {}


def _load_target(workdir: str, step: int | None, mesh: Mesh | None) -> LoadedModel:
    """The model (or a head's base and the head) in `workdir`, its metadata carrying the
    workdir's calibrated decoding defaults."""
    meta = _read_meta(workdir, step)
    if "base" not in meta:  # a model's workdir, not a head's
        params, cfg, meta = load_params(workdir, step, mesh=mesh)
        return LoadedModel(workdir, params, cfg, with_calibrated(meta, workdir, cfg),
                           own_drafters(params, cfg), mesh,
                           draft_vocab=read_ranking(workdir, cfg.vocab_size))
    recorded = meta["base"]
    if not os.path.isdir(recorded["workdir"]):
        raise CheckpointError(f"the {meta['objective']} head in {workdir} was trained on the "
                              f"model in {recorded['workdir']}, which no longer exists: move "
                              "that workdir back, or train the head again on the model where it "
                              "is now")
    base = trained_base(recorded, workdir, mesh=mesh)
    meta, weights = _load_head(workdir, step, meta, mesh)
    base_note = unfinished_training(recorded["workdir"], base.meta)  # a head on a partial base
    ranking = read_ranking(workdir, base.cfg.vocab_size)
    return LoadedModel(workdir, base.params, base.cfg, with_calibrated(meta, workdir, base.cfg),
                       weights, mesh, unfinished=(base_note,) if base_note else (),
                       draft_vocab=(read_ranking(recorded["workdir"], base.cfg.vocab_size)
                                    if ranking is None else ranking))


def own_drafters(params: Params, cfg: ModelConfig) -> dict[str, DraftWeights]:
    """The drafters a model trained with (its MTP modules: `--strategy mtp` on its workdir)."""
    if not cfg.mtp_depth:
        return {}
    settings = recorded(MTP, MtpConfig(depth=cfg.mtp_depth), cfg)
    return {"mtp": DraftWeights(params["mtp"], settings=settings)}


def _load_head(workdir: str, step: int | None, meta: dict[str, Any],
               mesh: Mesh | None) -> tuple[dict[str, Any], dict[str, DraftWeights]]:
    """A head's checkpoint metadata and weights (for each strategy that reads them), given its
    metadata."""
    head = HEADS[meta["objective"]]
    settings = meta[head.record_key]
    params, _, meta = load_params(workdir, step, abstract=lambda cfg: head.abstract_params(
        cfg, settings), mesh=mesh)
    weights = DraftWeights(params, settings.get("exit_layer"), settings=settings)
    return meta, {name: weights for name in head.strategies()}
