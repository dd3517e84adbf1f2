"""Files of a run: checkpoint (orbax: save, restore, resume checks), workdir (one run per
workdir, a lock the OS releases), calibrated_defaults and draft_vocab (beside the checkpoints).
Loading a workdir for decoding is `specjax.loading`; atomic outputs are `specjax.outputs`."""
