"""The notebook API (`specjax.api`) beyond what the README's example runs: streaming text and
benchmark rows."""


import pytest

import specjax
from specjax.api import load


@pytest.fixture(scope="module")
def workdir(trained_workdir) -> str:
    return trained_workdir


def test_the_api_streams_the_text_generate_returns(workdir):
    """Catches text pieces cut inside a multi-byte character (a replacement character shown,
    which the finished text does not hold) or lost at the end of the stream. The untrained
    model samples arbitrary bytes, broken characters included."""
    model = load(workdir)
    prompt = "é = 'ü'\n"
    pieces = list(model.stream(prompt, max_new_tokens=24, num_draft=3, temperature=1.0, seed=3))
    completion = model.generate(prompt, max_new_tokens=24, num_draft=3, temperature=1.0, seed=3)
    assert "".join(pieces) == completion.text
    for count in range(len(pieces)):  # nothing shown is taken back later
        assert completion.text.startswith("".join(pieces[:count]))
    assert len(pieces) > 2


def test_a_chat_stream_is_the_chat_generate_s_text(workdir):
    """`stream(prompt, chat=True)`, joined, is `generate(prompt, chat=True)`'s text: the
    prompt rendered as a user's message in the chat template (here one set on the byte
    tokenizer), which completes otherwise than the plain prompt. Catches `stream` ignoring
    `chat` (the plain prompt's completion streamed)."""
    model = load(workdir)
    model.tokenizer.chat_template = ("<|user|>{{ messages[-1]['content'] }}\n"
                                     "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    prompt, options = "def f(x):", dict(max_new_tokens=16, temperature=1.0, seed=5)
    chat = model.generate(prompt, chat=True, **options)
    assert chat.text == model.generate(messages=[{"role": "user", "content": prompt}],
                                       **options).text
    assert chat.text != model.generate(prompt, **options).text
    assert "".join(model.stream(prompt, chat=True, **options)) == chat.text


def test_bench_returns_a_row_per_setting_with_ar_first(workdir):
    """Catches rows in another order than the settings (ar, the baseline, first) or a
    speed-up not relative to ar."""
    rows = specjax.bench(workdir, {"K=2": dict(num_draft=2)}, prompts=["def f(", "x = 1"],
                         max_new_tokens=8, repeats=1)
    assert [r["name"] for r in rows] == ["ar", "K=2"] and rows[0]["speedup"] == 1.0
    assert rows[1]["identical_to_ar"] and rows[1]["tau"] >= 1.0


def test_a_stream_ends_at_any_of_the_tokenizers_stop_ids(workdir):
    """With a second stop id (besides EOS) that the seeded sampled completion produces,
    `generate` and `stream` both end there: the tokens are the free completion cut after its
    first occurrence. Catches `stream` ending at the EOS only (`eos_id` passed, not `stop_ids`)."""
    model = load(workdir)
    prompt, options = "def f(x):", dict(strategy="ar", max_new_tokens=24, temperature=1.0, seed=3)
    free = model.generate(prompt, **options).tokens
    at = next(i for i in range(1, len(free) - 1) if free[i] not in free[:i])
    model.tokenizer.stop_ids = (model.tokenizer.eos_id, free[at])
    expected = model.generate(prompt, **options)
    assert expected.tokens == free[:at + 1]
    assert "".join(model.stream(prompt, **options)) == expected.text


def test_a_setting_labelled_ar_is_refused(workdir):
    """`benchmark` reserves the label "ar" for its baseline: a setting named "ar" is a
    one-line error before any timing. Catches the "label is taken" check removed (the
    setting silently replacing the baseline, its speed-up then relative to itself)."""
    model = load(workdir)
    with pytest.raises(ValueError, match=r"^setting 'ar': the label is taken \(ar is the "
                                         r"baseline\)$"):
        model.benchmark({"ar": dict(strategy="ngram")}, prompts=["def f("], max_new_tokens=2,
                        repeats=1)


def test_an_unknown_override_of_a_config_file_is_refused_before_training(tmp_path):
    """`train(config file, overrides={"train.totl_steps": ...})` is a one-line error naming
    the field as the override given, and nothing is trained. Catches an unknown leaf accepted
    into a config file's section by `train`'s override check (left to the trainer's section
    check, whose message names no override)."""
    workdir = tmp_path / "w"
    config = "tiny_code:smoke"
    with pytest.raises(ValueError, match=r"^override 'train\.totl_steps': no such config "
                                         r"field$"):
        specjax.train(config, str(workdir),
                      overrides={"train.total_steps": 1, "train.totl_steps": 5})
    assert not (workdir / "metrics.jsonl").exists()
