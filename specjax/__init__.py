"""specjax: self-speculative and early-exit language models in JAX.

`specjax.load(workdir)` gives a model that generates text, `specjax.strategies()` the decoding
strategies (see `specjax.api`); the modules below are the framework itself.
"""

from typing import Any

_API = ("Completion", "LanguageModel", "load", "strategies")


def __getattr__(name: str) -> Any:
    """The API is imported on first use, so `import specjax.config` stays light."""
    if name in _API:
        from specjax import api
        return getattr(api, name)
    raise AttributeError(f"module 'specjax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
