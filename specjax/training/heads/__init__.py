"""Heads trained on a frozen base: one module each, exporting HEAD (`training.registry`)."""
