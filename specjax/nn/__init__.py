"""One layer's parameters and math, as Flax linen modules (pure `init` / `apply`)."""

from specjax.nn.block import DecoderBlock

__all__ = ["DecoderBlock"]
