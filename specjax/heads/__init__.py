"""Heads trained on a frozen base, each module with its calls: Kangaroo's adapter, SpecDec++'s
acceptance head, CALM's confidence classifier."""
