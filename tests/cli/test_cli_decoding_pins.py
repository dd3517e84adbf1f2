"""The command lines' shared flag and prompts-file readers, their refusals pinned by their
messages (issue 52's scan: raise sites no test triggered), read in-process from flag values
set as a command line would set them; and the strategy a workdir decodes with when none is
named (`default_choice`, a survivor of issue 52's audit L)."""

import pytest
from absl import flags

from specjax.cli.decoding import default_choice, read_prompts_file, whole_numbers_flag
from specjax.cli.flags import define_prompt_flags
from specjax.config import ModelConfig
from specjax.decoding.registry import DecodingConfig
from specjax.decoding.sampling import SamplingParams
from tests.support.models import TINY_MODEL


@pytest.fixture
def counts_flag(monkeypatch):
    """Sets `--num_draft` (a list flag, as bench/bench.py defines it) to the given strings on
    flag values of the test's own, in place of the process's FLAGS."""
    def parsed(*values: str) -> None:
        values_here = flags.FlagValues()
        flags.DEFINE_list("num_draft", list(values), "", flag_values=values_here)
        values_here.mark_as_parsed()
        monkeypatch.setattr(flags, "FLAGS", values_here)
    return parsed


@pytest.mark.parametrize("values, message", [
    (("2", "x"), r"^--num_draft='x': expected whole numbers$"),
    (("2", "2.5"), r"^--num_draft='2.5': expected whole numbers$"),
    (("2", "0"), r"^--num_draft=0 must be >= 1$")])
def test_a_list_of_counts_refuses_what_is_not_one(counts_flag, values, message):
    """Catches a word or a fraction in a list of counts reaching int()'s raw error (or a
    fraction truncated), and the lower bound dropped or loosened (0 drafts let through)."""
    counts_flag(*values)
    with pytest.raises(ValueError, match=message):
        whole_numbers_flag("num_draft", 1)


def test_a_list_of_counts_takes_its_minimum(counts_flag):
    """The minimum itself is accepted. Catches the bound tightened to `<=`."""
    counts_flag("1", "4")
    assert whole_numbers_flag("num_draft", 1) == [1, 4]


def test_a_prompts_file_that_is_a_folder_is_refused(tmp_path):
    """Catches a folder given as --prompts_file reaching open()'s raw IsADirectoryError."""
    with pytest.raises(ValueError, match=f"^{tmp_path}: is a directory, not a JSONL file of "
                                         "prompts$"):
        read_prompts_file(str(tmp_path))


def test_a_script_cannot_define_an_unknown_prompt_flag():
    """define_prompt_flags takes only the shared prompt flags (their help is shared). Catches
    the check dropped: a misspelt name reaching a KeyError in the help table at import."""
    with pytest.raises(TypeError, match="^define_prompt_flags: 'max_new_token' is not one of"):
        define_prompt_flags(max_new_token=8)


def test_a_tuned_strategy_decodes_with_its_tuned_options_over_the_checkpoints():
    """The strategy `infer/tune.py` stored for a mode, with its options laid over the checkpoint's
    decoding section, the other mode's left alone. Catches default_choice returning the
    checkpoint's defaults for a tuned strategy (its tuned num_draft and n-gram size dropped:
    the right tokens, but drafted as the tuner did not choose)."""
    meta = {"config": {"decoding": {"num_draft": 3, "exit_layer": 2}},
            "tuned": {"greedy": {"strategy": "ngram", "options": {"num_draft": 6, "ngram_max": 2}},
                      "sampled": {"strategy": "selfspec", "options": {"num_draft": 5}}}}
    cfg = ModelConfig(**TINY_MODEL)
    checkpoint = DecodingConfig(num_draft=3, exit_layer=2)
    assert default_choice(meta, cfg, None, weights=()) == (
        "ngram", DecodingConfig(num_draft=6, exit_layer=2, ngram_max=2))
    assert default_choice(meta, cfg, SamplingParams.create(1.0), weights=()) == (
        "selfspec", DecodingConfig(num_draft=5, exit_layer=2))
    assert default_choice({"config": meta["config"]}, cfg, None, weights=()) == (
        "selfspec", checkpoint)
