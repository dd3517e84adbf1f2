"""Hugging Face's keyword names pinned where the fresh audit's plants got past
tests/test_generate_conveniences.py: `max_length` at its boundary, `do_sample` beside a zero
temperature and of another type, by hand."""

import pytest

from specjax.keywords import from_hf


def test_max_length_must_leave_room_for_one_new_token():
    """`max_length` counts the prompt and the new tokens (transformers' meaning): one more
    than the longest prompt (7 tokens) is one new token, equal to it is refused naming
    max_length. Catches the boundary taken as `<` (max_length=7 passed on as
    max_new_tokens=0, refused later under a name the caller never used) and the budget
    counted from the wrong end (max_length - prompt - 1)."""
    assert from_hf({"max_length": 8}, None, None, 7) == (0.0, 1)
    assert from_hf({"max_length": 40}, None, None, 7) == (0.0, 33)
    with pytest.raises(ValueError, match=r"^max_length=7 \(prompt \+ new tokens\) must exceed "
                                         r"the longest prompt's 7 tokens$"):
        from_hf({"max_length": 7}, None, None, 7)


def test_num_assistant_tokens_is_num_draft_and_never_both():
    """transformers' `num_assistant_tokens` is our `num_draft` (moved, by hand); given with
    num_draft it is refused in one line. Catches the pair taken silently, the HF name
    overriding the num_draft the caller also gave."""
    options = {"num_assistant_tokens": 3}
    assert from_hf(options, None, 8, 4) == (0.0, 8) and options == {"num_draft": 3}
    with pytest.raises(ValueError, match="^give num_draft or num_assistant_tokens, not both$"):
        from_hf({"num_assistant_tokens": 3, "num_draft": 4}, None, 8, 4)


@pytest.mark.parametrize("temperature", [None, 0.0, 0])
def test_do_sample_false_with_a_zero_temperature_is_greedy(temperature):
    """`do_sample=False` with no temperature or a temperature of 0 (greedy said twice, as
    code ported from transformers often does) is greedy decoding; only a positive temperature
    contradicts it. Catches any temperature given refused (`temperature=0.0` beside
    `do_sample=False` an error)."""
    assert from_hf({"do_sample": False}, temperature, None, 3) == (0.0, 128)
    with pytest.raises(ValueError, match="^do_sample=False is greedy decoding: leave "
                                         "temperature=0.7 out$"):
        from_hf({"do_sample": False}, 0.7, None, 3)


@pytest.mark.parametrize("value", ["no", "False", 1, 0])
def test_do_sample_must_be_a_bool(value):
    """`do_sample` is True or False; anything else ("no", "False", 1, 0) is a one-line error
    naming it. Catches the type check dropped: do_sample="no" or "False" (a string from a
    config file or a command line) is truthy and silently samples at temperature 1.0, where
    the caller asked for greedy decoding."""
    with pytest.raises(ValueError, match=f"^do_sample={value!r} must be True or False$"):
        from_hf({"do_sample": value}, None, None, 3)
