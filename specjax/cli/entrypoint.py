"""What every command-line entry point shares: user errors end as one line, not a traceback.

A flag or config error (a missing or broken config file included) is one `error: ...` line and
exit status 1; Ctrl-C outside training exits 130 with one line (training saves first: its
statuses are `train/train.py`'s)."""

import gc
import os
import re
import signal
import sys
import threading
import types
from collections.abc import Callable
from typing import Any, TypeVar

from absl import flags, logging
from ml_collections import config_flags
from ml_collections.config_flags.config_flags import ConfigFileFlagParser, is_config_flag

from specjax.cli import early_interrupt
from specjax.config import config_file, load_config_file
from specjax.errors import SpecjaxError

T = TypeVar("T")


USER_ERRORS = (SpecjaxError, ValueError, FileNotFoundError)
HELP_FLAGS = ("help", "h", "?", "helpshort", "helpfull", "helpxml")


def run_cli(body: Callable[[], T], verbosity: int = logging.WARNING) -> T:
    """Runs an entry point's body; a user error is printed as `error: ...` and exits with 1.

    Ctrl-C or SIGTERM outside a training loop (which saves first, see `training.interrupt`)
    ends the process at once with status 130 and one line: nothing is written half-way there, and a
    normal interpreter exit while JAX's threads are still starting can crash."""
    logging.set_verbosity(verbosity)
    if threading.current_thread() is threading.main_thread():
        for signum, default in early_interrupt.DEFAULTS:
            if signal.getsignal(signum) in (default, early_interrupt.exit_now):
                signal.signal(signum, interrupt)
    try:
        return body()
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        early_interrupt.exit_interrupted()


def interrupt(signum: int, frame: types.FrameType | None) -> None:
    """Ctrl-C or SIGTERM as a KeyboardInterrupt (outputs then keep what is finished and leave
    no temporary file), except inside a garbage-collection callback (JAX runs one), where
    Python would print and swallow it and the run would go on to write its outputs: there it
    is delivered again a moment later."""
    callbacks = {callback.__code__ for callback in gc.callbacks
                 if hasattr(callback, "__code__")}
    while frame is not None:
        if frame.f_code in callbacks:
            threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
            return
        frame = frame.f_back
    raise KeyboardInterrupt


class _ConfigParser(ConfigFileFlagParser):
    """config_flags' parser of `--config`, which also takes a shipped config's name
    ("tiny_code:smoke", `config.config_file`)."""

    def parse(self, path: str) -> Any:
        return super().parse(config_file(path))


def define_config(default: str | None, help_string: str) -> flags.FlagHolder:
    """The `--config` flag (config_flags' file flag with its `--config.x.y=v` overrides) taking
    a shipped config's name ("tiny_code:smoke") from any folder, or a config file's path."""
    holder = config_flags.DEFINE_config_file("config", None, help_string)
    flags.FLAGS["config"].parser = _ConfigParser("config")
    if default is not None:  # parsed by the parser above
        flags.FLAGS.set_default("config", default)
    return holder


def refuse_flags(names: tuple[str, ...], applies_to: str) -> None:
    """A one-line error for the first of these flags given on the command line: only
    `applies_to` reads it, so the run would ignore it."""
    for name in names:
        if flags.FLAGS[name].present:
            raise ValueError(f"--{name} applies to {applies_to} only")


def parse_flags(argv: list[str]) -> list[str]:
    """`app.run`'s flags parser: a bad flag or config file (a missing file, a mistyped
    `--config.x` field, an error inside the file) is one `error: ...` line, exit status 1;
    `--help` prints the usage and exits 0 (absl's own exits 1)."""
    try:
        args = flags.FLAGS(argv)
        for name in list(flags.FLAGS):
            flag = flags.FLAGS[name]
            if is_config_flag(flag) and (flag.present or flag.value is not None):
                flag.value.keys()  # config_flags defers a file's load error to first use (and
                # takes a get_config() that returns None)
        return args
    except SystemExit:  # absl's help flags print the usage, then exit with status 1
        if any(arg.lstrip("-") in HELP_FLAGS for arg in argv[1:]):
            sys.exit(0)
        raise
    except Exception as error:  # config_flags raises whatever loading the file raised
        message = (_config_file_problem(argv) or _unknown_field(error, argv)
                   or _plain(_one_line(error)))
        print(f"error: {message}", file=sys.stderr)
        sys.exit(1)


def _config_file_problem(argv: list[str]) -> str | None:
    """What is wrong with a config flag's file itself (`config.load_config_file`: not Python,
    no get_config(), no config returned...), None when each loads: config_flags' own
    wordings of these name an internal module ("module 'config_config' has no attribute")."""
    for name in list(flags.FLAGS):
        path = _flag_argument(name, argv) if is_config_flag(flags.FLAGS[name]) else None
        if path:
            try:
                load_config_file(path, f"--{name}")
            except ValueError as problem:
                return str(problem)
    return None


def _flag_argument(name: str, argv: list[str]) -> str | None:
    """The value of `--name=V` or `--name V` in `argv` (the last one given)."""
    value = None
    for index, arg in enumerate(argv[1:], 1):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and index + 1 < len(argv):
            value = argv[index + 1]
    return value


def _unknown_field(error: Exception, argv: list[str]) -> str | None:
    """config_flags reports an override of a field the file lacks as a KeyError (of a missing
    section) or an AttributeError wrapping one (of a missing field), naming only the last
    part; the message names the whole flag."""
    cause = error.args[0] if error.args and isinstance(error, AttributeError) else error
    name = str(cause.args[0]).strip("'") if isinstance(cause, KeyError) and cause.args else ""
    if not name.isidentifier():  # not a bare name; config_flags' "Did you mean" is kept
        return None
    overrides = [arg.split("=", 1)[0] for arg in argv[1:] if arg.startswith("--config.")]
    flag = next((arg for arg in overrides if name in arg.split(".")[1:]), "")
    where = f" ({flag})" if flag else ""
    return (f"the config file has no field or section {name!r}{where} to override (--help "
            "lists the fields; a section the file lacks must be added to it first)")


# config_flags' and Python's wordings of a bad config flag, and ours.
_PLAIN = (
    (re.compile(r".*Failed loading config file \S+: \[Errno 2\] No such file or directory: "
                r"'(.*)'"), r"--config \1: no such file"),
    (re.compile(r"flag --config=(\S+): Error whilst parsing config file:+ \w+: (.*)"),
     r"--config \1: \2"),
    (re.compile(r"flag (--\S+?)=(.*): invalid literal for int\(\) with base 10: .*"),
     r"\1=\2: expected a whole number"),
    (re.compile(r"flag (--\S+?)=(.*): could not convert string to float: .*"),
     r"\1=\2: expected a number"),
)


def _plain(message: str) -> str:
    """`message` in the user's terms where it is one of `_PLAIN`'s wordings."""
    for pattern, replacement in _PLAIN:
        if pattern.fullmatch(message):
            return pattern.sub(replacement, message)
    return message


def _one_line(error: Exception) -> str:
    """A possibly multi-line message (with an embedded traceback) as its first and last line."""
    text = str(error).replace("\\n", "\n").replace("\\'", "'")
    if len(text) > 1 and text[0] == text[-1] == "'":  # a KeyError-style repr
        text = text[1:-1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if len(lines) == 1 else f"{lines[0]}: {lines[-1]}"
