"""Runs entry-point scripts as a user would, each in its own process, without paying for Python
and JAX's start-up (about 2.3 s) each time: this process imports what the scripts import (no
device is touched, no backend starts), then forks one child per command, which runs the
script as `__main__` with the command's argv, environment and working directory, and ends as
the interpreter would (its threads joined, then its exit handlers). What a fork cannot show,
the scripts' own imports in a fresh interpreter, `tests/cli/test_entrypoint.py` checks.

    python -m tests.support.script_runner PLAN.json
        the documented commands of one document, in order (PLAN: {"cwd": dir, "commands":
        [[script, arg...]]}); prints one JSON line: per command its exit status, seconds and
        output's tail; stops at the first that fails (tests/docs/test_doc_commands.py).
    python -m tests.support.script_runner --serve
        one JSON request a line on stdin, one JSON reply a line on stdout
        (`tests.support.scripts.run_script`).
"""

import atexit
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback

import jax  # noqa: F401  (imported once here, for every child; no backend starts)

import specjax.api  # noqa: F401
import specjax.training.trainer  # noqa: F401
from tests.support import ROOT

TAIL = 3000


def _run_as_main(path: str, args: list[str]) -> int:
    """The script's exit status as the interpreter would give it."""
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(path)
    try:
        runpy.run_path(path, run_name="__main__")
        return 0
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        print(done.code, file=sys.stderr)  # sys.exit("message"): printed, status 1
        return 1
    except BaseException:  # noqa: BLE001  (an uncaught error: its traceback, status 1)
        traceback.print_exc()
        return 1


def run_one(script: str, args: list[str], cwd: str, stdout: str, stderr: str | None = None,
            env: dict[str, str] | None = None, timeout: float = 0) -> int:
    """`script args` in a forked child with stdin empty and environment `env` (None: this
    process's), its output in the files `stdout` and `stderr` (None: both in `stdout`); the
    child's exit status (-SIGALRM once `timeout` seconds pass)."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115  (the child's, to its end)
            out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if stderr else out, 2)
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            os.chdir(cwd)
            if timeout:
                signal.alarm(int(timeout))
            status = _run_as_main(os.path.join(ROOT, script), args)
            for thread in threading.enumerate():  # what the interpreter waits for at exit
                if thread is not threading.current_thread() and not thread.daemon:
                    thread.join()
            atexit._run_exitfuncs()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(status & 0xFF)  # as the C exit() truncates it
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def run_plan(plan_path: str) -> None:
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


def serve() -> None:
    """Runs each request ({script, args, cwd, stdout, stderr, env, timeout}) as it comes."""
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps({"status": run_one(**request)}), flush=True)


if __name__ == "__main__":
    serve() if sys.argv[1] == "--serve" else run_plan(sys.argv[1])
