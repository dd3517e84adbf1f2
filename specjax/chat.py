"""Chat prompts: a conversation rendered with the model's chat template, as transformers'
`apply_chat_template(messages, add_generation_prompt=True)` renders it (jinja2 in a sandbox,
blocks trimmed, `raise_exception`, `strftime_now` and a `tojson` that keeps non-ASCII text),
then encoded without the tokenizer's own specials (the template writes any BOS itself)."""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specjax.tokenizer import Tokenizer

Message = Mapping[str, Any]


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """`messages` as a list of {"role": str, "content": str, ...} dicts; a one-line error
    naming the first that is not."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("a conversation is a non-empty list of {'role': ..., 'content': ...} "
                         f"messages, not {type(messages).__name__}")
    for number, message in enumerate(messages):
        if not isinstance(message, Mapping) or not all(
                isinstance(message.get(key), str) for key in ("role", "content")):
            raise ValueError(f"message {number} of the conversation is not a dict with string "
                             f"'role' and 'content': {message!r:.80}")
    return [dict(message) for message in messages]


def render_chat(tokenizer: Tokenizer, messages: Sequence[Message], *,
                add_generation_prompt: bool = True) -> str:
    """The conversation as the model's chat template writes it, ready for the assistant's
    reply (`add_generation_prompt`)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("this model has no chat template (none in its tokenizer_config.json, "
                         "chat_template.jinja or GGUF file): give plain prompts")
    token = getattr(tokenizer, "token", lambda _: None)
    try:
        return _compiled(template).render(
            messages=check_messages(messages), add_generation_prompt=add_generation_prompt,
            bos_token=token(tokenizer.bos_id) or "", eos_token=token(tokenizer.eos_id) or "")
    except _TemplateError as error:
        raise ValueError(f"the chat template refused the conversation: {error}") from None


def encode_chat(tokenizer: Tokenizer, messages: Sequence[Message]) -> np.ndarray:
    """The rendered conversation's ids (the template's own special tokens only)."""
    return tokenizer.encode(render_chat(tokenizer, messages))


class _TemplateError(Exception):
    """`raise_exception` in a template."""


def _raise(message: str) -> None:
    raise _TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators,
                      sort_keys=sort_keys)


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    from jinja2.exceptions import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise
    environment.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return environment.from_string(template)
    except TemplateSyntaxError as error:
        raise ValueError(f"the chat template is not valid jinja ({error})") from None
