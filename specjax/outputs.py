"""Outputs written whole or not at all: a temporary file (or folder) beside the target, created
before any work (a bad path fails at once) and renamed onto it when complete, with the mode of
the file it replaces or the permissions the user's umask gives a new one (the temporary's own
0600/0700 never stay); a target that is a symbolic link keeps pointing at the new output."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from absl import logging

# What a workdir holds that a run reads (checkpoints, decoding defaults, caches, tokenizer,
# logs, the lock): an output written over one of them would break the workdir.
WORKDIR_FILES = ("checkpoints", "calibrated_decoding.json", "draft_vocab.json", "tree_plans.json",
                 "tokenizer.json", "tokenizer_config.json", "metrics.jsonl", ".lock")


def check_destinations(outputs: Mapping[str, str | None],
                       inputs: Mapping[str, str | Sequence[str] | None],
                       folders: bool = False) -> None:
    """One-line errors, before any work, for outputs that would destroy what the run reads or
    each other: an output that is an input file (a link to it too), one that would replace an
    input folder or a folder holding it, one onto a workdir's own files (`WORKDIR_FILES`), and
    two outputs at one path; and, unless the outputs are `folders`, an output that is a folder.
    Keys are the flags, for the message."""
    sources = [(flag, path, os.path.realpath(path)) for flag, paths in inputs.items() if paths
               for path in ([paths] if isinstance(paths, str) else paths)]
    seen: dict[str, str] = {}
    for flag, path in outputs.items():
        if not path:
            continue
        if not folders and os.path.isdir(path):
            raise ValueError(f"{flag} {path} is a directory: give a file name")
        out = os.path.realpath(path)
        if out in seen:
            raise ValueError(f"{seen[out]} and {flag} name one file ({path}): give each its own")
        seen[out] = flag
        for source_flag, source, real in sources:
            if out == real or real.startswith(out + os.sep):
                raise ValueError(f"{flag} {path} {'is' if out == real else 'holds'} "
                                 f"{source_flag} {source}, which this run reads: write it "
                                 "elsewhere")
            owned = [os.path.join(real, name) for name in WORKDIR_FILES]
            if os.path.isdir(real) and any(out == own or out.startswith(own + os.sep)
                                           for own in owned):
                raise ValueError(f"{flag} {path} would overwrite a file of {source_flag} "
                                 f"{source}, which this run reads: write it elsewhere")


def check_writable(folder: str, what: str) -> None:
    """A one-line error, before any work, when `folder` (or, while it is still to be made, its
    nearest existing parent) cannot take a new file: a file in the way, a read-only place.
    `what` names the output for the message ("--workdir runs/x")."""
    existing = os.path.abspath(folder)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    os.unlink(_temporary_in(existing, ".check", what))


@contextlib.contextmanager
def staged(path: str | None, *, keep_interrupted: bool = False) -> Iterator[str | None]:
    """A temporary file beside `path`, created before any work (a bad path fails at once) and
    renamed onto `path` when the block completes; on failure it is removed and an existing
    `path` is left as it was. None for no path. A `path` that is a symbolic link stays one:
    the file it points to is replaced; a replaced file keeps its mode. `keep_interrupted`: a
    block stopped by Ctrl-C keeps what it wrote as `path` + ".partial" (or ".partial.2"...
    beside an earlier one: rows streamed as they finish, so nothing done is lost, and nothing
    incomplete takes the output's name)."""
    if path is None:
        yield None
        return
    if os.path.isdir(path):
        raise ValueError(f"cannot write {path}: is a directory")
    target = os.path.realpath(path)
    directory, name = os.path.split(target)
    partial = _temporary_in(directory, f".{name}.", path)
    if os.path.exists(target):
        os.chmod(partial, os.stat(target).st_mode & 0o7777)
    else:
        _normal_permissions(partial)
    try:
        yield partial
        os.replace(partial, target)
    except KeyboardInterrupt:
        if keep_interrupted and os.path.getsize(partial):
            kept = _free_name(path + ".partial")
            os.replace(partial, kept)
            print(f"kept what was written in {kept}", file=sys.stderr)
        raise
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


@contextlib.contextmanager
def staged_dir(path: str) -> Iterator[str]:
    """A new folder beside `path` for the block to fill, renamed onto `path` when it completes
    (an existing `path` is replaced whole: never a mix of old and new files; a symbolic link
    keeps pointing at it); on failure it is removed and `path` is left as it was."""
    full = os.path.realpath(path)
    if full == os.getcwd() or os.getcwd().startswith(full + os.sep):
        raise ValueError(f"cannot replace {path}: it holds the current directory")
    parent = os.path.dirname(full)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(full)}.", dir=parent)
    except OSError as error:
        raise ValueError(f"cannot write {path}: {error.strerror}") from None
    try:
        yield staging
        _normal_permissions(staging)
        if os.path.isdir(full):
            old = tempfile.mkdtemp(prefix=".replaced-", dir=parent)
            os.replace(full, os.path.join(old, "previous"))
            os.replace(staging, full)
            shutil.rmtree(old)
        else:
            os.replace(staging, full)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def read_json_object(path: str) -> dict:
    """The JSON object in the file `path`; a one-line ValueError naming it when it cannot be
    read, is not JSON, or holds another JSON value."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as error:  # UnicodeDecodeError and JSONDecodeError included
        raise ValueError(f"{path} is not readable JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds no JSON object")
    return value


def read_json_cache(path: str, check: Callable[[dict], Any] = lambda entries: None) -> dict:
    """The JSON object cached in `path` ({} when there is none). A file that cannot be read or
    fails `check` (truncated by an interrupted write of an older version, edited by hand) is
    named and ignored with a warning: its entries are measured again."""
    if not os.path.exists(path):
        return {}
    try:
        entries = read_json_object(path)
        check(entries)
        return entries
    except (OSError, ValueError, KeyError, TypeError) as error:
        logging.warning("ignoring %s, which cannot be read (%s): its entries are measured again",
                        path, str(error).splitlines()[0] if str(error) else type(error).__name__)
        return {}


def write_json_cache(path: str, entries: dict) -> None:
    """`entries` written whole over `path` (`staged`); a failure is a warning, since a cache
    only saves measuring again."""
    try:
        with staged(path) as partial, open(partial, "w", encoding="utf-8") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
    except (OSError, ValueError) as error:
        logging.warning("could not save %s: %s", path, error)


def _temporary_in(directory: str, prefix: str, what: str) -> str:
    """A new empty file in `directory` (a ".partial" suffix); a one-line error naming `what`
    when it cannot be made there."""
    try:
        handle, partial = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=".partial")
    except OSError as error:
        raise ValueError(f"cannot write {what}: {error.strerror}") from None
    os.close(handle)
    return partial


def _free_name(path: str) -> str:
    """`path`, or `path`.2, .3 ... when it exists (an earlier interrupted run's rows stay)."""
    candidate, number = path, 1
    while os.path.exists(candidate):
        number += 1
        candidate = f"{path}.{number}"
    return candidate


def _normal_permissions(path: str) -> None:
    """The mode a new file (or folder, and everything in it) gets from the user's umask."""
    umask = os.umask(0)
    os.umask(umask)
    if not os.path.isdir(path):
        os.chmod(path, 0o666 & ~umask)
        return
    os.chmod(path, 0o777 & ~umask)
    for root, folders, files in os.walk(path):
        for name in folders:
            os.chmod(os.path.join(root, name), 0o777 & ~umask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~umask)
