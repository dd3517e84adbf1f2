"""Heads that draft for (or decide about) a frozen base, each module with its calls: adapter
(Kangaroo), acceptance_head (SpecDec++), confidence_head (CALM's classifier), medusa, eagle
(EAGLE-3's layer), mtp (DeepSeek's modules), feature_head (what EAGLE-3 and MTP share, with
the training-time test) and vocab_subset (drafting over part of the vocabulary). Their training
is `specjax.training.heads`."""
