"""Files of a run: checkpoints, workdirs, loading for decoding, calibrated defaults, atomic
outputs."""
