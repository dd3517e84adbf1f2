"""Scripts and the documented commands run as a user runs them, through one forking runner per
test process (`script_runner --serve`)."""

import json
import os
import signal
import subprocess
import sys
import tempfile

from tests.support import ROOT


def script_env(**extra: str) -> dict[str, str]:
    """The environment a script runs in from the tests: this one, the package importable."""
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


# Variables a process reads only as it starts (Python's, JAX's and huggingface_hub's at import,
# the C libraries'): a script run whose environment differs from the server's in one of them
# gets a fresh interpreter.
STARTUP_VARIABLES = ("JAX_", "PYTHON", "TMPDIR", "LANG", "LC_", "OMP_", "OPENBLAS_", "HF_")


class _ScriptServer:
    """This test process's `tests.support.script_runner --serve`, started at the first script
    run."""

    process: subprocess.Popen | None = None
    env: dict[str, str] = {}

    @classmethod
    def startup_differs(cls, env: dict[str, str]) -> bool:
        """Whether `env` changes a start-up variable of the server (or of a server to come)."""
        started = cls.env if cls.process is not None else script_env()
        return any(env.get(name) != started.get(name) for name in {*env, *started}
                   if name.startswith(STARTUP_VARIABLES))

    @classmethod
    def run(cls, request: dict) -> int:
        if cls.process is None or cls.process.poll() is not None:
            cls.env = script_env()
            cls.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.script_runner", "--serve"], cwd=ROOT,
                env=cls.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            cls.process.stdin.write(json.dumps(request) + "\n")
            cls.process.stdin.flush()
            reply = cls.process.stdout.readline()
            if not reply:
                raise RuntimeError(f"the script server stopped (status {cls.process.wait()})")
            return json.loads(reply)["status"]
        except BaseException:  # an interrupted request leaves no reply behind for the next
            cls.process.kill()
            cls.process.wait()
            cls.process = None
            raise


def run_script(script: str, *args: str, env: dict[str, str] | None = None,
               cwd: str | os.PathLike | None = None, timeout: int = 300,
               fresh: bool = False) -> subprocess.CompletedProcess:
    """`python <script> args` as a user runs it (`script` relative to the repository, e.g.
    "infer/generate.py") in `cwd` (default: this one), output captured as text, in this
    process's environment with `env`'s variables added. The process is forked from one that
    has imported JAX and specjax already (`tests.support.script_runner`), which saves their
    start-up; `fresh`, or a changed start-up variable (STARTUP_VARIABLES), gets a new
    interpreter."""
    command = [sys.executable, os.path.join(ROOT, script), *args]
    full_env = script_env(**(env or {}))
    if fresh or _ScriptServer.startup_differs(full_env):
        return subprocess.run(command, env=full_env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        status = _ScriptServer.run(dict(script=script, args=list(args),
                                        cwd=str(cwd or os.getcwd()), stdout=out, stderr=err,
                                        env=full_env, timeout=timeout))
        if status == -signal.SIGALRM:
            raise subprocess.TimeoutExpired(command, timeout)
        with open(out, encoding="utf-8", errors="replace") as f_out, \
                open(err, encoding="utf-8", errors="replace") as f_err:
            return subprocess.CompletedProcess(command, status, f_out.read(), f_err.read())


def with_default_sigint(command: list[str]) -> list[str]:
    """`command` run with SIGINT at its default and unblocked, as a shell starts it, whatever
    the test runner's worker left (a worker that ignores or blocks SIGINT hands that on to its
    children, whose Ctrl-C is then lost)."""
    clean = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
             "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
             "os.execv(sys.argv[1], sys.argv[1:])")
    return [sys.executable, "-c", clean, *command]


def reader_files(folder) -> None:
    """The files a reader brings to the documented commands: `corpus.jsonl` (text to train
    on) and `prompts.jsonl` (prompts to complete), in `folder`."""
    with open(os.path.join(folder, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n" * 8}) + "\n")
    with open(os.path.join(folder, "prompts.jsonl"), "w", encoding="utf-8") as f:
        f.write(json.dumps({"prompt": "def f("}) + "\n")


def check_import_refusals(tmp_path, base: str, cases) -> None:
    """Each (folder under tmp_path, message) imported as a drafter on `base` with
    tools/convert.py: one line holding the message, status 1, no workdir left."""
    for folder, message in cases:
        result = run_script("tools/convert.py", "--hf_dir", str(tmp_path / folder),
                            "--base_workdir", base, "--workdir", str(tmp_path / f"w_{folder}"))
        assert result.returncode == 1 and message in result.stderr, result.stderr[-2000:]
        assert not (tmp_path / f"w_{folder}").exists()
