"""Streaming: each round's tokens reach the host as the loop commits them, joined they are
`generate`'s, and the default program carries no host callback."""

import re

import jax
import pytest

from specjax.config import ModelConfig
from specjax.decoding.drafters.layerskip import SelfSpeculative
from specjax.decoding.engine import Generator
from specjax.decoding.loop import generate_tokens
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.static_tree import StaticTree
from tests.support.models import TINY_MODEL, damped_params

CFG = ModelConfig(**{**TINY_MODEL, "init_std": 0.3})
PARAMS = damped_params(CFG, jax.random.PRNGKey(0), 0.5)
PROMPTS = [[1, 2, 3, 4, 5], [7], list(range(40, 52))]
NEW = 17


@pytest.fixture(scope="module")
def generator():
    return Generator(PARAMS, CFG)


@pytest.mark.parametrize("strategy", [SelfSpeculative(1, Chain(3)),
                                      SelfSpeculative(1, StaticTree.from_branching((2, 1)))],
                         ids=["chain", "tree"])
def test_streamed_rounds_join_into_generate_s_tokens(generator, strategy):
    """Catches a stream that drops, repeats or reorders a round (an unordered callback, a
    count taken before the EOS and budget cut), and one that sends rows that are done."""
    expected = generator.generate(PROMPTS, max_new_tokens=NEW, strategy=strategy,
                                  eos_id=9)
    rounds = list(generator.stream(PROMPTS, max_new_tokens=NEW, strategy=strategy, eos_id=9))
    joined = [[t for r in rounds for t in r[row]] for row in range(len(PROMPTS))]
    assert joined == expected.tokens
    assert all(len(r[row]) == 1 for r in rounds[:1] for row in range(len(PROMPTS)))
    for row, stats in enumerate(expected.stats):  # one piece per round a row took part in
        assert sum(1 for r in rounds[1:] if r[row]) == stats.rounds


def test_a_failing_stream_raises_in_the_caller(generator):
    """Catches an error inside the decoding thread swallowed (the stream would just end)."""
    with pytest.raises(ValueError, match="max_new_tokens"):
        list(generator.stream(PROMPTS, max_new_tokens=0))


def test_only_the_streaming_program_calls_the_host(generator):
    """Catches the per-round host callback compiled into the default program, which would give
    every generate call and benchmark a host round-trip per round."""
    args, static = generator._inputs(PROMPTS, NEW, SelfSpeculative(1, Chain(3)), None, 0,
                                     None, None)
    plain = generate_tokens.lower(*args, **static).as_text()
    streaming = generate_tokens.lower(*args, **static, stream=True).as_text()
    assert "callback" not in plain and "callback" in streaming


def test_the_streaming_program_s_callbacks_are_ordered(generator):
    """Every host callback of the streaming program (the first round's and the loop's) takes
    and returns the token that orders it after the one before, and the program threads that
    token in and out: rounds reach the host in the order the loop commits them, whatever the
    runtime schedules. Catches an unordered callback (`ordered=False`), which has no token
    and may deliver rounds out of order."""
    args, static = generator._inputs(PROMPTS, NEW, SelfSpeculative(1, Chain(3)), None, 0,
                                     None, None)
    lines = generate_tokens.lower(*args, **static, stream=True).as_text().splitlines()
    calls = [line for line in lines if re.search(r"custom_call @\w*callback", line)]
    assert len(calls) == 2  # the prefill's round and the loop's
    for call in calls:
        assert re.search(r": \(!stablehlo\.token, [^)]*\) -> !stablehlo\.token$", call), call
    main = next(line for line in lines if "func.func public @main(" in line)
    assert "(%arg0: !stablehlo.token {jax.token = true}," in main
    assert "-> (!stablehlo.token {jax.token = true}," in main


def test_a_character_split_across_rounds_is_shown_whole():
    """Catches a stream that shows the first byte of a character as a replacement character
    and then never takes it back."""
    from specjax.api import text_pieces
    from specjax.tokenizer import get_tokenizer

    e_acute = list("é".encode())  # two byte tokens
    pieces = list(text_pieces(get_tokenizer("bytes"), [[97], e_acute[:1], [*e_acute[1:], 98]]))
    assert pieces == ["a", "éb"]


def test_a_trailing_partial_character_is_not_lost():
    """Catches a stream that drops the text of its last round when that round ends inside a
    character (a row cut by max_new_tokens mid-character): the joined pieces must equal the
    whole decoded text, replacement character included, as `generate` returns it."""
    from specjax.api import text_pieces
    from specjax.tokenizer import get_tokenizer

    tokenizer = get_tokenizer("bytes")
    rounds = [[97], [98, list("é".encode())[0]]]
    pieces = list(text_pieces(tokenizer, rounds))
    assert "".join(pieces) == tokenizer.decode([97, 98, rounds[1][1]]) == "ab\ufffd"
