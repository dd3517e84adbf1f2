"""Validated training settings, built from the `train` and `layerskip` parts of a config file."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Mapping
from typing import Any

import ml_collections

from specjax.config import ModelConfig, check, check_number_fields, dataclass_from_mapping
from specjax.data import DataConfig
from specjax.decoding.registry import DecodingConfig
from specjax.nn.layer_kinds import check_layer_kinds
from specjax.sharding import MeshConfig

DROPOUT_SCHEDULES = ("constant", "exp")
EXIT_SCALES = ("uniform", "linear", "sum")
CURRICULA = ("none", "rotational", "gradual")
# What the backward pass recomputes instead of storing (`jax.checkpoint` per layer): nothing;
# everything but the matrix products' outputs; everything (only each layer's input is kept).
REMAT_POLICIES = ("none", "dots", "full")
# Top-level parameter groups a run may keep fixed (the embedding is also the head when tied).
FREEZABLE = ("embed", "unembed", "final_norm")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation, evaluation and checkpointing cadence. `feature_cache`: a folder where a
    run on a frozen model (a head, a distilled draft model) keeps that model's hidden states per
    training window, computed once and read by later epochs and other runs on the same model
    and data (`training.feature_cache`); empty: recomputed every step."""

    batch_size: int = 16
    total_steps: int = 1000
    learning_rate: float = 2e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 200
    eval_batches: int = 8
    save_every: int = 200
    keep_checkpoints: int = 3
    log_every: int = 10
    remat: str = "none"
    grad_accum: int = 1
    frozen: tuple[str, ...] = ()
    feature_cache: str = ""

    def __post_init__(self) -> None:
        check_number_fields(self, "train")  # total_steps=25.5 would train on past its last save
        if isinstance(self.remat, bool):  # configs written before the policies
            object.__setattr__(self, "remat", "full" if self.remat else "none")
        check(self.remat in REMAT_POLICIES, "train.remat", self.remat,
               f"must be one of {list(REMAT_POLICIES)}")
        frozen = tuple(self.frozen.split(",")) if isinstance(self.frozen, str) else tuple(
            self.frozen)
        frozen = tuple(name.strip() for name in frozen if name.strip())
        check(set(frozen) <= set(FREEZABLE), "train.frozen", self.frozen,
               f"must name groups among {list(FREEZABLE)}")
        object.__setattr__(self, "frozen", frozen)
        check(isinstance(self.feature_cache, str), "train.feature_cache", self.feature_cache,
              "must be a folder path")
        for name in ("batch_size", "total_steps", "eval_every", "eval_batches", "save_every",
                     "keep_checkpoints", "log_every", "grad_accum"):
            _positive(self, name)
        check(self.batch_size % self.grad_accum == 0, "train.grad_accum", self.grad_accum,
               f"must divide train.batch_size={self.batch_size} (micro-batches of equal size)")
        for name in ("learning_rate", "grad_clip"):
            _positive(self, name)
        check(0 <= self.warmup_steps < self.total_steps, "train.warmup_steps", self.warmup_steps,
               f"must lie in [0, total_steps={self.total_steps})")
        check(0.0 <= self.min_lr_ratio <= 1.0, "train.min_lr_ratio", self.min_lr_ratio,
               "must lie in [0, 1]")
        check(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "must be >= 0")
        for name in ("b1", "b2"):
            check(0.0 <= getattr(self, name) < 1.0, f"train.{name}", getattr(self, name),
                   "must lie in [0, 1)")


@dataclasses.dataclass(frozen=True)
class LayerSkipConfig:
    """Layer dropout and the early-exit loss (Elhoushi et al. 2024, §4.1).

    `e_scale_warmup` > 0 ramps the early exits' scale linearly from 0 to `e_scale` over that
    many steps (continual training of a model that has never used its early exits: the final
    exit's loss is not disturbed at the start).

    Layer dropout: layer l (0-based) of sample b is skipped with probability
    p_l(t) = S(t) * D(l) * p_max, D(l) = exp(l ln2 / (L-1)) - 1, S = 1 ("constant") or
    exp(t ln2 / (T-1)) - 1 ("exp", for training from scratch).

    Early-exit loss: sum over active exits e of w_e * CE(head(h_e)), w normalised over the exits
    the curriculum enables at this step. Raw weight of exit e < L is e_scale * s(e) with
    s = 1 ("uniform"), e ("linear") or e(e+1)/2 ("sum", the paper's cumulative scale). The final
    exit L always has raw weight s(L), never scaled by e_scale, and is always enabled: it is the
    model we must not hurt (torchtune's convention; the paper adds its L-1 term instead).

    A model with multi-token-prediction modules (`model.mtp_depth`) adds `mtp_weight` times
    their mean cross-entropy (DeepSeek-V3's λ: 0.3, later 0.1); they then draft for it
    (`--strategy mtp` on its workdir).

    Self-distillation of the exits: `exit_distill` = a in (0, 1] makes each early exit's target
    (1 - a) * the next token + a * the last layer's distribution (held constant), since a draft
    is accepted when it agrees with the last layer, right or wrong. 0 is the paper's loss.
    """

    p_max: float = 0.0
    dropout_schedule: str = "constant"
    e_scale: float = 1.0
    exit_scale: str = "uniform"
    curriculum: str = "none"
    rotation_interval: int = 1
    e_scale_warmup: int = 0
    mtp_weight: float = 0.3
    exit_distill: float = 0.0

    def __post_init__(self) -> None:
        check(isinstance(self.e_scale_warmup, int) and self.e_scale_warmup >= 0,
               "layerskip.e_scale_warmup", self.e_scale_warmup, "must be an int >= 0")
        check(0.0 <= self.p_max <= 1.0, "layerskip.p_max", self.p_max, "must lie in [0, 1]")
        check(self.dropout_schedule in DROPOUT_SCHEDULES, "layerskip.dropout_schedule",
               self.dropout_schedule, f"must be one of {list(DROPOUT_SCHEDULES)}")
        check(0.0 <= self.e_scale <= 1.0, "layerskip.e_scale", self.e_scale, "must lie in [0, 1]")
        check(self.exit_scale in EXIT_SCALES, "layerskip.exit_scale", self.exit_scale,
               f"must be one of {list(EXIT_SCALES)}")
        check(self.curriculum in CURRICULA, "layerskip.curriculum", self.curriculum,
               f"must be one of {list(CURRICULA)}")
        check(isinstance(self.rotation_interval, int) and self.rotation_interval >= 1,
               "layerskip.rotation_interval", self.rotation_interval, "must be an int >= 1")
        check(isinstance(self.mtp_weight, (int, float)) and self.mtp_weight >= 0,
              "layerskip.mtp_weight", self.mtp_weight, "must be a number >= 0")
        check(isinstance(self.exit_distill, (int, float)) and 0 <= self.exit_distill <= 1,
              "layerskip.exit_distill", self.exit_distill, "must lie in [0, 1]")


@dataclasses.dataclass(frozen=True)
class InitConfig:
    """Where a LayerSkip run's weights start: `source` = a Hugging Face checkpoint directory or
    a specjax workdir (its latest checkpoint). The source fixes the model (and, unless
    data.tokenizer is set on the command line, the tokenizer); the optimizer and the schedule
    start fresh (`training.init_source`). Empty: a random initialisation."""

    source: str = ""


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    """DistillSpec-style training of a draft model: with `teacher_workdir` set, the model is
    trained to the teacher's next-token distribution on the corpus (soft cross-entropy, i.e.
    KL to the teacher up to its entropy) instead of the corpus' tokens."""

    teacher_workdir: str = ""


def _positive(cfg: Any, name: str) -> None:
    value = getattr(cfg, name)
    check(value > 0, f"train.{name}", value, "must be > 0")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A whole training run: the model, its data, optimisation and the LayerSkip recipe; or,
    with `base_workdir` set, a head trained on that frozen model (the head's own section, which
    its objective reads: `training.heads`)."""

    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    layerskip: LayerSkipConfig
    decoding: DecodingConfig
    distill: DistillConfig
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    init: InitConfig = dataclasses.field(default_factory=InitConfig)
    base_workdir: str = ""


SECTIONS = ("model", "data", "train", "layerskip", "decoding", "distill", "mesh", "init")
SETTINGS = ("base_workdir",)  # top-level values, not sections


def head_config(**train: Any) -> ml_collections.ConfigDict:
    """The sections every config of a head on a frozen model shares: `base_workdir` (required:
    the trained model's workdir), the device mesh (data, fsdp, tensor; the base's weights and
    the head laid out as the rules say) and the train section, `train` replacing its
    defaults. The config adds its head's section and its decoding defaults."""
    config = ml_collections.ConfigDict()
    config.base_workdir = ""
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    config.train = ml_collections.ConfigDict({**dict(
        batch_size=16, total_steps=300, learning_rate=2e-3, warmup_steps=30, min_lr_ratio=0.1,
        weight_decay=0.0, b1=0.9, b2=0.95, grad_clip=1.0, seed=0, eval_every=100,
        eval_batches=8, save_every=100, keep_checkpoints=3, log_every=10, remat="none",
        grad_accum=1, frozen="", feature_cache=""), **train})
    return config


def decoding_section(**defaults: Any) -> ml_collections.ConfigDict:
    """A config file's `decoding` section (the decoding defaults its checkpoints store): every
    registered drafter's option, so that any can be set with --config.decoding.<field> (an
    override must name a field the file has), `defaults` replacing the built-in ones."""
    return ml_collections.ConfigDict(dataclasses.asdict(DecodingConfig(**defaults)))


def config_reference(heads: Mapping[str, type] | None = None) -> str:
    """Every config section and field with its default, for `--help`; `heads`: the head
    sections (name -> settings dataclass) of the scripts that train heads."""
    lines = ["Config fields (override any with --config.<section>.<field>=value):"]
    heads = heads or {}
    for name, section in {field.name: field for field in dataclasses.fields(RunConfig)}.items():
        if name in SETTINGS:
            if heads:
                lines.append(f"  {name}={section.default!r}: the frozen model a head is trained "
                             f"on (with one head section: {', '.join(heads)})")
        else:
            lines.append(_fields_line(name, section.type if isinstance(section.type, type)
                                      else globals()[section.type]))
    lines.extend(_fields_line(name, cls) for name, cls in heads.items())
    return "\n".join(lines)


def _fields_line(name: str, cls: type) -> str:
    described = []
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            described.append(f"{field.name}={field.default!r}")
        elif field.default_factory is not dataclasses.MISSING:
            described.append(f"{field.name}={field.default_factory()!r}")
        else:
            described.append(f"{field.name} (required)")
    return textwrap.fill(f"{name}: " + ", ".join(described), width=96, initial_indent="  ",
                         subsequent_indent="    ")


def parse_run_config(config: Mapping[str, Any], head: str | None = None) -> RunConfig:
    """Validates a config file's dict (ml_collections ConfigDict or plain) into a RunConfig;
    `head` names the head section the run trains (its objective reads it)."""
    values = dict(config)
    unknown = sorted(set(values) - set(SECTIONS) - set(SETTINGS) - {head})
    if unknown:
        raise ValueError(f"config: unknown section(s) {unknown}; known sections: {list(SECTIONS)}"
                         f", a head's section and settings {list(SETTINGS)}")
    missing = [s for s in ("model", "train") if s not in values]
    if missing:
        raise ValueError(f"config: missing section(s) {missing}")
    run = RunConfig(
        model=ModelConfig.from_dict(values["model"]),
        data=DataConfig.from_dict(values.get("data", {})),
        train=dataclass_from_mapping(TrainConfig, values["train"], "train"),
        layerskip=dataclass_from_mapping(LayerSkipConfig, values.get("layerskip", {}),
                                         "layerskip"),
        decoding=dataclass_from_mapping(DecodingConfig, values.get("decoding", {}), "decoding"),
        distill=dataclass_from_mapping(DistillConfig, values.get("distill") or {}, "distill"),
        mesh=dataclass_from_mapping(MeshConfig, values.get("mesh") or {}, "mesh"),
        init=dataclass_from_mapping(InitConfig, values.get("init") or {}, "init"),
        base_workdir=str(values.get("base_workdir", "")))
    check_layer_kinds(run.model)
    run.decoding.check(run.model)
    vocab = run.data.make_tokenizer().vocab_size
    if run.model.vocab_size < vocab:
        raise ValueError(f"the tokenizer {run.data.tokenizer!r} has {vocab} ids, more than the "
                         f"model's vocabulary of {run.model.vocab_size} (model.vocab_size)")
    return run
