"""Heads trained on a frozen base: Kangaroo's adapter, SpecDec++'s acceptance head, CALM's confidence classifier (each: the module and its calls)."""
