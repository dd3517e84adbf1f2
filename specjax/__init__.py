"""specjax: self-speculative and early-exit language models in JAX.

`specjax.load(workdir)` gives a model that generates text and benchmarks settings,
`specjax.train(config, workdir)` trains one, `specjax.strategies()` lists the decoding
strategies (see `specjax.api`; figures: `specjax.plots`); the modules below are the framework
itself.
"""

from typing import Any

_API = ("Completion", "LanguageModel", "acceptance_by_depth", "bench", "import_hf", "load",
        "strategies", "train")


def __getattr__(name: str) -> Any:
    """The API is imported on first use, so `import specjax.config` stays light."""
    if name in _API:
        from specjax import api
        return getattr(api, name)
    raise AttributeError(f"module 'specjax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
