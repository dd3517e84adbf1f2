"""Native kernels, built on first use, each with an XLA fallback: the registry, by name."""

from specjax.kernels import cpu_attention, cpu_matmul

KERNELS = {"matmul": cpu_matmul, "attention": cpu_attention}
