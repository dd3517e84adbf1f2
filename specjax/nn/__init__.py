"""One layer's parameters and math, as Flax linen modules (pure `init` / `apply`); the layer kinds
a model can stack are listed in `layer_kinds`."""
