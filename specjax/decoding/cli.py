"""Shared pieces of the inference entry points: strategies from flags, prompt files, defaults."""

from __future__ import annotations

import json
from typing import Any

from specjax.config import DecodingConfig, dataclass_from_mapping
from specjax.decoding.autoregressive import Autoregressive
from specjax.decoding.layerskip import SelfSpeculative
from specjax.decoding.strategy import Strategy

STRATEGIES = ("ar", "selfspec")


def decoding_defaults(meta: dict[str, Any]) -> DecodingConfig:
    """The checkpoint's `decoding` config section (DecodingConfig defaults where absent)."""
    section = meta.get("config", {}).get("decoding") or {}
    return dataclass_from_mapping(DecodingConfig, section, "decoding")


def make_strategy(name: str, exit_layer: int, num_draft: int,
                  draft_threshold: float = 0.0) -> Strategy:
    if name == "ar":
        return Autoregressive()
    if name == "selfspec":
        return SelfSpeculative(exit_layer=exit_layer, num_draft=num_draft,
                               draft_threshold=draft_threshold)
    raise ValueError(f"unknown strategy {name!r}; choose from {list(STRATEGIES)}")


def strategy_label(strategy: Strategy) -> str:
    """A short name for reports: "ar", "selfspec E=1 K=6", "selfspec E=1 K=12 eta=0.4"."""
    if not isinstance(strategy, SelfSpeculative):
        return "ar"
    label = f"selfspec E={strategy.exit_layer} K={strategy.num_draft}"
    return label + (f" eta={strategy.draft_threshold:g}" if strategy.draft_threshold else "")


def read_prompts_file(path: str) -> list[str]:
    """One JSON object per line with a "prompt" field."""
    prompts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error})") from error
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                raise ValueError(f"{path}:{number}: expected an object with a string 'prompt'")
            prompts.append(record["prompt"])
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
