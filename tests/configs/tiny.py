"""The tests' tiny run as a config file, for the command-line entry points."""

import ml_collections

from tests.conftest import TINY_RUN


def get_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(TINY_RUN)
