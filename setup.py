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
    package_data={"specjax.kernels": ["*.cc", "*.h"]},  # compiled on first use (kernels/library.py)
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
        "matplotlib>=3.8",  # figures (specjax.plots, infer/exits.py, infer/calm_bench.py)
        "tqdm>=4.66",
        "safetensors>=0.4",
        "tokenizers>=0.20",
    ],
    extras_require={
        # nbclient, nbformat and ipykernel execute the notebooks (tests/test_notebooks.py).
        "test": ["pytest>=8", "pytest-xdist>=3.5", "nbclient>=0.10", "nbformat>=5.9",
                 "ipykernel>=6.29", "tensorboardX>=2.6",
                 # the docs/ site and its API reference (tests/test_api_reference.py)
                 "mkdocs>=1.6", "mkdocstrings[python]>=0.26"],
        # TensorBoard event files beside metrics.jsonl (specjax/training/metrics_log.py).
        "tensorboard": ["tensorboardX>=2.6"],
        # Parity tests and the peer benchmark against the reference implementation; never
        # imported by specjax at run time.
        "hf": ["torch==2.13.0", "transformers>=4.46"],
    },
)
