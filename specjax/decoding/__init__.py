"""Jitted draft-verify decoding: one loop, pluggable drafting strategies, lossless acceptance."""
