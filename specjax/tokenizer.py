"""Tokenizers. The byte-level one needs no vocabulary file: ids 0-255 are bytes, then BOS, EOS
and PAD. A model's own tokenizer is a Hugging Face `tokenizer.json` (Rust `tokenizers`), with
the BOS/EOS ids the model expects."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import numpy as np

TOKENIZER_FILE = "tokenizer.json"
UNSET_ID = -1  # a data config's bos_id / eos_id: the ones found beside the tokenizer
NO_TOKENIZER = ("this checkpoint names no tokenizer (imported without tokenizer.json): import "
                "it again with `infer/convert.py --tokenizer bytes`, or with a tokenizer.json in "
                "the Hugging Face directory")


class ByteTokenizer:
    """UTF-8 bytes plus three special ids; decoding replaces invalid byte sequences."""

    name = "bytes"
    bos_id, eos_id, pad_id = 256, 257, 258
    vocab_size = 259

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> np.ndarray:
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
        parts = ([np.array([self.bos_id], np.int32)] if add_bos else []) + [ids]
        if add_eos:
            parts.append(np.array([self.eos_id], np.int32))
        return np.concatenate(parts)

    def encode_batch(self, texts: Sequence[str], *, add_bos: bool = False,
                     add_eos: bool = False) -> list[np.ndarray]:
        return [self.encode(text, add_bos=add_bos, add_eos=add_eos) for text in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")

    def fingerprint(self) -> str:
        return self.name


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer (tokenizer.json) with BOS/EOS ids from the
    checkpoint's config; BOS and EOS are added by us, never by the tokenizer's template."""

    name = "hf"

    def __init__(self, path: str, bos_id: int | None = None, eos_id: int | None = None):
        from tokenizers import Tokenizer

        if not os.path.isfile(path):
            raise FileNotFoundError(f"tokenizer file {path!r} does not exist")
        try:
            self._tokenizer = Tokenizer.from_file(path)
        except Exception as error:  # the Rust library raises plain Exceptions
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(f"{path} is not a Hugging Face tokenizer.json ({first})") from None
        self.path = os.path.abspath(path)
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, None
        self.vocab_size = self._tokenizer.get_vocab_size()
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"{name}={value} is not an id of the tokenizer in {path} "
                                 f"({self.vocab_size} ids)")

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> np.ndarray:
        return self.encode_batch([text], add_bos=add_bos, add_eos=add_eos)[0]

    def encode_batch(self, texts: Sequence[str], *, add_bos: bool = False,
                     add_eos: bool = False) -> list[np.ndarray]:
        """Token ids of each text, encoded in parallel by the Rust library; BOS/EOS added here
        (never the tokenizer's own template, which differs between models)."""
        head = [self.bos_id] if add_bos and self.bos_id is not None else []
        tail = [self.eos_id] if add_eos and self.eos_id is not None else []
        return [np.asarray(head + encoding.ids + tail, np.int32) for encoding in
                self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def fingerprint(self) -> str:
        """What identifies its token ids: the file's bytes and the BOS/EOS ids."""
        with open(self.path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        return f"hf:{digest}:{self.bos_id}:{self.eos_id}"

    def spec(self) -> dict:
        """The checkpoint metadata's record of this tokenizer, copied into a workdir as
        `TOKENIZER_FILE` (`get_tokenizer` reads it back)."""
        return {"kind": self.name, "file": TOKENIZER_FILE, "bos_id": self.bos_id,
                "eos_id": self.eos_id}


Tokenizer = ByteTokenizer | HFTokenizer


def tokenizer_file(path: str) -> str:
    """The tokenizer.json `path` names: the file itself, or the one in a directory."""
    return os.path.join(path, TOKENIZER_FILE) if os.path.isdir(path) else path


def special_ids(path: str) -> tuple[int | None, int | None]:
    """The (BOS, EOS) ids the model beside a tokenizer.json expects: `bos_token_id` and
    `eos_token_id` of a config.json in its folder (the first EOS of a list), else the
    `bos_token` / `eos_token` strings of a tokenizer_config.json looked up in the vocabulary;
    None where neither names one (Qwen2 has no BOS)."""
    folder = os.path.dirname(os.path.abspath(tokenizer_file(path)))
    config = _json_beside(folder, "config.json")
    if "bos_token_id" in config or "eos_token_id" in config:
        eos = config.get("eos_token_id")
        return config.get("bos_token_id"), eos[0] if isinstance(eos, list) else eos
    settings = _json_beside(folder, "tokenizer_config.json")
    if not settings:
        return None, None
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(tokenizer_file(path))

    def lookup(name: str) -> int | None:
        token = settings.get(name)
        token = token.get("content") if isinstance(token, dict) else token
        return vocab.token_to_id(token) if isinstance(token, str) else None

    return lookup("bos_token"), lookup("eos_token")


def _json_beside(folder: str, name: str) -> dict:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} is not readable JSON ({error})") from None


def load_tokenizer(path: str, bos_id: int | None = None,
                   eos_id: int | None = None) -> Tokenizer:
    """"bytes", or a tokenizer.json (or a folder holding one) with the BOS/EOS ids given, else
    those `special_ids` finds beside it."""
    if path == ByteTokenizer.name:
        return ByteTokenizer()
    file = tokenizer_file(path)
    if not os.path.isfile(file):
        raise ValueError(f"no tokenizer at {path!r}: give 'bytes', a tokenizer.json or "
                                "a folder holding one")
    found = special_ids(path) if bos_id is None or eos_id is None else (None, None)
    return HFTokenizer(file, found[0] if bos_id is None else bos_id,
                       found[1] if eos_id is None else eos_id)


def data_fields(spec: str | dict | None, workdir: str) -> dict | None:
    """The data config fields (tokenizer, bos_id, eos_id) that encode text as a checkpoint's
    tokenizer `spec` does (its file relative to `workdir`); None for a checkpoint without one."""
    if spec is None:
        return None
    if spec == ByteTokenizer.name:
        return {"tokenizer": ByteTokenizer.name, "bos_id": UNSET_ID, "eos_id": UNSET_ID}
    if isinstance(spec, dict) and spec.get("kind") == HFTokenizer.name:
        ids = [UNSET_ID if spec.get(name) is None else spec[name]
               for name in ("bos_id", "eos_id")]
        return {"tokenizer": os.path.abspath(os.path.join(workdir, spec["file"])),
                "bos_id": ids[0], "eos_id": ids[1]}
    raise ValueError(f"unknown tokenizer {spec!r} in the checkpoint of {workdir}")


def get_tokenizer(spec: str | dict, workdir: str | None = None) -> Tokenizer:
    """The tokenizer a config or checkpoint names: "bytes", or {"kind": "hf", "file": ...,
    "bos_id": ..., "eos_id": ...} with the file relative to `workdir`."""
    if spec == ByteTokenizer.name:
        return ByteTokenizer()
    if isinstance(spec, dict) and spec.get("kind") == HFTokenizer.name:
        return HFTokenizer(os.path.join(workdir or ".", spec["file"]), spec.get("bos_id"),
                           spec.get("eos_id"))
    if spec is None:
        raise ValueError(NO_TOKENIZER)
    raise ValueError(f"unknown tokenizer {spec!r}; available: '{ByteTokenizer.name}' or a "
                     "Hugging Face tokenizer.json imported by infer/convert.py")
