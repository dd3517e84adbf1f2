"""The tests' tiny run as a config file, for the command-line entry points (every field a test
overrides on the command line must exist here)."""

import ml_collections

from tests.support.models import TINY_RUN


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict(TINY_RUN)
    config.data.tokenizer = "bytes"
    config.train.grad_accum = 1
    config.init = ml_collections.ConfigDict(dict(source=""))
    return config
