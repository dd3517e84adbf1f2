"""JAX's persistent compilation cache, on by default: a program compiled once (a decode loop,
a train step) is read back from disk by later processes instead of compiled again.

The folder is $SPECJAX_CACHE_DIR, else jax/ in specjax's cache folder (the token cache's:
$SPECJAX_CACHE, else ~/.cache/specjax); SPECJAX_CACHE_DIR=off turns it off. A cache folder the user
configured in JAX itself (`jax_compilation_cache_dir`) is kept. JAX stores only programs that
took at least a second to compile (`jax_persistent_cache_min_compile_time_secs`).
"""

from __future__ import annotations

import os

import jax

from specjax.token_cache import cache_root

ENV = "SPECJAX_CACHE_DIR"


def enable() -> str | None:
    """Points JAX's persistent cache at the folder above (once; idempotent) and returns it,
    or None when it is off."""
    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return configured
    folder = os.environ.get(ENV, os.path.join(cache_root(), "jax"))
    if folder.strip().lower() in ("", "off", "none", "0"):
        return None
    jax.config.update("jax_compilation_cache_dir", folder)
    return folder
