"""The registry: drafters are discovered from their own files, their options joined into the
one DecodingConfig (flags, config fields, sweep axes), and each builder sees only what it
declares."""

import dataclasses
import importlib
import os
import re
import sys
import textwrap

import pytest

from specjax.cli.decoding import DECODING_FLAGS
from specjax.decoding import registry
from specjax.decoding.drafter import Strategy
from specjax.decoding.options import join_options, option
from specjax.decoding.registry import STRATEGIES, DecodingConfig, make_strategy
from tests.support import ROOT

DRAFTER_FILE = '''
import dataclasses
from specjax.decoding.drafters.autoregressive import Autoregressive
from specjax.decoding.drafter import Strategy
from specjax.decoding.options import option

@dataclasses.dataclass(frozen=True)
class EchoOptions:
    echo_width: int = option(2, "Strategy echo: how wide.")

STRATEGIES = {"echo": Strategy(lambda options: (Autoregressive(), options.echo_width),
                               (EchoOptions,))}
'''


def test_a_drafter_is_one_file(tmp_path, monkeypatch):
    """Catches a registry that needs a list edited beside a new drafter's file: a package with
    one module is discovered, its options join a config with its own field, and the package's
    own registry is exactly what discovery finds (no hand-written list beside it)."""
    assert registry.STRATEGIES == registry.discover()
    package = tmp_path / "my_drafters"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "echo.py").write_text(textwrap.dedent(DRAFTER_FILE))
    monkeypatch.syspath_prepend(str(tmp_path))
    found = registry.discover(importlib.import_module("my_drafters"))
    assert list(found) == ["echo"]
    config = join_options(group for strategy in found.values() for group in strategy.options)
    assert config().echo_width == 2
    drafter, width = found["echo"].build(config(echo_width=5))
    assert width == 5 and drafter.name == "ar"
    sys.modules.pop("my_drafters.echo", None)
    sys.modules.pop("my_drafters", None)


def test_two_groups_cannot_declare_one_option():
    """Catches two drafters declaring the same flag with different meanings: the second would
    silently shadow the first."""
    first = dataclasses.make_dataclass("First", [("k", int, option(1, "a"))], frozen=True)
    second = dataclasses.make_dataclass("Second", [("k", int, option(2, "b"))], frozen=True)
    with pytest.raises(ValueError, match="'k' is declared by both First and Second"):
        join_options([first, second])
    assert [f.name for f in dataclasses.fields(join_options([first, first]))] == ["k"]


def test_a_builder_reads_only_the_options_it_declares(monkeypatch):
    """Catches a drafter that reads an option no group of its declares: the option would be
    read from a group another drafter owns (and shaped for that drafter), with nothing in the
    reading drafter's file saying so."""
    monkeypatch.setitem(registry.STRATEGIES, "sneaky",
                        Strategy(lambda options: options.num_draft, ()))
    with pytest.raises(AttributeError, match="'sneaky' reads decoding option 'num_draft'"):
        make_strategy("sneaky", DecodingConfig())


def test_every_option_has_help_and_is_read_by_some_strategy():
    """Catches a flag without help, and an option that no strategy reads whatever the settings
    (declared in a group but never read by its builder): building every strategy with a chain,
    a static tree and a dynamic tree must read every field."""
    assert list(DECODING_FLAGS) == [f.name for f in dataclasses.fields(DecodingConfig)]
    assert all(text.strip() for text in DECODING_FLAGS.values())
    read = set()
    for tree in ("", "2,1", "dynamic"):
        for name in STRATEGIES:
            recorder = registry._ReadRecorder(DecodingConfig(tree=tree, skip_layers="1"))
            make_strategy(name, recorder)
            read |= recorder.read
    assert read == set(DECODING_FLAGS)


def test_a_head_is_one_file():
    """Catches a head whose objective or settings need edits outside its module (a section in
    RunConfig, a hand-written list of heads): the training registry is exactly what discovery
    finds in specjax.training.heads, each under its own name, its section listed in
    `train.py --help`, read by its objective and refused in a run that trains something
    else."""
    from specjax.discovery import exported
    from specjax.training import heads
    from specjax.training.config import config_reference, parse_run_config
    from specjax.training.registry import HEADS
    from tests.support.models import tiny_run

    assert HEADS == exported(heads, "HEADS", "head")
    assert {"kangaroo", "specdec", "calm", "medusa"} <= set(HEADS)
    reference = config_reference({name: head.config_class for name, head in HEADS.items()})
    for name, head in HEADS.items():
        assert head.name == name and f"\n  {name}: " in reference
        assert head.read_section({name: {}}) == head.config_class()
    assert parse_run_config({**tiny_run(), "medusa": {}}, "medusa").model.num_layers == 4
    with pytest.raises(ValueError, match=r"unknown section\(s\) \['medusa'\]"):
        parse_run_config({**tiny_run(), "medusa": {}})
    with pytest.raises(ValueError, match="medusa.num_heads=0 must be an int >= 1"):
        HEADS["medusa"].read_section({"medusa": {"num_heads": 0}})


def _method_table() -> list[dict[str, list[str]]]:
    """docs/extending.md's method -> files table: per row, each column's backticked names."""
    with open(os.path.join(ROOT, "docs", "extending.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## Where each method lives"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
    header = [cell.strip().strip("`") for cell in rows[0]]
    return [{column: re.findall(r"`([^`]+)`", cell)
             for column, cell in zip(header, row, strict=True)} for row in rows[1:]]


def test_the_method_table_names_every_method_and_its_files():
    """Catches a method missing from the newcomer's map (a strategy or a trained head added
    without its row), a row naming a file that was moved or renamed, a strategy whose drafter
    lives in a file its row does not name, and a head whose files in `heads/`,
    `training/heads/`, `decoding/drafters/` and `configs/` are not all named after it."""
    from specjax.training.registry import HEADS

    table = _method_table()
    named = [name for row in table for name in row["strategies"]]
    assert sorted(named) == sorted(STRATEGIES), "each strategy in exactly one row"
    folders = {"heads/": "specjax/heads", "training/heads/": "specjax/training/heads",
               "decoding/drafters/": "specjax/decoding/drafters", "configs/": "specjax/configs"}
    for row in table:
        for column, folder in folders.items():
            for file in row[column]:
                assert os.path.isfile(os.path.join(ROOT, folder, file)), f"{folder}/{file}"
        for name in row["strategies"]:
            module = STRATEGIES[name].build.__module__.rsplit(".", 1)[1]
            assert f"{module}.py" in row["decoding/drafters/"], (name, module)
            if name in HEADS:
                assert HEADS[name].__module__.rsplit(".", 1)[1] == name
                assert all(f"{name}.py" in row[column] for column in folders), row
