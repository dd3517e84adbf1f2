"""The bring-your-own-model recipe (docs/guide/your-own-model.md, which the README's recipe
quotes) runs as written, at smoke size: a stand-in checkpoint (BPE tokenizer, plain model,
Hugging Face export), import, exit report, LayerSkip continual
training from it, exit report, bench, export; transformers loads the export, its logits match,
and its `generate(assistant_early_exit=E)` runs."""

import json
import os
import re
import shlex

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402

from specjax import model as M  # noqa: E402
from specjax.io.checkpoint import load_params  # noqa: E402
from tests.support import ROOT  # noqa: E402
from tests.support.scripts import run_script  # noqa: E402

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

SMALL_RUN = ["--config.data.max_documents=150", "--config.data.seq_len=64",
             "--config.train.batch_size=4", "--config.train.total_steps=4",
             "--config.train.warmup_steps=1", "--config.train.eval_every=4",
             "--config.train.save_every=4", "--config.train.eval_batches=1"]
SMALL_MODEL = ["--config.model.d_model=64", "--config.model.num_layers=4",
               "--config.model.num_heads=2", "--config.model.mlp_dim=128",
               "--config.model.exit_layers=(4,)"]
# What each command gets appended to run at smoke size (the guide's values stay as written).
SMOKE = {
    "train/tokenizer.py": ["--config.data.max_documents=150"],
    "train/train.py standin": SMALL_RUN + SMALL_MODEL,
    "train/train.py continual": SMALL_RUN,
    "infer/exit_report.py": ["--max_tokens=1024", "--repeats=2", "--num_draft=2,4",
                             "--num_prompts=2", "--prompt_len=16", "--max_new_tokens=32"],
    "bench/bench.py": ["--num_prompts=2", "--prompt_len=16", "--max_new_tokens=12",
                       "--repeats=1"],
    "tools/convert.py": [],
}


def recipe_commands() -> list[list[str]]:
    """The commands of the recipe's code block (the guide's first), continuation lines
    joined."""
    with open(os.path.join(ROOT, "docs", "guide", "your-own-model.md"), encoding="utf-8") as f:
        guide = f.read()
    block = re.search(r"```bash\n(.*?)```", guide, flags=re.S).group(1)
    lines = block.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.startswith(".venv/bin/python")]


def _smoke(args: list[str]) -> list[str]:
    """The command's script and arguments, its smoke sizes added."""
    script = args[1]
    key = f"{script} {args[3].rsplit(':', 1)[-1]}" if script == "train/train.py" else script
    return [script, *args[2:], *SMOKE[key]]


def test_the_readme_recipe_runs_from_a_stand_in_to_a_self_drafting_export(tmp_path):
    """Catches a recipe command the code no longer accepts, a continual run that does not
    start from the stand-in's weights and tokenizer, and an export transformers cannot load
    or computes differently."""
    commands = recipe_commands()
    assert [c[1] for c in commands] == [
        "train/tokenizer.py", "train/train.py", "tools/convert.py", "tools/convert.py",
        "infer/exit_report.py", "train/train.py", "infer/exit_report.py", "bench/bench.py",
        "tools/convert.py"]
    for args in commands:
        result = run_script(*_smoke(args), cwd=tmp_path)
        assert result.returncode == 0, (args, result.stderr[-2000:])
    runs = tmp_path / "runs"
    meta = load_params(str(runs / "continual"))[2]
    assert meta["init"]["source"] == str(runs / "standin_hf")
    assert meta["tokenizer"]["kind"] == "hf" and meta["model"]["exit_layers"] == [1, 2, 4]
    hf_dir = str(runs / "continual_hf")
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        assert json.load(f)["eos_token_id"] == 1
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(hf_dir, "tokenizer.json"))
    ids = np.asarray([tokenizer.encode("def main(args):\n    return")])
    params, cfg, _ = load_params(str(runs / "continual"))
    ours = M.exit_logits(params, cfg, M.run_layers(params, cfg, M.embed(params, cfg,
                                                                         jnp.asarray(ids)))[-1])
    with torch.no_grad():
        theirs = hf_model(torch.tensor(ids)).logits.numpy()
        plain = hf_model.generate(torch.tensor(ids), max_new_tokens=8, do_sample=False)
        drafted = hf_model.generate(torch.tensor(ids), max_new_tokens=8, do_sample=False,
                                    assistant_early_exit=1)
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=2e-5)
    assert torch.equal(plain, drafted)
