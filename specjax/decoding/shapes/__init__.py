"""Proposal shapes: chains, static and dynamic token trees, and the trees' geometry (positions,
slots, masks)."""
