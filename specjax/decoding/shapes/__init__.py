"""Proposal shapes: chains, static and dynamic token trees, and tree geometry (positions, slots, masks)."""
