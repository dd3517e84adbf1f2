"""Offline, host-side tools around the jitted core (which never imports them): bench, the
searches (tree_search: Sequoia's tree shapes; skip_search: skip sets), CALM's quality
(calm_quality, forced), learn_then_test, exit_report and hf_peer (the transformers
comparison). Timers are `specjax.timing`."""
