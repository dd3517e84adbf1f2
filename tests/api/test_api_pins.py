"""The API's refusals of bad arguments pinned by their messages (issue 52's scan: raise sites no
test triggered). Each is reached through the call a user makes on a loaded model with tiny
random weights (an import-like workdir: no training data), before anything compiles."""

import pytest

import specjax
from specjax.decoding.engine import AUTOREGRESSIVE


@pytest.fixture(scope="module")
def model(base_workdir) -> specjax.LanguageModel:
    return specjax.load(base_workdir)


def _consumed(iterator) -> None:
    """Runs a generator function's body to its first yield (`stream` checks lazily)."""
    next(iter(iterator))


REFUSALS = {  # id: (call on the model, the message's distinctive fragment)
    "options beside a Drafter": (
        lambda m: m.generate([1, 2], strategy=AUTOREGRESSIVE, num_draft=3),
        r"^options \['num_draft'\] apply to a strategy name, not to a Drafter"),
    "plan_tree of a static tree": (
        lambda m: m.plan_tree("2,2"), r"^tree='2,2': plan_tree takes 'auto' or 'auto:N'$"),
    "stream of a number": (
        lambda m: _consumed(m.stream(3.5)),
        r"^stream takes one prompt \(a string or token ids\), not float$"),
    "stream of a list": (
        lambda m: _consumed(m.stream(["a", "b"])),
        r"^stream takes one prompt \(a string or token ids\), not list$"),
    "benchmark with prompts and a set": (
        lambda m: m.benchmark({"K=2": {"num_draft": 2}}, ["a"], prompt_set="chat"),
        "^give prompts or a prompt_set, not both$"),
    "benchmark of an import's held-out prompts": (
        lambda m: m.benchmark({"K=2": {"num_draft": 2}}),
        "names no training data to take held-out prompts from: pass prompts$"),
    "tune num_draft an int": (
        lambda m: m.tune(["a"], num_draft=3),
        r"^num_draft=3 must be a non-empty list of counts$"),
    "tune num_draft empty": (
        lambda m: m.tune(["a"], num_draft=[]),
        r"^num_draft=\[\] must be a non-empty list of counts$"),
    "tune strategies a string": (
        lambda m: m.tune(["a"], strategies="ngram"),
        r"^strategies must be a non-empty list of names from \[.*\], not 'ngram'$"),
    "tune strategies empty": (
        lambda m: m.tune(["a"], strategies=[]),
        r"^strategies must be a non-empty list of names from \[.*\], not \[\]$"),
    "generate of neither": (
        lambda m: m.generate(), r"^give prompts or messages \(a conversation, or a list of "
                                r"them\), not both and not neither$"),
    "generate of both": (
        lambda m: m.generate("a", messages=[{"role": "user", "content": "b"}]),
        "not both and not neither$"),
    "generate of no conversations": (
        lambda m: m.generate(messages=[]), "^messages is an empty list$"),
    "generate of an empty list": (
        lambda m: m.generate([]), "^prompts must be a string, a list of token ids or a "
                                  "non-empty list of them, not list$"),
    "generate of a dict": (
        lambda m: m.generate({"a": 1}), "^prompts must be .* not dict$"),
    "generate of a list holding a float": (
        lambda m: m.generate(["a", 2.5]), "^prompts must be .* not list holding a float$"),
    "max_new_tokens beside max_length": (
        lambda m: m.generate([1, 2], max_new_tokens=4, max_length=9),
        "^give max_new_tokens or max_length, not both$"),
    "stop an empty list": (
        lambda m: m.generate([1, 2], max_new_tokens=2, stop=[]),
        "^stop is an empty list: give stop strings or None$"),
}


@pytest.mark.parametrize("call, message", REFUSALS.values(), ids=REFUSALS.keys())
def test_the_api_refuses_bad_arguments_in_one_line(model, call, message):
    """Each bad argument is a ValueError whose message names it. Catches any of these checks
    dropped or loosened: options silently ignored beside a Drafter, plan_tree returning None
    for a static tree, stream taking a list (one row decoded, the rest dropped) or a number (a
    raw TypeError), benchmark's prompts and prompt_set both taken (one silently ignored) or an
    import's missing held-out data reaching a raw error, tune's num_draft=3 or strategies="x"
    iterated character by character, no prompts or both prompts and messages taken, an empty or
    mixed prompt list reaching the engine, max_new_tokens and max_length both given (one
    ignored) and stop=[] taken as no stop."""
    with pytest.raises(ValueError, match=message):
        call(model)


TEMPLATED = {  # id: (chat template, call, the message's distinctive fragment)
    "stream of two conversations": (
        "{% for m in messages %}{{ m.content }}{% endfor %}",
        lambda m: _consumed(m.stream(messages=[[{"role": "user", "content": "a"}]] * 2)),
        "^stream takes one prompt or conversation, not a list of them$"),
    "a template raising": (
        "{{ raise_exception('roles must alternate') }}",
        lambda m: m.generate(messages=[{"role": "user", "content": "a"}]),
        "^the chat template refused the conversation: roles must alternate$"),
    "a template not jinja": (
        "{% for m in messages %}",
        lambda m: m.generate(messages=[{"role": "user", "content": "a"}]),
        r"^the chat template is not valid jinja \(.*\)$"),
}


@pytest.mark.parametrize("template, call, message", TEMPLATED.values(), ids=TEMPLATED.keys())
def test_conversations_refused_in_one_line(model, monkeypatch, template, call, message):
    """With a chat template: stream of two conversations, a template's raise_exception and a
    template that does not parse are each a ValueError naming the cause. Catches stream
    decoding the first conversation and dropping the rest, and a template's own error (the
    model's rule that roles alternate) or jinja's syntax error escaping as a raw traceback."""
    monkeypatch.setattr(model.tokenizer, "chat_template", template)
    with pytest.raises(ValueError, match=message):
        call(model)


@pytest.mark.parametrize("args", [dict(workdir="w"), dict(hf_dir="h"),
                                  dict(hf_dir="h", gguf="g", workdir="w")])
def test_import_hf_takes_one_source_and_a_workdir(args):
    """import_hf needs exactly one of hf_dir and gguf, and a workdir. Catches the check
    dropped: a missing source or workdir reaching a raw error inside the conversion, or a gguf
    given beside hf_dir silently ignored."""
    with pytest.raises(ValueError, match="^import_hf takes a Hugging Face folder or Hub id, or "
                                         "gguf=FILE, and a workdir$"):
        specjax.import_hf(**args)
