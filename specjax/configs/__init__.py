"""The shipped configs, package data found by name from any folder: `--config tiny_code:smoke`
or `specjax.train("tiny_code:smoke", ...)` (`config.config_file`). Each module's
`get_config(variant)` returns the run's sections; its docstring lists its variants."""
