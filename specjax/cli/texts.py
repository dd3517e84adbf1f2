"""The flags of a command that reads text from a data file (`--texts_file`, `--text_field`):
defined once here, read with `given_texts`."""

from __future__ import annotations

from absl import flags

from specjax.data import file_texts


def define_texts_flags(purpose: str, default: str) -> None:
    """--texts_file (what the text is for, e.g. "Held-out text", and what is read without it)
    and --text_field."""
    flags.DEFINE_string("texts_file", None, f"{purpose}: a .jsonl file, one {{\"text\": ...}} "
                        "per line, a .parquet file (column text; see --text_field), or any "
                        f"other file as one plain-text document (default: {default}).")
    flags.DEFINE_string("text_field", "text", "The field (.jsonl) or column (.parquet) of "
                        "--texts_file holding the text.")


def given_texts() -> list[str] | None:
    """The documents of --texts_file (None when it is not given)."""
    values = flags.FLAGS
    return file_texts(values.texts_file, values.text_field) if values.texts_file else None
