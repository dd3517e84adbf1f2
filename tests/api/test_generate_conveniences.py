"""generate's conveniences on a tiny random Llama with a byte-level BPE tokenizer, against
transformers on the same folder: stop strings cut where `generate(stop_strings=...)` cuts,
token-id prompts, per-token log-probabilities of the target, Hugging Face's names mapped or
refused, and a "did you mean" for an unknown option."""

import difflib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specjax  # noqa: E402
from specjax.cli.decoding import read_prompts_file  # noqa: E402
from specjax.decoding import stop_strings  # noqa: E402
from specjax.decoding.stop_strings import StopStrings, advance  # noqa: E402
from specjax.keywords import HF_REFUSED  # noqa: E402
from specjax.model import forward  # noqa: E402
from tests.convert.test_tokenizer_conventions import TEXTS, checkpoint, reference  # noqa: E402
from tests.support.scripts import run_script  # noqa: E402

pytestmark = pytest.mark.slow

PROMPT = TEXTS[1]
NEW = 40
FORWARD = jax.jit(forward, static_argnums=1)
NEVER = "\x00never"  # a stop string no completion holds: the stop program, nothing cut
# A chain, a tree and n-gram drafting: every family of proposal shapes and drafters.
STRATEGIES = {"selfspec": dict(strategy="selfspec", exit_layer=2, num_draft=3),
              "tree": dict(strategy="selfspec", exit_layer=2, tree="2,2,1"),
              "ngram": dict(strategy="ngram")}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(our model, transformers' tokenizer, transformers' model) of one tiny checkpoint."""
    root = tmp_path_factory.mktemp("conveniences")
    with open(difflib.__file__, encoding="utf-8") as f:  # ASCII text: every id decodes
        corpus = [f.read().encode("ascii", "ignore").decode()]
    folder = checkpoint(root / "hf", bos=False, seed=3, corpus=corpus)
    tokenizer, hf_model = reference(folder)
    last = hf_model.model.layers[-1]  # nearly silent: exit 2 drafts what the target says, so
    with torch.no_grad():  # rounds keep several tokens, and a stop can fall mid-round
        last.self_attn.o_proj.weight.mul_(1e-3)
        last.mlp.down_proj.weight.mul_(1e-3)
    hf_model.save_pretrained(folder)
    return specjax.import_hf(folder, str(root / "w")), tokenizer, hf_model, str(root / "w")


def hf_generate(hf_model, hf_tokenizer, stops, new=NEW):
    """transformers' greedy tokens after PROMPT, ended by `stops`."""
    ids = torch.tensor([hf_tokenizer(PROMPT)["input_ids"]])
    with torch.no_grad():
        out = hf_model.generate(ids, max_new_tokens=new, do_sample=False, stop_strings=stops,
                                tokenizer=hf_tokenizer)
    return out[0, ids.shape[1]:].tolist()


def hf_cut(hf_tokenizer, prompt_ids, tokens, stops):
    """The prefix of `tokens` transformers' StopStringCriteria keeps: up to and including the
    first token after which it fires."""
    criteria = transformers.StopStringCriteria(hf_tokenizer, stops)
    for n in range(1, len(tokens) + 1):
        if criteria(torch.tensor([list(prompt_ids) + tokens[:n]]), None)[0]:
            return tokens[:n]
    return tokens


def stop_at(model, tokens, start, length):
    """A stop string of `length` bytes of `tokens`' text at byte `start` or after that is
    UTF-8 (a random model emits many bytes that are not)."""
    data = b"".join(model.tokenizer.token_bytes()[t] for t in tokens)
    for i in range(start, len(data) - length + 1):
        try:
            return data[i:i + length].decode("utf-8")
        except UnicodeDecodeError:
            continue
    raise AssertionError("no UTF-8 stop string in the completion")


def spanning(model, tokens, ends):
    """A UTF-8 stop string whose last byte is token at + 1's first and whose first is in
    token at or before, for a round end `at` among `ends`."""
    pieces = [model.tokenizer.token_bytes()[t] for t in tokens]
    for at in ends:
        try:
            return ((pieces[at - 1] + pieces[at])[-2:] + pieces[at + 1][:1]).decode("utf-8")
        except UnicodeDecodeError:
            continue
    raise AssertionError("no UTF-8 stop string across rounds")


def round_ends(completion):
    """The index of each round's last token, the target's own (depth 0), in a completion."""
    return [i for i, depth in enumerate(completion.trace["depth"]) if depth == 0]


def test_the_stop_check_agrees_with_transformers_criteria(hf):
    """Catches the stop automaton disagreeing with transformers' StopStringCriteria on random
    token sequences cut into random rounds: context lost between rounds or after the prompt,
    a stop wholly inside the prompt counted, a match ending before the newest token counted
    again, a shorter stop inside a longer one missed (suffix links), a round's count
    misplaced. No model runs: the automaton's tables and `advance`, jitted once."""
    model, hf_tokenizer, _, _ = hf
    rng = np.random.default_rng(0)
    table = model.tokenizer.token_bytes()
    step = jax.jit(advance)
    for _ in range(60):
        prompt = rng.integers(4, 300, rng.integers(1, 4)).tolist()
        tokens = rng.integers(4, 300, 24).tolist()
        text = b"".join(table[t] for t in prompt + tokens).decode("utf-8")
        starts = rng.integers(0, len(text) - 8, 2)
        stops = [text[i:i + n] for i, n in zip(starts, rng.integers(1, 9, 2), strict=True)]
        stops.append(stops[0][1:] or stops[1])  # one inside another
        automaton = StopStrings(stops, table)
        loop = automaton.table([prompt], 300, 64)
        state, kept, at = loop.state, [], 0
        while at < len(tokens):
            piece = tokens[at:at + 4]
            count, ended, state = step(loop, state, jnp.asarray([piece + [0] * (4 - len(piece))]),
                                       jnp.asarray([int(rng.integers(1, len(piece) + 1))]))
            kept += piece[:int(count[0])]
            at += int(count[0])
            if ended[0]:
                break
        assert kept == hf_cut(hf_tokenizer, prompt, tokens, stops), stops


def test_greedy_stop_strings_cut_where_transformers_cuts(hf):
    """Catches a stop checked only at a round's end (a stop completed mid-round would keep
    the round's later tokens), one spanning two rounds missed (a check over each round's
    tokens alone), a stop inside the prompt ending the row at once (the prompt's text
    searched), and overlapping stops cut at the later one: each against transformers'
    `generate(stop_strings=...)`, for a chain, a tree and n-gram drafting."""
    model, hf_tokenizer, hf_model, _ = hf
    decode = model.tokenizer.decode
    free = hf_generate(hf_model, hf_tokenizer, [NEVER])
    assert len(free) == NEW
    for name, options in STRATEGIES.items():
        drafted = model.generate(PROMPT, max_new_tokens=NEW, stop=NEVER, **options)
        assert drafted.tokens == free
        assert name == "ngram" or min(drafted.accepted_runs[:-1]) >= 2  # stops mid-round
        ends = [i for i in round_ends(drafted) if NEW // 4 <= i < NEW - 3]
        across = spanning(model, free, ends)
        overlapping = stop_at(model, free, NEW // 3, 5)
        first = (PROMPT[-2:].encode() + model.tokenizer.token_bytes()[free[0]][:1]).decode()
        cases = {"spanning two rounds": [across],
                 "from the prompt into the first token": [first],
                 "inside the prompt": [PROMPT[-3:], NEVER],  # in the bytes kept to match
                 "overlapping": [overlapping[:4], overlapping[2:]],
                 "several, the first found later": [stop_at(model, free, NEW - 6, 3),
                                                    overlapping[:3]]}
        for case, stops in cases.items():
            expected = hf_generate(hf_model, hf_tokenizer, stops)
            assert len(expected) < NEW or case == "inside the prompt", (name, case)
            got = model.generate(PROMPT, max_new_tokens=NEW, stop=stops, **options)
            assert got.tokens == expected, (name, case, stops)
            assert len(got.trace["depth"]) == len(got.tokens)
        streamed = "".join(model.stream(PROMPT, max_new_tokens=NEW, stop=[across], **options))
        assert streamed == decode(hf_generate(hf_model, hf_tokenizer, [across])), name


def test_a_set_of_stop_strings_is_built_once_per_model(hf, monkeypatch):
    """Catches the stop automaton rebuilt at every call (SmolLM2: 0.6 s of host work before
    each decode) and a cache keyed wrongly: a second set of stops served the first's automaton
    (its row not cut where transformers cuts it)."""
    model, hf_tokenizer, hf_model, _ = hf
    folds, fold = [], stop_strings._fold
    monkeypatch.setattr(stop_strings, "_fold", lambda *args: folds.append(1) or fold(*args))
    free = model.generate(PROMPT, max_new_tokens=NEW, stop=[NEVER, "\x01once"]).tokens
    assert model.generate(PROMPT, max_new_tokens=NEW, stop=(NEVER, "\x01once")).tokens == free
    assert len(folds) == 1
    stops = [stop_at(model, free, NEW // 2, 4), "\x01once"]
    got = model.generate(PROMPT, max_new_tokens=NEW, stop=stops).tokens
    assert len(folds) == 2 and got == hf_generate(hf_model, hf_tokenizer, stops) != free


def test_sampled_stop_strings_cut_the_same_draws_and_logprobs(hf):
    """Catches a sampled row whose stop changes its draws or cuts elsewhere than transformers'
    StopStringCriteria on the same tokens (a stop string is a cut, not another distribution),
    and sampled log-probabilities that are not the target's at temperature 0.8 (the raw
    log-softmax, or the drafter's), for a chain, a tree and n-gram drafting, two rows in one
    batch."""
    model, hf_tokenizer, _, _ = hf
    prompts = [PROMPT, TEXTS[0]]
    ids = [hf_tokenizer(p)["input_ids"] for p in prompts]
    for name, options in STRATEGIES.items():
        free = model.generate(prompts, max_new_tokens=NEW, temperature=0.8, seed=5,
                              logprobs=True, stop=NEVER, **options)  # the program with stops
        if name == "selfspec":  # draws as without stop strings (one more compile, not three)
            plain = model.generate(prompts, max_new_tokens=NEW, temperature=0.8, seed=5,
                                   **options)
            assert [c.tokens for c in plain] == [c.tokens for c in free]
        stops = [stop_at(model, free[0].tokens, NEW // 2, 3), stop_at(model, free[1].tokens, 5, 2)]
        got = model.generate(prompts, max_new_tokens=NEW, temperature=0.8, seed=5, stop=stops,
                             logprobs=True, **options)
        for row, completion in enumerate(got):
            expected = hf_cut(hf_tokenizer, ids[row], free[row].tokens, stops)
            assert completion.tokens == expected, (name, row)
            assert len(expected) < NEW, (name, row)
            assert completion.logprobs == free[row].logprobs[:len(expected)]
            np.testing.assert_allclose(free[row].logprobs,
                                       independent(model, ids[row], free[row].tokens, 0.8),
                                       atol=2e-5, err_msg=name)


def independent(model, prompt, tokens, temperature=1.0):
    """Each token's log-probability from the model's forward over prompt + tokens (no cache,
    no drafting): log_softmax(logits / temperature)."""
    tokens = list(tokens)
    seen = list(prompt) + tokens[:-1]
    padded = np.zeros((1, 96), np.int32)  # one shape for every call: causal, padding after
    padded[0, :len(seen)] = seen
    logits = FORWARD(model._loaded.params, model.config, padded)[0, len(prompt) - 1:len(seen)]
    logp = jax.nn.log_softmax(logits.astype(np.float32) / temperature, axis=-1)
    return np.take_along_axis(np.asarray(logp), np.asarray(tokens)[:, None], 1)[:, 0]


def test_logprobs_are_the_targets_whatever_the_strategy(hf):
    """Catches a log-probability read at the wrong position of a round (off by one along a
    tree's accepted path, the drafter's distribution instead of the target's, the pending
    token's): each strategy's equals ar's and an independent log-softmax of the model's
    forward over prompt + completion (sampled: `test_sampled_stop_strings_...`)."""
    model, *_ = hf
    prompt = model.tokenizer.encode(PROMPT).tolist()
    ar = model.generate(PROMPT, strategy="ar", max_new_tokens=NEW, logprobs=True)
    np.testing.assert_allclose(ar.logprobs, independent(model, prompt, ar.tokens), atol=2e-5)
    for name, options in STRATEGIES.items():
        got = model.generate(PROMPT, max_new_tokens=NEW, logprobs=True, **options)
        assert got.tokens == ar.tokens, name
        np.testing.assert_allclose(got.logprobs, ar.logprobs, atol=2e-5, err_msg=name)


def test_token_id_prompts_generate_as_their_text(hf):
    """Catches token-id prompts encoded again (as text of their digits), given a BOS, or
    mistaken for a batch of one-token prompts: ids give the text prompt's completion, alone
    and in a batch beside a text prompt, and the completion's prompt is their text."""
    model, *_ = hf
    ids = model.tokenizer.encode(PROMPT, add_special_tokens=True).tolist()
    text = model.generate(PROMPT, max_new_tokens=12)
    alone = model.generate(ids, max_new_tokens=12)
    assert alone.tokens == text.tokens and alone.prompt == PROMPT
    assert alone.logprobs is None  # not asked for
    batch = model.generate([np.asarray(ids), TEXTS[0]], max_new_tokens=12)
    assert batch[0].tokens == text.tokens
    assert batch[1].tokens == model.generate(TEXTS[0], max_new_tokens=12).tokens
    assert "".join(model.stream(ids, max_new_tokens=12)) == text.text


def test_hugging_faces_names_map_to_ours_or_are_refused_in_one_line(hf):
    """Catches an HF name taken with another meaning (max_length as new tokens, do_sample=True
    at temperature 0, num_assistant_tokens ignored) or an HF-only name silently ignored or
    failing deep inside: each maps to the same call with our names or is one line naming
    ours, in generate and in a strategy's settings (benchmark's); num_drafts (the old
    spelling) names num_draft."""
    model, *_ = hf
    length = len(model.tokenizer.encode(PROMPT, add_special_tokens=True))
    same = {"max_length": (dict(max_length=length + 7), dict(max_new_tokens=7)),
            "do_sample=False": (dict(do_sample=False), dict(temperature=0.0)),
            "do_sample=True": (dict(do_sample=True, seed=3), dict(temperature=1.0, seed=3)),
            "num_assistant_tokens": (dict(num_assistant_tokens=2), dict(num_draft=2))}
    for case, (theirs, ours) in same.items():
        a = model.generate(PROMPT, max_new_tokens=ours.pop("max_new_tokens", 9), **ours)
        b = model.generate(PROMPT, **({"max_new_tokens": 9} if "max_length" not in theirs
                                      else {}), **theirs)
        assert (a.tokens, a.stats) == (b.tokens, b.stats), case
    for name, ours in HF_REFUSED.items():
        with pytest.raises(ValueError, match=f"^{name} is Hugging Face's; here use ") as error:
            model.generate(PROMPT, max_new_tokens=2, **{name: 1})
        assert ours in str(error.value) and "\n" not in str(error.value)
    for call, wrong in ((dict(do_sample=True, temperature=0.0), "temperature=0.0 must be > 0"),
                        (dict(do_sample=False, temperature=0.5), "do_sample=False is greedy"),
                        (dict(max_length=3), "must exceed the longest prompt"),
                        (dict(max_length=length + 2, max_new_tokens=2), "not both")):
        with pytest.raises(ValueError, match=wrong):
            model.generate(PROMPT, **call)
    with pytest.raises(ValueError, match="^num_drafts is now num_draft"):
        model.exit_report(num_drafts=(2,))
    # a strategy's settings (benchmark's, tune's) take the same names
    assert model.strategy("selfspec", num_assistant_tokens=2) == \
        model.strategy("selfspec", num_draft=2) != model.strategy("selfspec", num_draft=3)
    with pytest.raises(ValueError, match="^prompt_lookup_num_tokens is Hugging Face's"):
        model.benchmark({"x": {"strategy": "ngram", "prompt_lookup_num_tokens": 3}}, [PROMPT])


@pytest.mark.parametrize("method, call, suggestion", [
    ("generate", dict(max_new_token=3), "max_new_tokens"),
    ("generate", dict(max_tokens=3), "max_new_tokens"),
    ("generate", dict(num_drafts=3), "num_draft"),
    ("generate", dict(exit_layr=1), "exit_layer"),
    ("stream", dict(temprature=0.5), "temperature"),
    ("benchmark", dict(repeat=2), "repeats"),
    ("exit_report", dict(max_token=8), "max_tokens"),
])
def test_an_unknown_option_suggests_the_closest(hf, method, call, suggestion):
    """Catches an unknown keyword failing as Python's TypeError, or silently passed on,
    instead of one line naming the closest option (difflib), in each API method."""
    model, *_ = hf
    args = {"generate": (PROMPT,), "stream": (PROMPT,), "benchmark": ({},),
            "exit_report": ()}[method]
    with pytest.raises(ValueError, match=f"did you mean '{suggestion}'|is now {suggestion}"):
        result = getattr(model, method)(*args, **call)
        list(result) if method == "stream" else None


def test_the_generate_cli_writes_tokens_and_logprobs_and_stops(hf, tmp_path):
    """Catches --stop or --logprobs not reaching the loop, and JSONL rows without the
    completion's token ids: the CLI's row equals the API's completion."""
    model, _, _, workdir = hf
    expected = model.generate(PROMPT, max_new_tokens=NEW, stop=["\n", ", "], logprobs=True)
    out = tmp_path / "out.jsonl"
    result = run_script("infer/generate.py", "--workdir", workdir, "--prompt", PROMPT,
                        "--max_new_tokens", str(NEW), "--stop", "\n", "--stop", ", ",
                        "--logprobs", "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["tokens"] == expected.tokens
    assert record["completion"] == expected.text
    np.testing.assert_allclose(record["logprobs"], expected.logprobs, atol=1e-6)


def test_a_prompts_file_takes_token_ids(hf, tmp_path):
    """Catches {"ids": [...]} lines read as text or re-encoded (their text's own ids, or the
    tokenizer's conventions around them), and bad ids failing deep inside: the CLI's row for
    reversed ids (no text encodes to them) equals the API's completion of the same ids, and
    shows their text as its prompt."""
    model, _, _, workdir = hf
    ids = model.tokenizer.encode(PROMPT).tolist()[::-1]
    expected = model.generate(ids, max_new_tokens=8)
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    prompts.write_text(json.dumps({"ids": ids}) + "\n")
    result = run_script("infer/generate.py", "--workdir", workdir, "--prompts_file",
                        str(prompts), "--max_new_tokens", "8", "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(out.read_text())
    assert (record["tokens"], record["prompt"]) == (expected.tokens, model.tokenizer.decode(ids))
    for bad in ([], ["a"], [1.5], 7):
        prompts.write_text(json.dumps({"ids": bad}) + "\n")
        with pytest.raises(ValueError, match=r"prompts.jsonl:1: 'ids' must be a non-empty list"):
            read_prompts_file(str(prompts))


@pytest.mark.parametrize("stop, message", [(123, "not 123"), ([], "empty list"),
                                           ([""], "not ''"), (["a", None], "not None")])
def test_a_bad_stop_is_one_line(stop, message):
    """Catches a stop that is no string failing deep inside (list(123): a TypeError) or an
    empty one matching everywhere."""
    from specjax.tokenizer import ByteTokenizer

    with pytest.raises(ValueError, match=message):
        StopStrings(stop, ByteTokenizer().token_bytes())


def reference_cut(vocab, prompt, tokens, stops):
    """A plain-Python stop check: the prefix of `tokens` up to and including the first whose
    bytes hold the last byte of a stop string (searched in prompt + tokens' bytes; ids past
    `vocab` add no bytes)."""
    text = b"".join(vocab[t] if t < len(vocab) else b"" for t in prompt)
    for n, token in enumerate(tokens):
        before = len(text)
        text += vocab[token] if token < len(vocab) else b""
        if any(text.find(s, max(0, before - len(s) + 1)) != -1
               and text.find(s, max(0, before - len(s) + 1)) + len(s) > before for s in stops):
            return tokens[:n + 1]
    return tokens


def test_the_stop_check_is_a_plain_python_search_over_multibyte_tokens():
    """Catches a stop ended by a token past the round's count (a rejected draft or a token past
    the budget), one ending inside a token rather than at its last byte missed, a token's
    padding bytes read as bytes (tokens of exactly j bytes at byte j), and an id past the
    tokenizer's vocabulary resetting the automaton: `advance` over rounds whose uncommitted
    slots hold unrelated ids, against a plain-Python byte search. No model runs."""
    rng = np.random.default_rng(1)
    vocab = [bytes(rng.choice(list(b"ab\x00c"), n)) for n in rng.integers(0, 5, 40)]
    vocab[:4] = [b"", b"a", b"\x00", b"ab\x00"]
    step = jax.jit(advance)
    for _ in range(80):
        prompt = rng.integers(0, 44, rng.integers(1, 4)).tolist()  # 40..43: past the vocabulary
        tokens = rng.integers(0, 44, 20).tolist()
        stops = ["".join("ab\x00"[i] for i in rng.integers(0, 3, n))
                 for n in rng.integers(1, 5, 2)]
        loop = StopStrings(stops, vocab).table([prompt], 44, 32)
        state, kept, at = loop.state, [], 0
        while at < len(tokens):
            piece = tokens[at:at + 4]
            count = int(rng.integers(1, len(piece) + 1))
            padded = piece[:count] + rng.integers(0, 44, 4 - count).tolist()
            counted, ended, state = step(loop, state, jnp.asarray([padded]), jnp.asarray([count]))
            assert int(counted[0]) <= count
            kept += piece[:int(counted[0])]
            at += int(counted[0])
            if ended[0]:
                break
        expected = reference_cut(vocab, prompt, tokens, [s.encode() for s in stops])
        assert kept == expected, (prompt, tokens, stops)


def test_do_sample_keeps_the_temperature_given_with_it(hf):
    """Catches do_sample=True sampling at temperature 1.0 whatever temperature= says
    (transformers samples at the given one): do_sample=True, temperature=0.3 draws what
    temperature=0.3 draws with the same seed, and not what 1.0 draws."""
    model, *_ = hf
    theirs = model.generate(PROMPT, max_new_tokens=12, do_sample=True, temperature=0.3, seed=4)
    ours = model.generate(PROMPT, max_new_tokens=12, temperature=0.3, seed=4)
    hot = model.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=4)
    assert theirs.tokens == ours.tokens != hot.tokens


def test_max_length_counts_from_the_longest_prompt_of_a_batch(hf):
    """Catches max_length measured from the shortest prompt of a batch (more new tokens than
    the longest prompt leaves, or the first prompt's): prompts of 3 and 9 tokens with
    max_length=14 generate the 5 new tokens max_new_tokens=5 does."""
    model, *_ = hf
    ids = model.tokenizer.encode(PROMPT).tolist()
    prompts = [ids[:3], ids[:9]]
    theirs = model.generate(prompts, max_length=14)
    ours = model.generate(prompts, max_new_tokens=5)
    assert [c.tokens for c in theirs] == [c.tokens for c in ours]
    assert [len(c.tokens) for c in ours] == [5, 5]
