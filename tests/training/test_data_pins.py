"""Data helpers pinned where the fresh audit's plants got past tests/training/test_data.py and
test_token_cache.py: the validation coin at its boundary, by hand."""

import zlib

from specjax import data as D

# Keys whose crc32 falls exactly on a boundary of the coin (found by a search, checked below).
ON_ZERO, ON_TENTH = "doc25097", "doc35119"


def test_the_validation_coin_holds_out_crc_below_the_fraction_only():
    """A document is held out when crc32(key) % 10,000 < fraction x 10,000: a key whose value
    is exactly 0 stays in training at val_fraction 0 (nothing held out), and one at exactly
    1,000 stays in training at 0.1. Catches the comparison taken as <= (every split holds
    out one key value in 10,000 more than its fraction, and a coin at fraction 0 is not
    "never")."""
    assert zlib.crc32(ON_ZERO.encode()) % 10_000 == 0
    assert zlib.crc32(ON_TENTH.encode()) % 10_000 == 1_000
    assert D.is_validation_key(ON_ZERO, 0.0001) and not D.is_validation_key(ON_ZERO, 0.0)
    assert not D.is_validation_key(ON_TENTH, 0.1) and D.is_validation_key(ON_TENTH, 0.1001)

