"""Runs a documented sequence of entry-point commands as a user would, each in its own process,
without paying for Python and JAX's start-up each time: this process imports what the scripts
import (no device is touched), then forks one child per command, which runs the script as
`__main__` with the command's argv. Used by tests/test_doc_commands.py.

    python -m tests.doc_runner PLAN.json   (PLAN: {"cwd": dir, "commands": [[script, arg...]]})

Prints one JSON line: per command its exit status, seconds and output's tail; it stops at the
first command that fails."""

import json
import os
import runpy
import sys
import time

import jax  # noqa: F401  (imported once here, for every child; no backend starts)

import specjax.api  # noqa: F401
import specjax.training.trainer  # noqa: F401
from tests.conftest import ROOT

TAIL = 3000


def run_one(script: str, args: list[str], cwd: str, log: str) -> int:
    """`script args` in a forked child, its output in `log`; the child's exit status."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.chdir(cwd)
            path = os.path.join(ROOT, script)
            sys.argv = [path, *args]
            sys.path[0] = os.path.dirname(path)
            try:
                runpy.run_path(path, run_name="__main__")
                status = 0
            except SystemExit as done:
                status = done.code if isinstance(done.code, int) else (done.code is not None)
        except BaseException:  # noqa: BLE001  (reported through the log and the status)
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def main(plan_path: str) -> None:
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    results = []
    for i, (script, *args) in enumerate(plan["commands"]):
        log = os.path.join(plan["cwd"], f".command{i}.log")
        start = time.perf_counter()
        status = run_one(script, args, plan["cwd"], log)
        with open(log, encoding="utf-8", errors="replace") as f:
            output = f.read()
        results.append({"command": [script, *args], "status": status,
                        "seconds": time.perf_counter() - start, "output": output[-TAIL:]})
        if status != 0:
            break
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
