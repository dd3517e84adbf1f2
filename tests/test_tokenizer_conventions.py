"""A Hugging Face checkpoint's tokenizer conventions, against transformers on the same folder:
prompts encoded as `tokenizer(prompt)` encodes them (a BOS only where the tokenizer's
post-processor adds one), chats rendered as `apply_chat_template(..., add_generation_prompt=
True)` renders them, generation ended by generation_config.json's EOS ids, and the workdir's
own tokenizer files read back the same by both."""

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
from tests.conftest import run_script  # noqa: E402

pytestmark = pytest.mark.slow

TEXTS = ["def f(x):\n    return x + 1", "hello world, the quick brown fox", "  x  = 12345\n"]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + "
            "m['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|im_start|>assistant\n' }}{% endif %}")


def checkpoint(folder, *, bos: bool, template: str | None = None, stops=None, seed=0) -> str:
    """A random tiny Llama with a byte-level BPE tokenizer whose post-processor adds a BOS
    (`bos`) or nothing, a chat template in tokenizer_config.json, and generation_config.json's
    EOS ids `stops`."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXTS * 30, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
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
    bpe.save(os.path.join(folder, "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                "eos_token": "</s>"}
    if template:
        settings["chat_template"] = template
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(settings, f)
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
    a second BOS, and the CLI's --chat disagreeing with the API."""
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
