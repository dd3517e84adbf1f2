"""A Hugging Face checkpoint's tokenizer conventions, against transformers on the same folder:
prompts encoded as `tokenizer(prompt)` encodes them (a BOS only where the tokenizer's
post-processor adds one), chats rendered as `apply_chat_template(..., add_generation_prompt=
True)` renders them, generation ended by generation_config.json's EOS ids, and the workdir's
own tokenizer files read back the same by both."""

import dataclasses
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa

import specjax  # noqa: E402
from specjax.chat import render_chat  # noqa: E402
from specjax.convert.hf import export_checkpoint  # noqa: E402
from specjax.prompt_sets import encode_prompts  # noqa: E402
from tests.support.scripts import run_script  # noqa: E402

pytestmark = pytest.mark.slow

TEXTS = ["def f(x):\n    return x + 1", "hello world, the quick brown fox", "  x  = 12345\n"]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + "
            "m['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|im_start|>assistant\n' }}{% endif %}")


def trained_bpe(corpus: list[str] | None = None) -> Tokenizer:
    """A byte-level BPE of 300 ids, its special tokens first (<s> 0, </s> 1), with no
    post-processor yet: trained on TEXTS with every byte in its alphabet, or on `corpus`
    with only the characters it holds (an ASCII corpus: every id decodes to ASCII)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus or TEXTS * 30, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=[] if corpus else pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return bpe


def save_tokenizer(folder, bpe: Tokenizer, template: str | None,
                   settings: dict | None = None) -> None:
    """`bpe` as tokenizer.json, and a tokenizer_config.json naming its BOS and EOS, with the
    chat template `template` and `settings` added."""
    bpe.save(os.path.join(folder, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": "</s>", **({"chat_template": template} if template else {}),
              **(settings or {})}
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)


def checkpoint(folder, *, bos: bool, template: str | None = None, stops=None, seed=0,
               corpus: list[str] | None = None) -> str:
    """A random tiny Llama with a byte-level BPE tokenizer (`trained_bpe` on `corpus`) whose
    post-processor adds a BOS (`bos`) or nothing, a chat template in tokenizer_config.json,
    and generation_config.json's EOS ids `stops`."""
    bpe = trained_bpe(corpus)
    if bos:
        bpe.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)])
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, vocab_size=300, bos_token_id=0, eos_token_id=1,
        initializer_range=0.2, tie_word_embeddings=False)).eval()
    if stops is not None:
        model.generation_config.eos_token_id = stops
    model.save_pretrained(str(folder))
    save_tokenizer(folder, bpe, template)
    return str(folder)


def reference(folder):
    return (transformers.AutoTokenizer.from_pretrained(folder),
            transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval())


def hf_greedy(model, ids, new):
    with torch.no_grad():
        out = model.generate(torch.tensor([list(ids)]), max_new_tokens=new, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("bos", [True, False])
def test_prompts_encode_and_generate_as_transformers_does(tmp_path, bos):
    """Catches a BOS added where the tokenizer adds none (a planted always-BOS fails the
    bos=False case: SmolLM2 and Qwen2 add none) or left out where it adds one, and a greedy
    completion that is not transformers' `generate(**tokenizer(prompt))`."""
    folder = checkpoint(tmp_path / "hf", bos=bos)
    model = specjax.import_hf(folder, str(tmp_path / "w"))
    tokenizer, hf_model = reference(folder)
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert model.tokenizer.encode(text, add_special_tokens=True).tolist() == ids
        assert (ids[0] == 0) == bos
    prompt = TEXTS[0]
    completion = model.generate(prompt, strategy="ar", max_new_tokens=12)
    assert completion.tokens == hf_greedy(hf_model, tokenizer(prompt)["input_ids"], 12)
    assert model.generate(prompt, max_new_tokens=12).tokens == completion.tokens  # selfspec


def test_chat_prompts_render_as_apply_chat_template_and_generate_the_same(tmp_path):
    """Catches a chat template rendered otherwise than transformers renders it (blocks not
    trimmed, `bos_token` unset, the generation prompt left out), a rendered chat encoded with
    a second BOS, the CLI's --chat disagreeing with the API, and --chat wrapping a prompts
    file's conversation as one user message whose content is the whole list."""
    folder = checkpoint(tmp_path / "hf", bos=True, template=TEMPLATE)
    model = specjax.import_hf(folder, str(tmp_path / "w"))
    tokenizer, hf_model = reference(folder)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hello world"}]
    assert render_chat(model.tokenizer, messages) == tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
    assert ids.count(0) == 1  # the template's own BOS, not a second one
    assert encode_prompts(model.tokenizer, [messages], chat=True)[0].tolist() == ids
    completion = model.generate(messages=messages, strategy="ar", max_new_tokens=10)
    assert completion.tokens == hf_greedy(hf_model, ids, 10)
    single = [{"role": "user", "content": "hello world"}]
    chat = model.generate("hello world", chat=True, strategy="ar", max_new_tokens=10)
    assert chat.tokens == model.generate(messages=single, strategy="ar",
                                         max_new_tokens=10).tokens
    result = run_script("infer/generate.py", "--workdir", str(tmp_path / "w"), "--chat",
                        "--prompt", "hello world", "--strategy", "ar", "--max_new_tokens", "10")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("hello world\n" + chat.text)


def test_generation_ends_at_any_of_generation_configs_eos_ids(tmp_path):
    """Catches generation ended by the config's one EOS only (Llama-3 and chat models list
    several in generation_config.json): a row ends at the second listed id, as transformers'
    does, for ar and a drafting strategy."""
    probe = checkpoint(tmp_path / "probe", bos=False)
    tokenizer, hf_model = reference(probe)
    ids = tokenizer(TEXTS[1])["input_ids"]
    free = hf_greedy(hf_model, ids, 24)
    stop = next(t for t in free[3:] if t != 1)
    folder = checkpoint(tmp_path / "hf", bos=False, stops=[1, stop])
    model = specjax.import_hf(folder, str(tmp_path / "w"))
    _, hf_model = reference(folder)
    expected = hf_greedy(hf_model, ids, 24)
    assert expected[-1] == stop and len(expected) < 24
    assert model.tokenizer.stop_ids == (1, stop)
    for strategy in ("ar", "ngram", "selfspec"):
        assert model.generate(TEXTS[1], strategy=strategy, max_new_tokens=24).tokens == expected
    streamed = "".join(model.stream(TEXTS[1], strategy="ar", max_new_tokens=24))
    assert streamed == model.tokenizer.decode(expected)  # the stream ends there too


def test_the_generate_cli_takes_a_prompt_sets_first_prompts_with_or_without_specials(tmp_path):
    """Catches generate.py's --num_prompts ignored with --prompt_set (every prompt of the set
    decoded) and --noadd_special_tokens ignored (the tokenizer's BOS added anyway): the rows
    are the set's first two, completed from their ids without the BOS."""
    from specjax.prompt_sets import load_prompt_set

    model = specjax.import_hf(checkpoint(tmp_path / "hf", bos=True), str(tmp_path / "w"))
    out = tmp_path / "out.jsonl"
    result = run_script("infer/generate.py", "--workdir", str(tmp_path / "w"), "--prompt_set",
                        "chat", "--num_prompts", "2", "--noadd_special_tokens", "--strategy",
                        "ar", "--max_new_tokens", "6", "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    prompts = load_prompt_set("chat", model.tokenizer, 2)  # plain text: no chat template
    completions = {flag: model.generator.generate(
        [model.tokenizer.encode(p, add_special_tokens=flag) for p in prompts],
        max_new_tokens=6, eos_id=model.tokenizer.stop_ids).tokens for flag in (False, True)}
    assert completions[False] != completions[True]
    assert [r["prompt"] for r in records] == prompts
    assert [r["completion"] for r in records] == [model.tokenizer.decode(t)
                                                  for t in completions[False]]


def test_the_workdir_and_its_export_keep_the_conventions(tmp_path):
    """Catches conventions lost on the way: the workdir's tokenizer files read by transformers
    (a BOS-less tokenizer stays BOS-less, the chat template and EOS ids stay), and an export
    back to Hugging Face that transformers loads with the same conventions."""
    folder = checkpoint(tmp_path / "hf", bos=False, template=TEMPLATE, stops=[1, 3])
    model = specjax.import_hf(folder, str(tmp_path / "w"))
    export_checkpoint(str(tmp_path / "w"), str(tmp_path / "exported"))
    original, _ = reference(folder)
    messages = [{"role": "user", "content": "hi"}]
    for where in (str(tmp_path / "w"), str(tmp_path / "exported")):
        tokenizer = transformers.AutoTokenizer.from_pretrained(where)
        for text in TEXTS:
            assert tokenizer(text)["input_ids"] == original(text)["input_ids"], where
        assert tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=False) == render_chat(model.tokenizer,
                                                                            messages)
    config = transformers.GenerationConfig.from_pretrained(str(tmp_path / "exported"))
    assert config.eos_token_id == [1, 3]
    reloaded = specjax.load(str(tmp_path / "w"))
    assert reloaded.tokenizer.stop_ids == (1, 3) and reloaded.tokenizer.prefix == ()
    np.testing.assert_array_equal(reloaded.tokenizer.encode(TEXTS[0], add_special_tokens=True),
                                  original(TEXTS[0])["input_ids"])


def tokenizer_folder(folder, *, template: str | None = None, suffix: bool = False,
                     settings: dict | None = None) -> str:
    """The tokenizer files of `checkpoint` alone (no model): a BOS before every text, with
    `suffix` an EOS after it too, a chat template in tokenizer_config.json, `settings` added."""
    bpe = trained_bpe()
    around = "<s> $A </s>" if suffix else "<s> $A"
    bpe.post_processor = processors.TemplateProcessing(
        single=around, pair=f"{around} $B", special_tokens=[("<s>", 0), ("</s>", 1)])
    os.makedirs(folder, exist_ok=True)
    save_tokenizer(folder, bpe, template, settings)
    return str(folder)


def test_a_suffix_and_a_documents_eos_come_as_transformers_puts_them(tmp_path):
    """Catches a post-processor's suffix misread (its first id dropped: the probe's slice off
    by one) and a training document given a second EOS after a suffix that ends with one."""
    from specjax.tokenizer import load_tokenizer

    folder = tokenizer_folder(tmp_path, suffix=True)
    ours, theirs = load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    assert (ours.prefix, ours.suffix) == ((0,), (1,))
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        assert ours.encode(text, add_special_tokens=True).tolist() == ids and ids[-1] == 1
        document = ours.encode(text, add_special_tokens=True, add_eos=True).tolist()
        assert document == ids  # one EOS, the suffix's
    assert ours.encode("x", add_eos=True).tolist()[-1] == 1


def test_the_chat_template_is_read_where_transformers_reads_it(tmp_path):
    """Catches tokenizer_config.json's template preferred to chat_template.jinja (transformers
    reads the file first) and the first of a list of named templates taken instead of
    "default"."""
    from specjax.tokenizer import load_tokenizer

    messages = [{"role": "user", "content": "hi"}]
    both = tokenizer_folder(tmp_path / "both", template="CONFIG{{ messages[0]['content'] }}")
    with open(os.path.join(both, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write("FILE{{ messages[0]['content'] }}")
    named = tokenizer_folder(tmp_path / "named", settings={"chat_template": [
        {"name": "tool_use", "template": "TOOL{{ messages[0]['content'] }}"},
        {"name": "default", "template": "DEFAULT{{ messages[0]['content'] }}"}]})
    for folder, expected in ((both, "FILEhi"), (named, "DEFAULThi")):
        theirs = transformers.AutoTokenizer.from_pretrained(folder)
        assert theirs.apply_chat_template(messages, tokenize=False) == expected
        assert render_chat(load_tokenizer(folder), messages,
                           add_generation_prompt=False) == expected


def test_templates_render_whitespace_eos_and_json_as_transformers_does(tmp_path):
    """Catches a jinja environment unlike transformers': blocks not trimmed (a newline after
    each tag) or not left-stripped (indentation kept), `eos_token` unset, and a `tojson` that
    escapes non-ASCII text."""
    from specjax.tokenizer import load_tokenizer

    template = ("{% for message in messages %}\n"
                "    {% if message['role'] == 'user' %}\n"
                "<|im_start|>user {{ message['content'] }}{{ eos_token }}\n"
                "    {% else %}\n"
                "{{ message | tojson }}\n"
                "    {% endif %}\n"
                "{% endfor %}\n"
                "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}")
    folder = tokenizer_folder(tmp_path, template=template)
    messages = [{"role": "system", "content": "Réponds en français, s'il te plaît — 日本"},
                {"role": "user", "content": "héllo"}]
    expected = transformers.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)
    assert "日本" in expected and "</s>" in expected
    assert render_chat(load_tokenizer(folder), messages) == expected


def test_data_and_older_workdirs_keep_their_conventions(tmp_path):
    """Catches training data given a BOS its tokenizer does not add (a data config naming a
    BOS-less tokenizer), a workdir's empty prefix turned into its BOS for the data, a workdir
    written before conventions were recorded losing the BOS its model was trained with, and a
    token cache shared by two conventions of one tokenizer.json (the fingerprint leaves them
    out)."""
    from specjax.tokenizer import UNSET_ID, data_fields, get_tokenizer, load_tokenizer

    folder = checkpoint(tmp_path / "hf", bos=False)
    bare = load_tokenizer(folder)
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    assert bare.encode(TEXTS[0], add_special_tokens=True).tolist() == reference(
        TEXTS[0])["input_ids"] and bare.prefix == ()
    spec = {"kind": "hf", "file": "tokenizer.json", "bos_id": 0, "eos_id": 1}
    assert data_fields({**spec, "prefix": []}, folder)["bos_id"] == UNSET_ID
    assert data_fields({**spec, "prefix": [0]}, folder)["bos_id"] == 0
    legacy = get_tokenizer(spec, folder)  # no "prefix": written before conventions were kept
    assert legacy.prefix == (0,) and legacy.stop_ids == (1,)
    assert get_tokenizer({**spec, "prefix": []}, folder).fingerprint() != legacy.fingerprint()


def test_a_special_id_one_past_the_vocabulary_is_refused(tmp_path):
    """A BOS (or EOS, prefix, stop) id equal to the vocabulary's size, one past its last id,
    is a one-line error, from an import's tokenizer source and from a tokenizer file; the last
    id itself is accepted. Catches the range check `v <= size`, which lets an id the
    embedding has no row for through to the first prompt."""
    from specjax.tokenizer import HFTokenizer, read_tokenizer_folder

    folder = tokenizer_folder(tmp_path)
    source = read_tokenizer_folder(folder)
    file = os.path.join(folder, "tokenizer.json")
    size = Tokenizer.from_file(file).get_vocab_size()
    assert size == 300 == transformers.AutoTokenizer.from_pretrained(folder).vocab_size
    source.check(size, "hf")
    assert HFTokenizer(file, bos_id=size - 1, eos_id=size - 1).bos_id == size - 1
    for fields in ({"bos_id": size}, {"eos_id": size}, {"stop_ids": [1, size]}):
        with pytest.raises(ValueError) as caught:
            dataclasses.replace(source, **fields).check(size, "hf")
        name, value = next(iter(fields.items()))
        assert str(caught.value) == (f"{name}={size} is not an id of the tokenizer of hf "
                                     f"({size} ids)")
    with pytest.raises(ValueError, match=f"^bos_id={size} is not an id of the tokenizer in "):
        HFTokenizer(file, bos_id=size)


def test_the_first_of_config_json_s_eos_ids_is_the_eos(tmp_path):
    """With config.json's `eos_token_id` a list ([1, 3]) and no generation_config.json, the
    EOS (a document's last id) is its first, 1, transformers' `eos_token_id` for this
    tokenizer, and generation stops at both, as transformers' generation config built from
    that config.json does. Catches the last of the list taken for the EOS."""
    from specjax.tokenizer import load_tokenizer

    folder = tokenizer_folder(tmp_path)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"model_type": "llama", "bos_token_id": 0, "eos_token_id": [1, 3]}, f)
    ours, theirs = load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    generation = transformers.GenerationConfig.from_model_config(
        transformers.AutoConfig.from_pretrained(folder))
    assert ours.eos_id == theirs.eos_token_id == 1
    assert ours.encode("x", add_eos=True).tolist()[-1] == 1
    assert list(ours.stop_ids) == generation.eos_token_id == [1, 3]


@pytest.mark.parametrize("message", [{"role": "user", "content": None}, {"content": "hi"},
                                     {"role": "user"}, {"role": 1, "content": "hi"}],
                         ids=["content-none", "no-role", "no-content", "role-not-str"])
def test_a_message_without_a_string_role_and_content_is_refused(tmp_path, message):
    """A message whose role or content is missing or not a string is a one-line ValueError
    naming it, before the template runs (a template would render None as "None" or fail
    inside jinja). Catches the check passing a message with either field a string (`any`
    instead of `all`)."""
    from specjax.chat import check_messages
    from specjax.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_folder(tmp_path, template=TEMPLATE))
    conversation = [{"role": "user", "content": "hello"}, message]
    for call in (check_messages, lambda m: render_chat(tokenizer, m)):
        with pytest.raises(ValueError) as caught:
            call(conversation)
        assert str(caught.value) == ("message 1 of the conversation is not a dict with string "
                                     f"'role' and 'content': {message!r:.80}")


def test_a_given_bos_id_is_the_prefix_every_text_starts_with(tmp_path):
    """`load_tokenizer(folder, bos_id=2)` starts an encoded text with id 2, not the folder's
    post-processor BOS (0). Catches a given `bos_id` ignored for the prefix (the folder's
    prefix kept while `bos_id` says otherwise)."""
    from specjax.tokenizer import load_tokenizer

    folder = tokenizer_folder(tmp_path)
    assert load_tokenizer(folder).encode("a", add_special_tokens=True)[0] == 0
    given = load_tokenizer(folder, bos_id=2)
    assert given.prefix == (2,)
    assert given.encode("a", add_special_tokens=True)[0] == 2


def test_a_given_eos_id_ends_documents_and_generations(tmp_path):
    """`load_tokenizer(folder, eos_id=3)`: a document ends with 3 and generation stops at 3
    alone, not at the folder's own EOS (1), as its docstring promises. Catches the given
    `eos_id` left out of the stop ids (a generation running on past it)."""
    from specjax.tokenizer import load_tokenizer

    folder = tokenizer_folder(tmp_path)
    assert load_tokenizer(folder).stop_ids == (1,)
    given = load_tokenizer(folder, eos_id=3)
    assert given.eos_id == 3 and given.stop_ids == (3,)
    assert given.encode("a", add_eos=True).tolist()[-1] == 3

def test_tokenizers_differing_only_in_their_suffix_have_different_fingerprints(tmp_path):
    """Two HF tokenizers of the same tokenizer.json, one putting an EOS after a text, encode
    "a" differently, so their fingerprints differ. Catches the suffix dropped from
    `fingerprint` (token caches encoded with one suffix reused for the other)."""
    from specjax.tokenizer import HFTokenizer, tokenizer_file

    path = tokenizer_file(tokenizer_folder(tmp_path))
    bare = HFTokenizer(path, 0, 1, prefix=[0])
    suffixed = HFTokenizer(path, 0, 1, prefix=[0], suffix=[1])
    assert (bare.encode("a", add_special_tokens=True).tolist()
            != suffixed.encode("a", add_special_tokens=True).tolist())
    assert bare.fingerprint() != suffixed.fingerprint()
