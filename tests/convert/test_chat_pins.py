"""Chat conversations (`specjax.chat`) pinned where the fresh audit's plant got past the
tokenizer-convention and prompt tests: an empty conversation."""

import pytest

from specjax.chat import check_messages


@pytest.mark.parametrize("messages", [[], ()], ids=["list", "tuple"])
def test_an_empty_conversation_is_a_one_line_error(messages):
    """A conversation holds at least one message. Catches the emptiness check dropped: []
    passes, and the chat template renders only its generation prompt, so the model answers
    a question nobody asked."""
    with pytest.raises(ValueError, match=r"^a conversation is a non-empty list of "
                                         r"\{'role': \.\.\., 'content': \.\.\.\} messages, not "):
        check_messages(messages)
    assert check_messages([{"role": "user", "content": "hi"}]) == [
        {"role": "user", "content": "hi"}]
