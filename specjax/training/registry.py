"""The one registry of training objectives, and the choice of one from a config.

A config with none of the head sections trains a model (LayerSkip), or, with
`distill.teacher_workdir` set, distils a frozen teacher into it (a draft model). A config with a
head section trains that head on the frozen model in `base_workdir`: the model, its tokenizer
and the data and decoding defaults come from the base, the config's sections override the last
two. Every module of `specjax.training.heads` that exports `HEADS` ({name: `HeadOnBase`
subclass}) is registered: adding a head is adding its file (its objective, its section's
settings) and its tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specjax.data import BatchSampler, Corpus
from specjax.discovery import exported
from specjax.training import heads
from specjax.training.config import parse_run_config
from specjax.training.distill import Distill
from specjax.training.frozen_base import HeadOnBase, config_on_base, load_base
from specjax.training.init_source import InitSource
from specjax.training.objective import LayerSkip, Objective

# Heads trained on a frozen base, by name: config section, objective and decoding strategy.
HEADS: Mapping[str, type[HeadOnBase]] = exported(heads, "HEADS", "head")


def make_objective(config: Mapping[str, Any], source: InitSource | None = None) -> Objective:
    """The objective `config` describes, with its run config validated (and the base loaded);
    `source`: the model a LayerSkip run starts from (`training.init_source.resolve_init`)."""
    heads = [name for name in HEADS if name in config]
    if not heads:
        if config.get("base_workdir"):
            raise ValueError(f"config.base_workdir is set but no head section ({sorted(HEADS)}) "
                             "says what to train on it")
        teacher = dict(config.get("distill") or {}).get("teacher_workdir")
        if teacher:
            return Distill(parse_run_config(config), dict(config), load_base(teacher))
        return LayerSkip(parse_run_config(config), dict(config), source)
    if len(heads) > 1:
        raise ValueError(f"config: one head per run, got sections {heads}")
    head = HEADS[heads[0]]
    base = load_base(str(config.get("base_workdir", "")))
    values = head.on_base(config_on_base(config, base))
    return head(parse_run_config(values, head.name), values, base)


def layerskip_with_data(config: Mapping[str, Any], tool: str) -> tuple[LayerSkip, BatchSampler]:
    """A LayerSkip run's objective and its training batches, for the tools that run its train
    step outside the trainer (`tool` names the one asking, for the error)."""
    objective = make_objective(config)
    if not isinstance(objective, LayerSkip):
        raise ValueError(f"{tool} runs the LayerSkip train step; give a model config")
    run = objective.run
    return objective, BatchSampler(Corpus.build(run.data).train, run.train.batch_size,
                                   run.train.seed)
