"""Heads that draft for (or decide about) a frozen base, one module per method, named as in
`decoding.drafters`, `training.heads` and `configs`: kangaroo (the adapter), specdec (the
acceptance head), calm (the confidence measures and classifier), medusa, eagle (EAGLE-3's
layer) and mtp (DeepSeek's modules); and the shared pieces, named for what they are:
feature_head (what EAGLE-3 and MTP share, with the training-time test) and vocab_subset
(drafting over part of the vocabulary). Their training is `specjax.training.heads`."""
