"""The drafters: one module per kind, each exporting `STRATEGIES` (the registry discovers them)."""
