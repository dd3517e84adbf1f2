"""The README, docs/ and the notebooks stay true to the code: every command names a script and
flags that exist, every config field it sets exists in its config, every relative link
resolves, and every notebook is ready for Colab with its figures committed. (The commands that
can run in a test run in test_readme.py and test_recipe.py; the notebooks in
test_notebooks*.py.)"""

import functools
import glob
import json
import os
import re
import shlex
import xml.etree.ElementTree as ElementTree

import pytest

from specjax.api import read_config
from tests.support import ROOT
from tests.support.scripts import run_script

DOCS = ["README.md", *sorted(os.path.relpath(path, ROOT) for path in
                             glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))]
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
README_LINES = 250


# Scripts moved since dated results ran them (issue 49): docs/results/ keeps each command as it
# was run, checked and run here at the script's present path.
MOVED_SCRIPTS = {"infer/search_skip.py": "infer/skip_search.py",
                 "infer/calibrate.py": "infer/learn_then_test.py",
                 "infer/exits.py": "infer/exit_report.py", "infer/convert.py": "tools/convert.py",
                 "infer/calm_bench.py": "bench/calm_quality.py",
                 **{f"{folder}/{name}.py": f"bench/{name}.py" for folder, name in (
                     ("infer", "bench"), ("infer", "attention_bench"), ("infer", "busy_bench"),
                     ("infer", "compile_bench"), ("infer", "tree_scan_bench"),
                     ("train", "data_bench"), ("train", "step_bench"),
                     ("train", "memory_check"))}}


def _read(name: str) -> str:
    """A document's text; a dated result's with its moved scripts at their present paths."""
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        text = f.read()
    if name.startswith("docs/results/"):
        for old, new in MOVED_SCRIPTS.items():
            text = text.replace(old, new)
    return text


def commands(text: str) -> list[list[str]]:
    """The `.venv/bin/python script ...` commands of a text's bash blocks: continuation lines
    joined, comments dropped, `&&` chains split, environment assignments left out."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0] if not line.lstrip().startswith("#") else ""
            words_of_line = shlex.split(line)
            starts = [0] + [i + 1 for i, word in enumerate(words_of_line) if word == "&&"]
            for start in starts:
                words = words_of_line[start:]
                words = words[:words.index("&&")] if "&&" in words else words
                while words and re.fullmatch(r"\w+=.*", words[0]):
                    words = words[1:]
                if words[:1] == [".venv/bin/python"] and words[1:2] != ["-m"]:
                    found.append(words[1:])
    return found


@functools.cache
def script_flags(script: str) -> set[str]:
    """The flags a script defines, as absl registered them (`--helpxml`: its own, the shared
    ones of `specjax.cli`, absl's)."""
    result = run_script(script, "--helpxml")
    assert result.returncode == 0, f"{script} --helpxml: {result.stderr[-2000:]}"
    flags = ElementTree.fromstring(result.stdout).iter("flag")
    return {flag.findtext("name") for flag in flags} | {"help", "helpfull"}


def config_sections(spec: str) -> dict:
    """The sections of a "name[:variant]" config (a shipped config, as the docs name them)."""
    return read_config(spec)


ALL_COMMANDS = [(doc, command) for doc in DOCS for command in commands(_read(doc))]


def test_docs_hold_commands_to_check():
    """Catches a change to the block format that would leave the checks below with nothing
    to check (a silent pass)."""
    assert len(ALL_COMMANDS) > 60 and {doc for doc, _ in ALL_COMMANDS} >= {
        "README.md", "docs/guide/decoding.md", "docs/guide/drafters.md", "docs/benchmarks.md"}


@pytest.mark.parametrize("doc,command", ALL_COMMANDS,
                         ids=[f"{doc}:{' '.join(c[:2])[:60]}" for doc, c in ALL_COMMANDS])
def test_every_documented_command_uses_existing_flags_and_config_fields(doc, command):
    """Catches a renamed or removed flag, script, config variant or config field that a
    documented command still uses (a reader's first error would be absl's)."""
    script, args = command[0], command[1:]
    assert os.path.isfile(os.path.join(ROOT, script)), f"{doc}: no script {script}"
    defined = script_flags(script)
    config_spec = None
    for i, arg in enumerate(args):
        if arg == "--config":
            config_spec = args[i + 1]
        elif arg.startswith("--config="):
            config_spec = arg.split("=", 1)[1]
    for arg in args:
        if not arg.startswith("--"):
            continue
        name = arg[2:].split("=", 1)[0]
        if name.startswith("config."):
            sections = config_sections(config_spec or "tiny_code")
            *path, leaf = name.split(".")[1:]
            for key in path:
                assert key in sections, f"{doc}: {script} {arg}: no config section {key!r}"
                sections = sections[key]
            assert leaf in sections, f"{doc}: {script} {arg}: no config field {leaf!r}"
        else:
            plain = name[2:] if name.startswith("no") and name[2:] in defined else name
            assert plain in defined, f"{doc}: {script} has no flag --{name}"


def test_relative_links_resolve():
    """Catches a link to a moved or renamed document or file."""
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _read(doc)):
            if "://" in target:
                continue
            if not os.path.exists(os.path.join(ROOT, os.path.dirname(doc), target)):
                broken.append(f"{doc}: {target}")
    assert not broken


def test_the_readme_is_a_front_door():
    """Catches measurement studies or guides growing back into the README (they go to docs/),
    and a README that stops naming the two commands CI and users run."""
    readme = _read("README.md")
    assert len(readme.splitlines()) <= README_LINES
    assert ".venv/bin/python -m pytest -x -q -rs -n 2 --dist loadfile tests" in readme
    assert "train/train.py --config tiny_code --workdir runs/tiny && " in readme


def test_the_readme_recipe_is_the_tested_one():
    """Catches a README recipe command that drifted from the guide's block, which
    test_recipe.py runs end to end."""
    guide = commands(_read("docs/guide/your-own-model.md"))
    readme = _read("README.md")
    recipe = readme[readme.index("**A Hugging Face checkpoint.**"):]
    for command in commands(recipe[:recipe.index("## ")]):
        assert command in guide, f"README recipe command not in the guide: {command}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebooks_open_in_colab_with_their_figures(path):
    """Catches a notebook committed without outputs or figures, with an error in an output,
    or without its Colab badge and install cell."""
    with open(path, encoding="utf-8") as f:
        notebook = json.load(f)
    cells = notebook["cells"]
    name = os.path.basename(path)
    assert f"notebooks/{name}" in "".join(cells[0]["source"]) and "colab-badge" in "".join(
        cells[0]["source"])
    assert "pip" in "".join(cells[1]["source"])
    outputs = [o for c in cells if c["cell_type"] == "code" for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert all(c["execution_count"] for c in cells if c["cell_type"] == "code")


def test_every_notebook_is_executed_by_a_test():
    """Catches a notebook added without a test that runs it (its cells could rot unseen)."""
    from tests.docs.test_notebooks import ON_THE_DEFAULT_MODEL
    from tests.docs.test_notebooks_training import TRAINING_THEIR_OWN

    executed = {f"{name}.ipynb" for name in ON_THE_DEFAULT_MODEL + TRAINING_THEIR_OWN}
    assert {os.path.basename(p) for p in NOTEBOOKS} == executed >= {
        "quickstart.ipynb", "your_own_model.ipynb", "trees.ipynb", "calm.ipynb", "ssm.ipynb"}
