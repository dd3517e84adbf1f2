"""The API's keyword options: one name per option across the API and the command lines, a
"did you mean" for an unknown one, and Hugging Face `generate`'s names, each mapped where it
means the same as ours or refused in one line that names ours."""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Collection, Iterable
from typing import Any

RENAMED = {"num_drafts": "num_draft"}  # old spelling -> the one name now

# Hugging Face generate's names that mean the same as ours: taken (`from_hf`).
HF_SAME = ("max_length", "do_sample", "num_assistant_tokens")
# The rest of its names people pass, refused with what to use here.
HF_REFUSED = {
    "stop_strings": "stop=",
    "output_scores": "logprobs=True",
    "output_logits": "logprobs=True",
    "return_dict_in_generate": "logprobs=True (a Completion holds tokens, text and logprobs)",
    "input_ids": "prompts= (a list of token ids is one prompt)",
    "attention_mask": "prompts of any lengths (no mask is needed)",
    "eos_token_id": "stop= strings (the tokenizer's EOS ids always end a row)",
    "pad_token_id": "nothing: prompts are padded internally",
    "streamer": "stream()",
    "assistant_model": "strategy='draft' (load(..., draft_workdir=...))",
    "prompt_lookup_num_tokens": "strategy='ngram'",
    "generation_config": "keyword options (max_new_tokens=, temperature=, ...)",
    "num_beams": "nothing: one sampled or greedy sequence per prompt",
    "num_return_sequences": "the prompt repeated in the list of prompts",
    "repetition_penalty": "nothing: it would change the model's distribution",
    "min_new_tokens": "nothing: rows end at their EOS",
}


def checked(*extra: Iterable[str]) -> Callable[[Callable], Callable]:
    """A decorator: a keyword the function takes neither by name nor in `extra` (names its
    **options take) is a one-line error: a renamed option names its new name, anything else
    the closest known name (difflib), if one is close."""

    def decorate(function: Callable) -> Callable:
        known = {name for name, p in inspect.signature(function).parameters.items()
                 if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        known |= {name for names in extra for name in names}

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for name in kwargs:
                if name not in known:
                    raise ValueError(unknown(name, known, function.__name__))
            return function(*args, **kwargs)
        return wrapper
    return decorate


def unknown(name: str, known: Collection[str], where: str) -> str:
    """The one-line error for option `name` that `where` does not take."""
    if name in RENAMED:
        return f"{name} is now {RENAMED[name]} (one name across the API and command lines)"
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return (f"unknown option {name!r} for {where}"
            + (f"; did you mean {close[0]!r}?" if close else ""))


def from_hf(options: dict[str, Any], temperature: float | None, max_new_tokens: int | None,
            longest_prompt: int) -> tuple[float, int]:
    """Takes Hugging Face's names out of `options` (in place): `num_assistant_tokens` becomes
    num_draft, `max_length` (prompt + new tokens, the longest prompt's) max_new_tokens,
    `do_sample` False greedy and True sampling (temperature default 1.0); any other HF name is
    refused naming ours. Returns (temperature, max_new_tokens), defaults 0 and 128."""
    strategy_names(options)
    max_length = options.pop("max_length", None)
    if max_length is not None:
        if max_new_tokens is not None:
            raise ValueError("give max_new_tokens or max_length, not both")
        if not isinstance(max_length, int) or max_length <= longest_prompt:
            raise ValueError(f"max_length={max_length!r} (prompt + new tokens) must exceed the "
                             f"longest prompt's {longest_prompt} tokens")
        max_new_tokens = max_length - longest_prompt
    return _temperature(options.pop("do_sample", None), temperature), (
        128 if max_new_tokens is None else max_new_tokens)


def strategy_names(options: dict[str, Any]) -> None:
    """Takes Hugging Face's drafting name out of a strategy's `options` (in place):
    `num_assistant_tokens` becomes num_draft; its other names are refused naming ours."""
    for name, ours in HF_REFUSED.items():
        if name in options:
            raise ValueError(f"{name} is Hugging Face's; here use {ours}")
    if "num_assistant_tokens" in options:
        if "num_draft" in options:
            raise ValueError("give num_draft or num_assistant_tokens, not both")
        options["num_draft"] = options.pop("num_assistant_tokens")


def _temperature(do_sample: Any, temperature: float | None) -> float:
    """The temperature `do_sample` and `temperature` mean together."""
    if do_sample is None:
        return 0.0 if temperature is None else temperature
    if not isinstance(do_sample, bool):
        raise ValueError(f"do_sample={do_sample!r} must be True or False")
    if not do_sample:
        if temperature:
            raise ValueError(f"do_sample=False is greedy decoding: leave temperature="
                             f"{temperature} out")
        return 0.0
    if temperature is not None and not temperature > 0:
        raise ValueError(f"do_sample=True samples: temperature={temperature} must be > 0 "
                         "(default 1.0)")
    return 1.0 if temperature is None else temperature
