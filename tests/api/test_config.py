import dataclasses
import importlib

import pytest

from specjax.config import ModelConfig, SsmConfig
from specjax.decoding.registry import DecodingConfig
from specjax.training.config import parse_run_config
from specjax.training.heads.mtp import MtpConfig
from tests.support.models import TINY_MODEL, tiny_run


@pytest.mark.parametrize("field, value, message", [
    ("d_model", 0, "ModelConfig.d_model=0 must be a positive int"),
    ("num_layers", -2, "ModelConfig.num_layers=-2"),
    ("num_heads", 5, "ModelConfig.num_kv_heads=2 must divide num_heads=5"),
    ("num_kv_heads", 3, "ModelConfig.num_kv_heads=3 must divide num_heads=4"),
    ("d_model", 30, "ModelConfig.num_heads=4 must divide d_model=30"),
    ("head_dim", 7, "ModelConfig.head_dim=7 must be even"),
    ("rope_theta", 0.0, "ModelConfig.rope_theta=0.0 must be > 0"),
    ("dtype", "float8", "ModelConfig.dtype='float8' must be one of"),
    ("exit_layers", (0, 2), "ModelConfig.exit_layers=(0, 2) must lie in [1, num_layers=4]"),
    ("exit_layers", (1, 5), "must lie in [1, num_layers=4]"),
    ("exit_layers", (2, 1), "must be strictly increasing"),
    ("exit_layers", (), "must not be empty"),
    ("nope_layers", (4,), "ModelConfig.nope_layers=(4,) must be increasing indices of "
                          "attention layers in [0, num_layers=4)"),
    ("nope_layers", (2, 1), "ModelConfig.nope_layers=(2, 1) must be increasing"),
    ("sliding_layers", (1,), "ModelConfig.sliding_window=None must be set when sliding_layers"),
    ("mlp_activation", "gelu", "ModelConfig.mlp_activation='gelu' must be one of"),
    ("logit_softcap", 0.0, "ModelConfig.logit_softcap=0.0 must be > 0 (or None)"),
])
def test_invalid_model_config_names_the_field(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        ModelConfig(**{**TINY_MODEL, field: value})


def test_a_repeated_exit_layer_is_refused():
    """`exit_layers=(2, 2)` (an exit named twice) is the one-line "must be strictly
    increasing" error, as a decreasing list is; distinct increasing exits are kept. Catches a
    check that only sorts (duplicates allowed: one exit trained and reported twice)."""
    with pytest.raises(ValueError) as caught:
        ModelConfig(**{**TINY_MODEL, "exit_layers": (2, 2)})
    assert str(caught.value) == "ModelConfig.exit_layers=(2, 2) must be strictly increasing"
    assert ModelConfig(**{**TINY_MODEL, "exit_layers": [1, 2]}).exit_layers == (1, 2)


def test_model_config_round_trips_and_rejects_unknown_fields():
    cfg = ModelConfig(**TINY_MODEL, exit_layers=(1, 4), nope_layers=(3,))
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"model: unknown field\(s\) \['hidden'\]"):
        ModelConfig.from_dict({**TINY_MODEL, "hidden": 3})
    scaled = ModelConfig.from_dict({**TINY_MODEL, "rope_scaling": {"factor": 8.0}})
    assert scaled.rope_scaling.factor == 8.0
    assert ModelConfig.from_dict(scaled.to_dict()) == scaled


def test_diff_lists_changed_fields():
    a, b = ModelConfig(**TINY_MODEL), ModelConfig(**{**TINY_MODEL, "d_model": 64})
    assert a.diff(b) == {"d_model": (32, 64), "head_dim": (8, 16)}  # head_dim is resolved


@pytest.mark.parametrize("sections, message", [
    ({"train": {"batch_size": 0}}, "train.batch_size=0 must be > 0"),
    ({"train": {"warmup_steps": 12}}, r"train.warmup_steps=12 must lie in \[0, total_steps=12\)"),
    ({"train": {"b2": 1.0}}, r"train.b2=1.0 must lie in \[0, 1\)"),
    ({"layerskip": {"p_max": 1.5}}, r"layerskip.p_max=1.5 must lie in \[0, 1\]"),
    ({"layerskip": {"curriculum": "zigzag"}}, "layerskip.curriculum='zigzag' must be one of"),
    ({"layerskip": {"rotation_interval": 0}}, "layerskip.rotation_interval=0"),
    ({"layerskip": {"exit_scale": "cubic"}}, "layerskip.exit_scale='cubic'"),
    ({"layerskip": {"exit_distill": 1.5}}, r"layerskip.exit_distill=1.5 must lie in \[0, 1\]"),
    ({"data": {"source": "web"}}, "data.source='web' must be one of"),
    ({"data": {"seq_len": 1}}, "data.seq_len=1 must be >= 2"),
    ({"data": {"tokenizer": "bpe"}}, "no tokenizer at 'bpe'"),
    ({"model": {"vocab_size": 100}}, "has 259 ids, more than the model's vocabulary of 100"),
    ({"train": {"steps": 3}}, r"train: unknown field\(s\) \['steps'\]"),
])
def test_invalid_run_config_is_a_clear_error(sections, message):
    with pytest.raises(ValueError, match=message):
        parse_run_config(tiny_run(**sections))


def test_unknown_section_is_rejected():
    with pytest.raises(ValueError, match=r"unknown section\(s\) \['optimiser'\]"):
        parse_run_config({**tiny_run(), "optimiser": {}})


@pytest.mark.parametrize("decoding, message", [
    ({"exit_layer": 4}, r"decoding.exit_layer=4 must lie in \[1, num_layers - 1 = 3\]"),
    ({"num_draft": 0}, "decoding.num_draft=0 must be >= 1"),
    ({"num_draft": 2.5}, "decoding.num_draft=2.5 must be an int"),
    ({"draft": 2}, r"decoding: unknown field\(s\) \['draft'\]"),
])
def test_invalid_decoding_defaults(decoding, message):
    with pytest.raises(ValueError, match=message):
        parse_run_config({**tiny_run(), "decoding": decoding})


def test_the_suite_names_what_would_make_tests_skip(monkeypatch):
    """Catches CI passing with the HF or kernel tests silently skipped: the session start
    check must see a missing package or kernel."""
    import importlib.util

    from specjax.kernels import cpu_matmul
    from tests.support.requirements import missing_test_requirements

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.setattr(cpu_matmul, "available", lambda: False)
    missing = missing_test_requirements()
    assert len(missing) == 2 and missing[0].startswith("torch")
    assert "CPU matmul kernel" in missing[1]


def test_the_model_configs_decoding_section_takes_every_drafters_option():
    """Catches `train.py --config.decoding.ngram_max=2` refused by the flag parser because the
    config file's decoding section listed only the fields it changes (an override must name a
    field the file has; the third probe). A head's config (kangaroo.py) lists only what it
    changes over its base's decoding defaults, on purpose."""
    section = importlib.import_module("specjax.configs.tiny_code").get_config().decoding
    assert set(section) == {field.name for field in dataclasses.fields(DecodingConfig)}


def test_layer_kinds_are_checked_where_they_are_looked_up():
    """Catches an unknown layer kind or a Mamba-2 model without its `ssm` section reaching a
    KeyError deep in the model (the check moved out of ModelConfig, which imports no layer:
    `import specjax.config` loading the layer registry would bring the import circle back)."""
    import subprocess
    import sys

    from specjax import model as M

    bogus = dict(layer_pattern=("attention", "bogus", "attention", "attention"))
    with pytest.raises(ValueError, match=r"has unknown kinds \['bogus'\]; known: \["):
        parse_run_config(tiny_run(model=bogus))
    with pytest.raises(ValueError, match=r"has unknown kinds \['bogus'\]"):
        M.init_params(ModelConfig(**{**TINY_MODEL, **bogus}), None)
    with pytest.raises(ValueError, match="ssm=None must be set when layer_pattern has mamba2"):
        parse_run_config(tiny_run(model=dict(layer_pattern=("mamba2",) * 4)))
    loaded = subprocess.run([sys.executable, "-c", "import sys, specjax.config; print("
                             "[m for m in sys.modules if m.startswith('specjax.nn')])"],
                            capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


@pytest.mark.parametrize("build, message", [
    (lambda: ModelConfig(**{**TINY_MODEL, "norm_eps": 0.0}),
     "ModelConfig.norm_eps=0.0 must be > 0"),
    (lambda: SsmConfig(num_heads=4, conv_width=1), "ssm.conv_width=1 must be >= 2"),
    (lambda: parse_run_config(tiny_run(train=dict(weight_decay=-1.0))),
     "train.weight_decay=-1.0 must be >= 0"),
    (lambda: MtpConfig(depth=0), "mtp.depth=0 must be an int >= 1"),
])
def test_every_config_section_fails_through_one_checker(build, message):
    """The model's, a layer kind's, the run's and a head's settings all fail as exactly
    "section.field=value why" (`config.check`). Catches a second checker coming back with its
    own form (the model's once prefixed "ModelConfig." only to dotless names, the run's did not)
    and a check that words the setting differently from its config key."""
    with pytest.raises(ValueError) as caught:
        build()
    assert str(caught.value) == message
