"""Outputs are written whole or not at all: an existing file survives a failed or interrupted
run, and an output that is also the input is refused."""

import json
import logging
import os

import pytest

from specjax.outputs import check_destinations, read_json_cache, staged, staged_dir
from tests.support.scripts import run_script

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


def test_a_replaced_output_is_a_new_file_and_a_hard_link_keeps_the_old_bytes(tmp_path):
    """A hard link to the old output keeps the OLD bytes after `staged` replaces the output:
    given directly, and given as a symbolic link (the link stays a link to the same path,
    whose file is replaced: the new bytes under the link, the old under the hard link); and
    after `staged_dir` replaces a folder holding a file of the same name. Catches an output
    written in place (truncated and rewritten, or copied over), which changes both names: a
    reader holding the old file sees it change under it. (That the link stays a link and the
    mode is kept: test_bad_inputs' test_an_output_link_stays_a_link_and_a_replaced_file_...)"""
    target, link, old = tmp_path / "out.json", tmp_path / "latest.json", tmp_path / "old.json"
    os.symlink(target, link)
    for output in (target, link):
        target.write_bytes(OLD)
        os.link(target, old)
        with staged(str(output)) as partial, open(partial, "wb") as f:
            f.write(b"new")
        assert old.read_bytes() == OLD and target.read_bytes() == b"new"
        assert not os.path.samefile(old, target)
        assert os.path.islink(link) and os.readlink(link) == str(target)
        assert link.read_bytes() == b"new"
        old.unlink()
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(OLD)
    os.link(folder / "model.safetensors", old)
    with staged_dir(str(folder)) as staging, open(os.path.join(staging, "model.safetensors"),
                                                  "wb") as f:
        f.write(b"new")
    assert old.read_bytes() == OLD and (folder / "model.safetensors").read_bytes() == b"new"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("command", [
    ["infer/generate.py", "--prompt=x", "--output={out}"],
    ["bench/bench.py", "--output_json={out}"],
    ["infer/learn_then_test.py", "--output_json={out}"],
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


@pytest.mark.parametrize("script, output", [("infer/generate.py", "--output"),
                                            ("bench/bench.py", "--output_json")])
def test_an_output_onto_its_prompts_file_is_refused(tmp_path, script, output):
    """Catches `--output` (generate) or `--output_json` (bench) equal to `--prompts_file`, or a
    link to it, destroying the prompts (bench wrote its JSON over them)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f("}\n')
    os.symlink(prompts, tmp_path / "link.jsonl")
    for target in (prompts, tmp_path / "link.jsonl"):
        result = run_script(script, f"--workdir={tmp_path / 'typo'}",
                            f"--prompts_file={prompts}", f"{output}={target}")
        assert result.returncode == 1
        assert result.stderr.strip() == (f"error: {output} {target} is --prompts_file {prompts}, "
                                         "which this run reads: write it elsewhere")
        assert prompts.read_text() == '{"prompt": "def f("}\n'


def test_outputs_onto_what_the_run_reads_or_onto_each_other_are_refused(tmp_path):
    """The probe's data losses, each caught before any work: a report over the texts it reads,
    two outputs at one path (exits' plot over its JSON), an output over a workdir's decoding
    defaults or a checkpoint file, and an export replacing the workdir it reads or a folder
    holding it; and (the fourth probe) a file output that is a folder blamed on the workdir
    inside it instead."""
    workdir, texts = tmp_path / "w", tmp_path / "texts.jsonl"
    (workdir / "checkpoints" / "300").mkdir(parents=True)
    texts.write_text("x")
    reads = {"--workdir": str(workdir), "--texts_file": str(texts)}
    refused = {
        ("--output_json", str(texts)): "is --texts_file",
        ("--output", str(workdir / "calibrated_decoding.json")): "would overwrite a file of",
        ("--output", str(workdir / "checkpoints" / "300" / "meta")): "would overwrite a file of",
        ("--hf_dir", str(workdir)): "is --workdir",
        ("--hf_dir", str(tmp_path)): "holds --workdir",
    }
    for (flag, path), message in refused.items():
        with pytest.raises(ValueError, match=f"^{flag} {path} {message}"):
            check_destinations({flag: path}, reads, folders=flag == "--hf_dir")
    # A file output naming a folder (one that holds the workdir, too) says so first.
    with pytest.raises(ValueError, match=f"^--output {tmp_path} is a directory: give a file"):
        check_destinations({"--output": str(tmp_path)}, reads)
    with pytest.raises(ValueError, match="^--output_json and --plot name one file"):
        check_destinations({"--output_json": str(tmp_path / "r"), "--plot": str(tmp_path / "r")},
                           reads)
    check_destinations({"--output_json": str(workdir / "report.json"),  # beside its own files
                        "--plot": str(tmp_path / "r.png")}, reads)


def test_outputs_that_only_share_a_name_prefix_with_an_input_are_written(tmp_path):
    """Catches the containment checks comparing strings instead of paths: an output folder
    `w` is refused over an input `w2/...` it does not hold, and `w/checkpoints_old.json` over
    the workdir's `checkpoints` (both only share a string prefix)."""
    workdir, texts = tmp_path / "w", tmp_path / "w2" / "texts.jsonl"
    (workdir / "checkpoints").mkdir(parents=True)
    texts.parent.mkdir()
    texts.write_text("x")
    check_destinations({"--hf_dir": str(workdir)}, {"--texts_file": str(texts)}, folders=True)
    check_destinations({"--output_json": str(workdir / "checkpoints_old.json"),
                        "--plot": str(texts) + ".png"},
                       {"--workdir": str(workdir), "--texts_file": str(texts)})


def test_an_interrupted_run_never_replaces_an_earlier_partial(tmp_path):
    """Catches a second interrupted run overwriting the rows an earlier one kept."""
    target = str(tmp_path / "out.jsonl")
    for rows in ("first\n", "second\n"):
        with pytest.raises(KeyboardInterrupt), staged(target, keep_interrupted=True) as partial:
            with open(partial, "w") as f:
                f.write(rows)
            raise KeyboardInterrupt
    assert (tmp_path / "out.jsonl.partial").read_text() == "first\n"
    assert (tmp_path / "out.jsonl.partial.2").read_text() == "second\n"


def test_an_interrupt_before_any_write_keeps_no_partial(tmp_path):
    """Ctrl-C inside `staged(path, keep_interrupted=True)` before anything is written leaves
    the folder as it was: no empty ".partial" beside it, no output, and an existing output
    untouched. Catches the interrupted block's empty temporary file kept as ".partial" (a
    reader would take it for rows that were kept)."""
    target = tmp_path / "out.jsonl"
    with pytest.raises(KeyboardInterrupt), staged(str(target), keep_interrupted=True):
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []
    target.write_bytes(OLD)
    with pytest.raises(KeyboardInterrupt), staged(str(target), keep_interrupted=True) as partial:
        open(partial, "w").close()
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["out.jsonl"] and target.read_bytes() == OLD


def test_a_cache_entry_missing_a_field_is_measured_again(tmp_path, caplog):
    """A cache file whose entries fail its check with a KeyError (a tree plan without
    "expected_tau", as an older version wrote it) or a TypeError (a plan that is a list) is
    treated as absent, {} with a warning naming the file, as a truncated one is. Catches those
    errors no longer caught: the tree search's `tree="auto"` raised instead of measuring the
    plan again."""
    from specjax.decoding.shapes.static_tree import StaticTree
    from specjax.tools.tree_search import TreePlan

    def check(plans):
        return [TreePlan.from_dict(plan) for plan in plans.values()]

    good = TreePlan(StaticTree.from_branching((2, 1)), 2.5, 1.5, (0.5, 0.25)).to_dict()
    missing = {key: value for key, value in good.items() if key != "expected_tau"}
    path = tmp_path / "tree_plans.json"
    path.write_text(json.dumps({"a": good}))
    assert read_json_cache(str(path), check) == {"a": good}
    for entries in ({"a": good, "b": missing}, {"a": list(good.values())}):
        path.write_text(json.dumps(entries))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="absl"):
            assert read_json_cache(str(path), check) == {}
        assert [r.getMessage().split(" (")[0] for r in caplog.records] == [f"ignoring {path}, "
                                                                          "which cannot be read"]


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



@pytest.mark.parametrize("text, problem", [(b"{oops", "is not readable JSON (Expecting"),
                                           (b"[1]", "holds no JSON object"),
                                           (b"\xff", "is not readable JSON ('utf-8' codec")])
def test_every_json_file_reader_names_the_file_the_same_way(tmp_path, text, problem):
    """A broken, non-object or non-UTF-8 JSON file is "path is not readable JSON (why)" or
    "path holds no JSON object" from the tokenizer's, the HF import's and the calibration's
    readers (`outputs.read_json_object`), and `read_json_cache` ignores it. Catches a reader of
    its own coming back with other words (the calibration said "is unreadable", the import
    "is not valid JSON") or a traceback for bytes that are not UTF-8 (the calibration's
    reader caught only JSON errors)."""
    from specjax.convert.hf_config import read_config_json
    from specjax.io.calibrated_defaults import FILE, read_calibrated
    from specjax.tokenizer import _json_beside

    folder = str(tmp_path)
    readers = {"config.json": lambda: read_config_json(folder, "a checkpoint"),
               "generation_config.json": lambda: _json_beside(folder, "generation_config.json"),
               FILE: lambda: read_calibrated(folder)}
    for name, read in readers.items():
        (tmp_path / name).write_bytes(text)
        with pytest.raises(Exception) as caught:
            read()
        assert str(caught.value).startswith(f"{tmp_path / name} {problem}"), caught.value
        assert read_json_cache(str(tmp_path / name)) == {}
