"""Native kernels, built on first use, each with an XLA fallback."""
