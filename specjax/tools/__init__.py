"""Offline tools around the jitted core: benchmarks, timing, the searches (tree shapes, skip
sets), CALM's quality, Learn then Test, the exit report and the Hugging Face peer."""
