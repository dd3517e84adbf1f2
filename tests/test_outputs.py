"""Outputs are written whole or not at all: an existing file survives a failed or interrupted
run, and an output that is also the input is refused."""

import os

import pytest

from specjax.outputs import staged
from tests.conftest import run_script

OLD = b'{"kept": "the previous run\'s results"}\n'


def test_an_interrupted_or_failed_block_leaves_the_old_file_and_no_partial(tmp_path):
    """Catches a helper that truncates the target before the work, renames a half-written file
    into place, or leaves its temporary file behind."""
    target = tmp_path / "out.json"
    for error in (KeyboardInterrupt, ValueError):
        target.write_bytes(OLD)
        with pytest.raises(error), staged(str(target)) as partial:
            with open(partial, "w") as f:
                f.write("half")
            raise error
        assert target.read_bytes() == OLD and os.listdir(tmp_path) == ["out.json"]
    with staged(str(target)) as partial:
        with open(partial, "w") as f:
            f.write("new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["out.json"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("command", [
    ["infer/generate.py", "--prompt=x", "--output={out}"],
    ["infer/bench.py", "--output_json={out}"],
    ["infer/calibrate.py", "--output_json={out}"],
])
def test_a_failed_run_leaves_an_existing_output_untouched(tmp_path, command):
    """Catches an entry point that empties its output at start-up (the bug: a mistyped
    workdir left the previous results at 0 bytes)."""
    out = tmp_path / "results.json"
    out.write_bytes(OLD)
    args = [arg.format(out=out) for arg in command]
    result = run_script(*args, f"--workdir={tmp_path / 'typo'}")
    assert result.returncode == 1 and result.stderr.startswith("error:"), result.stderr
    assert out.read_bytes() == OLD and os.listdir(tmp_path) == ["results.json"]


def test_generate_refuses_to_write_over_its_prompts_file(tmp_path):
    """Catches `--output` equal to `--prompts_file` destroying the prompts."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f("}\n')
    result = run_script("infer/generate.py", f"--workdir={tmp_path / 'typo'}",
                  f"--prompts_file={prompts}", f"--output={prompts}")
    assert result.returncode == 1
    assert result.stderr.strip() == (f"error: --output {prompts} is the prompts file: write the "
                                     "completions elsewhere")
    assert prompts.read_text() == '{"prompt": "def f("}\n'



def test_a_staged_folder_replaces_whole_with_normal_permissions(tmp_path, monkeypatch):
    """Catches a folder output kept at mkdtemp's 0700 with 0600 files (an export others could
    not read), a replacement that mixes old and new files, and the current directory replaced
    (`convert.py --to_hf --hf_dir . --overwrite` left a stray folder and a traceback)."""
    from specjax.outputs import staged_dir

    target = tmp_path / "export"
    target.mkdir()
    (target / "old.bin").write_bytes(b"old")
    with staged_dir(str(target)) as staging:
        os.makedirs(os.path.join(staging, "sub"))
        for name in ("model.safetensors", "sub/x.json"):
            fd = os.open(os.path.join(staging, name), os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
    assert sorted(os.listdir(target)) == ["model.safetensors", "sub"]
    assert sorted(os.listdir(tmp_path)) == ["export"]
    mask = _umask()
    assert target.stat().st_mode & 0o777 == 0o777 & ~mask
    assert (target / "sub" / "x.json").stat().st_mode & 0o777 == 0o666 & ~mask
    monkeypatch.chdir(target)
    with pytest.raises(ValueError, match="holds the current directory"), staged_dir("."):
        pass
    assert sorted(os.listdir(tmp_path)) == ["export"]
