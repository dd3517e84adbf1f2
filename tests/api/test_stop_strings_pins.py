"""Stop strings pinned where the fresh audit's plants got past tests/api/
test_generate_conveniences.py: the automaton's step (`stop_strings.advance`) on rows that keep
nothing, against a plain-Python search of the text kept; and the tokenizer's size against the
model's at its limit (issue 52's scan)."""

import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decoding.stop_strings import StopStrings, advance
from specjax.tokenizer import ByteTokenizer

STOP = "ab"


def _ids(text: str) -> list[int]:
    return list(text.encode())


def test_a_row_that_keeps_nothing_keeps_its_stop_state():
    """Row 0 keeps each round's one token; row 1 keeps nothing in the middle round (done, or
    at its budget: count 0) and its next round's "b" follows the "a" of the round before. By
    a plain search of the text each row kept: row 0 kept "a", "x", "b" (no stop), row 1 "a",
    "b" ("ab": stopped). Catches the state after a round taken from the tokens the row did not
    keep (row 1's state moved past its "a" by the uncommitted "x": its stop string missed, and
    another's matched over text that was never output)."""
    tokenizer = ByteTokenizer()
    stops = StopStrings(STOP, tokenizer.token_bytes())
    table = stops.table([_ids("q"), _ids("q")], tokenizer.vocab_size, stops.num_states)
    state, kept_text = table.state, ["", ""]
    ended = np.zeros(2, bool)
    for letters, counts in ((("a", "a"), (1, 1)), (("x", "x"), (1, 0)), (("b", "b"), (1, 1))):
        tokens = jnp.asarray([_ids(letter) for letter in letters], jnp.int32)
        count, hit, state = advance(table, state, tokens, jnp.asarray(counts, jnp.int32))
        np.testing.assert_array_equal(np.asarray(count), counts)
        kept_text = [text + letters[row][:counts[row]] for row, text in enumerate(kept_text)]
        ended = np.asarray(hit)
    assert kept_text == ["axb", "ab"]
    assert ended.tolist() == [STOP in text for text in kept_text] == [False, True]


def test_a_tokenizer_larger_than_the_model_is_refused_at_its_limit():
    """Stop strings over a 259-id tokenizer fit a model of 259 ids (or more: ids past the
    tokenizer's match nothing) and are refused for one of 258. Catches the check dropped (a
    numpy broadcast error while building the moves) or taken as `>=` (the usual equal sizes
    refused)."""
    stops = StopStrings(STOP, ByteTokenizer().token_bytes())
    assert stops.table([[1]], 259, 8).moves.shape == (8, 259)
    assert stops.table([[1]], 300, 8).moves.shape == (8, 300)
    with pytest.raises(ValueError, match="^the tokenizer has 259 ids, the model 258$"):
        stops.table([[1]], 258, 8)
