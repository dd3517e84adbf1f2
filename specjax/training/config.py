"""Validated training settings, built from the `train` and `layerskip` parts of a config file."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Mapping
from typing import Any

import ml_collections

from specjax.config import ModelConfig, dataclass_from_mapping
from specjax.data import DataConfig
from specjax.decoding.registry import DecodingConfig
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
    """Optimisation, evaluation and checkpointing cadence."""

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

    def __post_init__(self) -> None:
        if isinstance(self.remat, bool):  # configs written before the policies
            object.__setattr__(self, "remat", "full" if self.remat else "none")
        _check(self.remat in REMAT_POLICIES, "train.remat", self.remat,
               f"must be one of {list(REMAT_POLICIES)}")
        frozen = tuple(self.frozen.split(",")) if isinstance(self.frozen, str) else tuple(
            self.frozen)
        frozen = tuple(name.strip() for name in frozen if name.strip())
        _check(set(frozen) <= set(FREEZABLE), "train.frozen", self.frozen,
               f"must name groups among {list(FREEZABLE)}")
        object.__setattr__(self, "frozen", frozen)
        for name in ("batch_size", "total_steps", "eval_every", "eval_batches", "save_every",
                     "keep_checkpoints", "log_every", "grad_accum"):
            _positive(self, name)
        _check(self.batch_size % self.grad_accum == 0, "train.grad_accum", self.grad_accum,
               f"must divide train.batch_size={self.batch_size} (micro-batches of equal size)")
        for name in ("learning_rate", "grad_clip"):
            _positive(self, name)
        _check(0 <= self.warmup_steps < self.total_steps, "train.warmup_steps", self.warmup_steps,
               f"must lie in [0, total_steps={self.total_steps})")
        _check(0.0 <= self.min_lr_ratio <= 1.0, "train.min_lr_ratio", self.min_lr_ratio,
               "must lie in [0, 1]")
        _check(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "must be >= 0")
        for name in ("b1", "b2"):
            _check(0.0 <= getattr(self, name) < 1.0, f"train.{name}", getattr(self, name),
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
    """

    p_max: float = 0.0
    dropout_schedule: str = "constant"
    e_scale: float = 1.0
    exit_scale: str = "uniform"
    curriculum: str = "none"
    rotation_interval: int = 1
    e_scale_warmup: int = 0

    def __post_init__(self) -> None:
        _check(isinstance(self.e_scale_warmup, int) and self.e_scale_warmup >= 0,
               "layerskip.e_scale_warmup", self.e_scale_warmup, "must be an int >= 0")
        _check(0.0 <= self.p_max <= 1.0, "layerskip.p_max", self.p_max, "must lie in [0, 1]")
        _check(self.dropout_schedule in DROPOUT_SCHEDULES, "layerskip.dropout_schedule",
               self.dropout_schedule, f"must be one of {list(DROPOUT_SCHEDULES)}")
        _check(0.0 <= self.e_scale <= 1.0, "layerskip.e_scale", self.e_scale, "must lie in [0, 1]")
        _check(self.exit_scale in EXIT_SCALES, "layerskip.exit_scale", self.exit_scale,
               f"must be one of {list(EXIT_SCALES)}")
        _check(self.curriculum in CURRICULA, "layerskip.curriculum", self.curriculum,
               f"must be one of {list(CURRICULA)}")
        _check(isinstance(self.rotation_interval, int) and self.rotation_interval >= 1,
               "layerskip.rotation_interval", self.rotation_interval, "must be an int >= 1")


@dataclasses.dataclass(frozen=True)
class KangarooConfig:
    """Kangaroo's adapter (Liu et al. 2024; `specjax.heads.adapter`) on exit `exit_layer` of the
    frozen model in `base_workdir`, distilled to the base's final distribution (soft
    cross-entropy). Decoding with it: `--strategy kangaroo` on the adapter's workdir."""

    exit_layer: int = 1

    def __post_init__(self) -> None:
        _check(isinstance(self.exit_layer, int) and self.exit_layer >= 1, "kangaroo.exit_layer",
               self.exit_layer, "must be an int >= 1")


@dataclasses.dataclass(frozen=True)
class SpecDecConfig:
    """SpecDec++'s acceptance head (`specjax.heads.acceptance_head`) on exit `exit_layer` of the
    frozen model in `base_workdir`: an MLP of hidden `width` trained (binary cross-entropy) to
    predict whether the target accepts a draft drawn at `temperature` / `top_p` (temperature 0:
    greedy drafts and exact-match acceptance). Decoding with it: `--strategy specdec --draft_risk h`
    on the head's workdir. `children` = k >= 1 trains it for dynamic trees instead
    (`--strategy specdec --tree dynamic`): on the draft's top k tokens at every position, each
    labelled with the probability that the target's own choice is that token."""

    exit_layer: int = 1
    width: int = 128
    temperature: float = 0.8
    top_p: float = 0.95
    children: int = 0

    def __post_init__(self) -> None:
        _check(isinstance(self.exit_layer, int) and self.exit_layer >= 1, "specdec.exit_layer",
               self.exit_layer, "must be an int >= 1")
        _check(isinstance(self.width, int) and self.width >= 1, "specdec.width", self.width,
               "must be an int >= 1")
        _check(isinstance(self.temperature, (int, float)) and self.temperature >= 0,
               "specdec.temperature", self.temperature, "must be >= 0 (0: greedy)")
        _check(isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1, "specdec.top_p",
               self.top_p, "must lie in (0, 1]")
        _check(self.temperature > 0 or self.top_p == 1, "specdec.top_p", self.top_p,
               "filters sampled drafts: set specdec.temperature > 0 (0 is greedy)")
        _check(isinstance(self.children, int) and self.children >= 0, "specdec.children",
               self.children, "must be an int >= 0 (0: a chain's drafts)")


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
    """Medusa heads (`specjax.heads.medusa`) on the last hidden state of the frozen model in
    `base_workdir`: `num_heads` heads, head k trained (cross-entropy on the corpus) to predict
    the token k + 1 places after the next, its loss weighted by `decay`**k as in Medusa-1.
    Decoding with them: `--strategy medusa` on the heads' workdir (a chain or a tree at most
    `num_heads` deep)."""

    num_heads: int = 4
    decay: float = 0.8

    def __post_init__(self) -> None:
        _check(isinstance(self.num_heads, int) and self.num_heads >= 1, "medusa.num_heads",
               self.num_heads, "must be an int >= 1")
        _check(isinstance(self.decay, (int, float)) and 0 < self.decay <= 1, "medusa.decay",
               self.decay, "must lie in (0, 1]")


@dataclasses.dataclass(frozen=True)
class CalmConfig:
    """CALM's confidence classifier (`specjax.heads.confidence_head`) on the frozen model in
    `base_workdir`, trained at the exits `exits` (empty: every exit below the last) to predict
    whether an exit's argmax equals the final layer's (class-balanced binary cross-entropy,
    averaged over the exits). Decoding with it: `--strategy calm --calm_measure classifier` on
    the head's workdir."""

    exits: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        exits = tuple(self.exits)
        _check(all(isinstance(e, int) and e >= 1 for e in exits)
               and list(exits) == sorted(set(exits)), "calm.exits", self.exits,
               "must be distinct exits >= 1 in ascending order (empty: every exit below the "
               "last)")
        object.__setattr__(self, "exits", exits)


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
    _check(value > 0, f"train.{name}", value, "must be > 0")


def _check(ok: bool, field: str, value: Any, why: str) -> None:
    if not ok:
        raise ValueError(f"{field}={value!r} {why}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A whole training run: the model, its data, optimisation and the LayerSkip recipe; or,
    with `base_workdir` set, a head trained on that frozen model (the `kangaroo`, `specdec`,
    `calm` or `medusa` section)."""

    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    layerskip: LayerSkipConfig
    decoding: DecodingConfig
    kangaroo: KangarooConfig
    specdec: SpecDecConfig
    calm: CalmConfig
    distill: DistillConfig
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    init: InitConfig = dataclasses.field(default_factory=InitConfig)
    medusa: MedusaConfig = dataclasses.field(default_factory=MedusaConfig)
    base_workdir: str = ""


SECTIONS = ("model", "data", "train", "layerskip", "decoding", "kangaroo", "specdec", "calm",
            "medusa", "distill", "mesh", "init")
SETTINGS = ("base_workdir",)  # top-level values, not sections


def decoding_section(**defaults: Any) -> ml_collections.ConfigDict:
    """A config file's `decoding` section (the decoding defaults its checkpoints store): every
    registered drafter's option, so that any can be set with --config.decoding.<field> (an
    override must name a field the file has), `defaults` replacing the built-in ones."""
    return ml_collections.ConfigDict(dataclasses.asdict(DecodingConfig(**defaults)))


def config_reference() -> str:
    """Every config section and field with its default, for `train.py --help`."""
    lines = ["Config fields (override any with --config.<section>.<field>=value):"]
    for section in dataclasses.fields(RunConfig):
        if section.name in SETTINGS:
            lines.append(f"  {section.name}={section.default!r}: the frozen model a head is "
                         "trained on (with the kangaroo, specdec, calm or medusa section)")
            continue
        cls = section.type if isinstance(section.type, type) else globals()[section.type]
        described = []
        for field in dataclasses.fields(cls):
            if field.default is not dataclasses.MISSING:
                described.append(f"{field.name}={field.default!r}")
            elif field.default_factory is not dataclasses.MISSING:
                described.append(f"{field.name}={field.default_factory()!r}")
            else:
                described.append(f"{field.name} (required)")
        lines.append(textwrap.fill(f"{section.name}: " + ", ".join(described), width=96,
                                   initial_indent="  ", subsequent_indent="    "))
    return "\n".join(lines)


def parse_run_config(config: Mapping[str, Any]) -> RunConfig:
    """Validates a config file's dict (ml_collections ConfigDict or plain) into a RunConfig."""
    values = dict(config)
    unknown = sorted(set(values) - set(SECTIONS) - set(SETTINGS))
    if unknown:
        raise ValueError(f"config: unknown section(s) {unknown}; known sections: {list(SECTIONS)}"
                         f" and settings {list(SETTINGS)}")
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
        kangaroo=dataclass_from_mapping(KangarooConfig, values.get("kangaroo", {}), "kangaroo"),
        specdec=dataclass_from_mapping(SpecDecConfig, values.get("specdec", {}), "specdec"),
        calm=dataclass_from_mapping(CalmConfig, values.get("calm") or {}, "calm"),
        distill=dataclass_from_mapping(DistillConfig, values.get("distill") or {}, "distill"),
        mesh=dataclass_from_mapping(MeshConfig, values.get("mesh") or {}, "mesh"),
        init=dataclass_from_mapping(InitConfig, values.get("init") or {}, "init"),
        medusa=dataclass_from_mapping(MedusaConfig, values.get("medusa") or {}, "medusa"),
        base_workdir=str(values.get("base_workdir", "")))
    run.decoding.check(run.model)
    vocab = run.data.make_tokenizer().vocab_size
    if run.model.vocab_size < vocab:
        raise ValueError(f"the tokenizer {run.data.tokenizer!r} has {vocab} ids, more than the "
                         f"model's vocabulary of {run.model.vocab_size} (model.vocab_size)")
    return run
