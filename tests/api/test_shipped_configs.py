"""The shipped configs are package data, named from any folder ("tiny_code:smoke"), by the API
and by every script's --config, in a checkout and in an installed package; a config file's
path still works."""

import os
import subprocess
import sys

import pytest

from specjax.api import read_config
from specjax.config import SHIPPED_CONFIGS, config_file, load_config_file, shipped_configs
from tests.support import ROOT
from tests.support.scripts import run_script, script_env


def test_each_shipped_config_is_found_by_name_from_any_folder(tmp_path, monkeypatch):
    """Catches a name looked up relative to the current folder (a notebook or script run
    outside a clone failed with "no such file") and a shipped config left out of the names."""
    monkeypatch.chdir(tmp_path)
    assert shipped_configs() == ["calm", "eagle", "kangaroo", "medusa", "mtp", "specdec",
                                 "tiny_code"]
    for name in shipped_configs():
        assert read_config(name) == read_config(os.path.join(SHIPPED_CONFIGS, f"{name}.py"))
    assert read_config("tiny_code:smoke")["model"]["num_layers"] == 4


def test_a_config_files_path_still_works_and_an_unknown_name_is_one_line(tmp_path,
                                                                        monkeypatch):
    """Catches a path taken for a name (a user's own config, or a local file named like a
    shipped one, no longer loading) and an unknown name failing without saying what exists."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("def get_config(variant='a'):\n"
                                      "    return {'train': {'seed': len(variant)}}\n")
    assert read_config("mine.py:abc") == {"train": {"seed": 3}}
    (tmp_path / "tiny_code").write_text("def get_config():\n    return {'own': {}}\n")
    assert config_file("tiny_code") == "tiny_code" and read_config("tiny_code") == {"own": {}}
    with pytest.raises(ValueError) as caught:
        read_config("tiny_cod:smoke")
    assert str(caught.value) == ("config file tiny_cod: no such file or shipped config "
                                 f"(shipped: {', '.join(shipped_configs())})")


def test_every_scripts_config_flag_takes_a_shipped_name_from_any_folder(tmp_path):
    """Catches a script whose --config (or its default, tree_scan_bench's tiny_code:mamba2)
    reads only a path: config_flags would look for ./tiny_code and report the load failure
    instead of the mistyped field, which only a loaded config can name."""
    cases = [("train/train.py", ["--config", "tiny_code:smoke", "--workdir", "w"]),
             ("bench/tree_scan_bench.py", [])]
    for script, args in cases:
        result = run_script(script, *args, "--config.train.totl_steps=3", cwd=tmp_path)
        assert result.returncode == 1, result.stderr[-2000:]
        assert 'Did you mean "total_steps"' in result.stderr, result.stderr[-2000:]


def test_an_installed_package_holds_its_configs(tmp_path):
    """Catches configs missing from a non-editable install (a folder that is not a package,
    or a package-data pattern that leaves them out): the package is built as pip would copy
    it and imported from there, in another folder."""
    build = tmp_path / "build"
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(build)], cwd=ROOT,
                   check=True, capture_output=True)
    code = ("from specjax.config import config_file, load_config_file\n"
            "print(config_file('eagle'))\n"
            "print(load_config_file('tiny_code:smoke').model.num_layers)")
    env = {**script_env(), "PYTHONPATH": str(build)}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [str(build / "specjax" / "configs" / "eagle.py"), "4"]


def test_the_gpu_configs_micro_step_fits_an_h200():
    """Catches smollm2_gpu's grad_accum dropped back to 1: its three 49,152-way exits'
    temporaries, measured at 159.6 GiB for a step of 32 x 1,024 tokens, scale with the tokens
    of one micro-step, which must stay under the 139 GiB an H200 holds."""
    config = load_config_file("tiny_code:smollm2_gpu")
    tokens = config.train.batch_size // config.train.grad_accum * config.data.seq_len
    assert config.train.batch_size % config.train.grad_accum == 0
    assert tokens * 159.6 / (32 * 1024) < 139
