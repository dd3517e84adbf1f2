"""What the entry points share: flag parsing, one-line errors, Ctrl-C, the decoding flags."""
