"""Heads trained on a frozen base: one module each, named after its method and exporting
`HEADS` (`training.registry`); feature_head is the training EAGLE-3 and MTP share."""
