"""Shared pieces of the inference entry points: decoding flags, options, prompt files."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import jax
from absl import flags, logging
from jax.sharding import Mesh

from specjax import keywords
from specjax.chat import check_messages
from specjax.cli.entrypoint import run_cli
from specjax.config import (
    ModelConfig,
    dataclass_from_mapping,
    kind_phrase,
    kind_problem,
    require_count,
)
from specjax.data import heldout_prompts, jsonl_rows, run_data
from specjax.decoding.drafter import Drafter
from specjax.decoding.engine import Generator
from specjax.decoding.registry import (
    DecodingConfig,
    declared_options,
    make_strategy,
    require_used,
)
from specjax.decoding.sampling import SamplingParams
from specjax.outputs import check_destinations, read_json_cache, staged, write_json_cache
from specjax.prompt_sets import PromptInput, token_ids
from specjax.sharding import MeshConfig, make_mesh
from specjax.tokenizer import Tokenizer
from specjax.tools.tree_search import Measurements, TreePlan, measure

DECODING_FLAGS = {field.name: field.metadata["help"]
                  for field in dataclasses.fields(DecodingConfig)}
LISTED_FLAGS = tuple(field.name for field in dataclasses.fields(DecodingConfig)
                     if field.metadata["listed"])  # hold commas: swept by repeating the flag


def define_decoding_flags(sweep: bool = False, strategies: Sequence[str] | None = None) -> None:
    """One flag per `DecodingConfig` field (every registered drafter's options, or only those
    `strategies` declare), defaulting to the checkpoint's value. With `sweep`, each takes a
    comma-separated list (the `listed` ones, whose values hold commas, are repeated instead)."""
    defaults = DecodingConfig()
    wanted = declared_options(strategies) if strategies is not None else DECODING_FLAGS
    for name, text in DECODING_FLAGS.items():
        if name not in wanted:
            continue
        text += " Default: the checkpoint's."
        kind = type(getattr(defaults, name))
        if sweep and name in LISTED_FLAGS:
            flags.DEFINE_multi_string(name, None, text[:-1] + ", each value swept")  # absl adds
            # "; repeat this option to specify a list of values"
        elif sweep:
            flags.DEFINE_list(name, None, text + " Comma-separated values are swept.")
        elif kind is int:
            flags.DEFINE_integer(name, None, text)
        elif kind is float:
            flags.DEFINE_float(name, None, text)
        else:
            flags.DEFINE_string(name, None, text)


def decoding_defaults(meta: dict[str, Any]) -> DecodingConfig:
    """The checkpoint's `decoding` config section (DecodingConfig defaults where absent)."""
    section = meta.get("config", {}).get("decoding") or {}
    return dataclass_from_mapping(DecodingConfig, section, "decoding")


DEFAULT_STRATEGY = "selfspec"  # decoded with when no strategy is named and none is tuned


def decoding_mode(sampling: SamplingParams | None) -> str:
    """Which of a workdir's tuned strategies applies: "greedy" (no sampling) or "sampled"."""
    return "greedy" if sampling is None else "sampled"


def default_choice(meta: dict[str, Any], cfg: ModelConfig, sampling: SamplingParams | None,
                   weights: Collection[str]) -> tuple[str, DecodingConfig]:
    """The strategy a workdir decodes with when none is named, and its defaults: the one
    `infer/tune.py` stored for this mode (greedy when `sampling` is None, else sampled) with
    its options laid over the checkpoint's, else selfspec with them. A tuned strategy whose
    trained weights are not loaded (`weights`: the strategies that have theirs) falls back to
    selfspec, with a warning."""
    defaults = decoding_defaults(meta)
    choice = meta.get("tuned", {}).get(decoding_mode(sampling))
    if choice is None:
        return DEFAULT_STRATEGY, defaults
    name = choice["strategy"]
    if name not in weights and make_strategy(name, defaults).needs_weights:
        logging.warning("the tuned strategy %s drafts with trained weights, not loaded: "
                        "decoding with %s (load its workdir with --draft_workdir)", name,
                        DEFAULT_STRATEGY)
        return DEFAULT_STRATEGY, defaults
    return name, decoding_options(defaults, cfg, choice["options"], prefix="tuned ")


def decoding_options(defaults: DecodingConfig, cfg: ModelConfig, overrides: Mapping[str, Any],
                     strategies: Sequence[str] = (), prefix: str = "--") -> DecodingConfig:
    """`defaults` with every override that is not None, converted to the field's type and
    checked against the model and, given `strategies`, against them: an override none of them
    reads is an error (`registry.require_used`). Errors name an override as `prefix` + its
    name ("--" for a flag, "" for an API keyword)."""
    values = {}
    known = [f.name for f in dataclasses.fields(defaults)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(keywords.unknown(unknown[0], known, "the decoding options"))
    for name, value in overrides.items():
        if name == "tree" and isinstance(value, str) and not value.strip():
            raise ValueError(f"{prefix}tree is empty: give 'chain' for a chain, or leave it out "
                             "for the checkpoint's default")
        if value is not None:
            values[name] = _option_value(value, type(getattr(defaults, name)), prefix + name)
    options = dataclasses.replace(defaults, **values)
    options.check(cfg)
    if strategies:
        require_used(strategies, [options], values, prefix)
    return options


def _option_value(value: Any, kind: type, name: str) -> Any:
    """`value` as an option of type `kind`: text parsed as its flag parses it (a sweep's
    values are text), a number kept only when of that kind (exit_layer=2.7 is an error, not
    exit 2); a one-line error naming `name` otherwise."""
    try:
        converted = kind(value) if isinstance(value, str) or kind is str else value
    except ValueError:
        converted = None
    if kind_problem(converted, kind):
        raise ValueError(f"{name}={value!r}: expected {kind_phrase(kind)}")
    return kind(converted)


def options_from_flags(defaults: DecodingConfig, cfg: ModelConfig,
                       strategies: Sequence[str]) -> DecodingConfig:
    """`defaults` with the decoding flags the user set (`define_decoding_flags`), checked
    against the model and against `strategies`: a flag none of them reads is an error."""
    return decoding_options(defaults, cfg, {name: getattr(flags.FLAGS, name)
                                            for name in DECODING_FLAGS if name in flags.FLAGS},
                            strategies)


def require_weights_used(draft_workdirs: Sequence[str] | None,
                         strategies: Iterable[Drafter]) -> None:
    """A one-line error for --draft_workdir when none of the strategies drafts with weights of
    its own (it would be loaded and ignored)."""
    if draft_workdirs and not any(strategy.needs_weights for strategy in strategies):
        raise ValueError("--draft_workdir: the chosen strategies draft without weights of their "
                         "own (kangaroo, specdec, draft and calm's classifier use them)")


def sweep_options(defaults: DecodingConfig, cfg: ModelConfig,
                  sweeps: Mapping[str, list | None]) -> list[DecodingConfig]:
    """Every combination of the swept values (a field without values keeps its default)."""
    names = [name for name, values in sweeps.items() if values]
    return [decoding_options(defaults, cfg, dict(zip(names, combo, strict=True)))
            for combo in itertools.product(*(sweeps[name] for name in names))]


def define_mesh_flag() -> None:
    """`--mesh data,fsdp,tensor`: decode on a device mesh instead of one device."""
    flags.DEFINE_list("mesh", None, "Decode on a mesh of every device with these data,fsdp,"
                      "tensor sizes (-1 once: the devices the others leave), e.g. 1,1,-1 splits "
                      "the weights over all devices, -1,1,1 the prompts' rows. Default: one "
                      "device.")


def mesh_from_flag() -> Mesh | None:
    """The mesh `--mesh` asks for (None: one device); a size that does not fit is an error."""
    sizes = flags.FLAGS.mesh
    return None if sizes is None else make_mesh(MeshConfig.parse(sizes))


def require_positive_flags(*names: str) -> None:
    """A one-line error for the first of these integer flags that is below 1
    (`config.require_count`)."""
    for name in names:
        require_count(f"--{name}", flags.FLAGS[name].value)


def whole_numbers_flag(name: str, minimum: int) -> list[int]:
    """The comma-separated list flag `name` as integers, each at least `minimum`; a one-line
    error otherwise."""
    numbers = []
    for value in flags.FLAGS[name].value:
        try:
            numbers.append(int(value))
        except ValueError:
            raise ValueError(f"--{name}={value!r}: expected whole numbers") from None
        if numbers[-1] < minimum:
            raise ValueError(f"--{name}={numbers[-1]} must be >= {minimum}")
    return numbers


def read_prompts_file(path: str) -> list[PromptInput]:
    """One JSON object per line with a "prompt" string, a "messages" conversation (a list of
    {"role", "content"} objects, rendered with the model's chat template) or "ids", a prompt's
    token ids (taken as they are)."""
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a directory, not a JSONL file of prompts")
    if not os.path.exists(path):
        raise ValueError(f"{path}: no such prompts file")
    prompts = []
    for number, record in jsonl_rows(path, strict_utf8=True):
        if isinstance(record, dict) and "messages" in record:
            try:
                prompts.append(check_messages(record["messages"]))
            except ValueError as error:
                raise ValueError(f"{path}:{number}: {error}") from None
            continue
        if isinstance(record, dict) and "ids" in record:
            ids = token_ids(record["ids"])
            if ids is None:
                raise ValueError(f"{path}:{number}: 'ids' must be a non-empty list of token ids")
            prompts.append(ids)
            continue
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise ValueError(f"{path}:{number}: expected an object with a string 'prompt', "
                             "a 'messages' list or an 'ids' list")
        prompts.append(record["prompt"])
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def run_writing_json(body: Callable[[], Any], path: str | None,
                     to_json: Callable[[Any], Any] = lambda result: result, *,
                     reads: Mapping[str, str | Sequence[str] | None] | None = None,
                     writes: Mapping[str, str | None] | None = None) -> Any:
    """An entry point's body (`run_cli`) whose result is also written to `path` (--output_json)
    as JSON, whole or not at all (`outputs.staged`: a bad path fails before any work; a failed
    or interrupted run leaves an existing file as it was). `reads`/`writes`: the run's input
    and other output flags, checked first (`outputs.check_destinations`)."""

    def written() -> Any:
        check_destinations({"--output_json": path, **(writes or {})}, reads or {})
        with staged(path) as partial:
            result = body()
            if partial:
                with open(partial, "w", encoding="utf-8") as output:
                    json.dump(to_json(result), output, indent=2)
        return result

    return run_cli(written)


# `--tree auto` measures exit E's shared head: selfspec's drafts (ar drafts nothing)
AUTO_TREE_STRATEGIES = ("selfspec", "ar")


def resolve_auto_tree(options: DecodingConfig, generator: Generator,
                      prompts: Callable[[], Sequence[Sequence[int]]],
                      sampling: SamplingParams | None, *, workdir: str, step: int,
                      strategies: Sequence[str] = AUTO_TREE_STRATEGIES
                      ) -> tuple[DecodingConfig, TreePlan | None]:
    """Replaces `tree="auto"` (or "auto:N", exactly N nodes) by the Sequoia tree measured for
    this model, exit and sampling mode (`tree_search.measure` on `prompts()`), cached in the
    workdir's `tree_plans.json`; returns the options (tree = its parents list) and the plan
    (None when the tree is not auto)."""
    spec = options.tree.strip()
    if spec != "auto" and not spec.startswith("auto:"):
        return options, None
    others = sorted(set(strategies) - set(AUTO_TREE_STRATEGIES))
    if others:
        raise ValueError(f"--tree {spec} shapes a tree from the acceptance of the shared head at "
                         f"exit E (strategy selfspec), not of {others}: give those a tree "
                         "(children per depth or a parents list)")
    nodes = None
    if spec != "auto":
        try:
            nodes = int(spec.removeprefix("auto:"))
        except ValueError:
            raise ValueError(f"tree {spec!r}: expected 'auto' or 'auto:N' (N nodes)") from None
        if nodes < 1:
            raise ValueError(f"tree {spec!r}: N must be >= 1")
    mode = ("greedy" if sampling is None else
            f"sampled T={float(sampling.temperature):g} top_k={int(sampling.top_k)} "
            f"top_p={float(sampling.top_p):g}")
    key = (f"{spec} step={step} exit_layer={options.exit_layer} "
           f"children={options.tree_children} {mode} platform={jax.default_backend()}")
    path = os.path.join(workdir, "tree_plans.json")
    plans = read_json_cache(path, lambda plans: [TreePlan.from_dict(p) for p in plans.values()])
    if key in plans:
        plan = TreePlan.from_dict(plans[key])
    else:
        measured = _measured(generator, options.exit_layer, mode, options.tree_children,
                             prompts, sampling)
        plan = measured.best_tree(nodes=nodes)
        plans[key] = plan.to_dict()
        write_json_cache(path, plans)
    return dataclasses.replace(options, tree=json.dumps(list(plan.tree.parents))), plan


def workdir_heldout_prompts(meta: dict, tokenizer: Tokenizer, count: int,
                            length: int) -> list[list[int]] | None:
    """`count` held-out windows of `length` tokens (`data.heldout_prompts`) from the training
    data a workdir's checkpoint names; None when it names none (an import)."""
    data = run_data(meta)
    return heldout_prompts(data, tokenizer, count, length) if data else None


def auto_tree_prompts(meta: dict, tokenizer: Tokenizer, fallback: list[list[int]],
                      count: int = 8, length: int = 128) -> list[list[int]]:
    """Prompts to shape an auto tree on: the workdir's held-out windows, else `fallback` (e.g.
    the prompts being decoded) when it names no data or too little of it."""
    try:
        return workdir_heldout_prompts(meta, tokenizer, count, length) or fallback
    except ValueError:
        return fallback


_MEASURED: dict[tuple, Measurements] = {}


def _measured(generator: Generator, exit_layer: int, mode: str, children: str,
              prompts: Callable[[], Sequence[Sequence[int]]],
              sampling: SamplingParams | None) -> Measurements:
    """`tree_search.measure`, once per process for a model, exit, sampling mode (`mode` names
    `sampling`) and way of drawing children, whatever node counts are asked of it."""
    key = (generator, exit_layer, mode, children)
    if key not in _MEASURED:
        print(f"--tree auto: measuring acceptance and verify costs (exit_layer={exit_layer}, "
              f"{mode}, children={children}) ...", flush=True)
        _MEASURED[key] = measure(generator, exit_layer, prompts(), sampling=sampling,
                                 children=children)
    return _MEASURED[key]


def describe_plan(spec: str, plan: TreePlan) -> str:
    """One line on a `--tree auto` choice, with the parents list that reproduces it."""
    return (f"--tree {spec}: {plan.tree.label()} ({plan.tree.num_nodes} nodes, depth "
            f"{plan.tree.depth}), expected tau {plan.expected_tau:.2f}, expected speed-up "
            f"{plan.expected_speedup:.2f}x; as --tree: {json.dumps(list(plan.tree.parents))}")
