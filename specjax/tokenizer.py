"""Tokenizers. The byte-level one needs no vocabulary file: ids 0-255 are bytes, then BOS, EOS
and PAD. A model's own tokenizer is a Hugging Face `tokenizer.json` (Rust `tokenizers`), with
the BOS/EOS ids the model expects."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from collections.abc import Sequence

import numpy as np

from specjax.outputs import read_json_object

TOKENIZER_FILE = "tokenizer.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
UNSET_ID = -1  # a data config's bos_id / eos_id: the ones found beside the tokenizer
NO_TOKENIZER = ("this checkpoint names no tokenizer (imported without tokenizer.json): import "
                "it again with `tools/convert.py --tokenizer bytes`, or with a tokenizer.json in "
                "the Hugging Face directory")


class ByteTokenizer:
    """UTF-8 bytes plus three special ids; decoding replaces invalid byte sequences. Its
    convention: a text starts with BOS."""

    name = "bytes"
    bos_id, eos_id, pad_id = 256, 257, 258
    vocab_size = 259
    prefix: tuple[int, ...] = (bos_id,)
    suffix: tuple[int, ...] = ()
    stop_ids: tuple[int, ...] = (eos_id,)
    chat_template = None

    def encode(self, text: str, *, add_special_tokens: bool = False,
               add_eos: bool = False) -> np.ndarray:
        """The text's ids; with `add_special_tokens` the BOS before them (its convention), with
        `add_eos` the EOS after them (a training document's end)."""
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
        return _around(ids, self, add_special_tokens, add_eos)

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = False,
                     add_eos: bool = False) -> list[np.ndarray]:
        return [self.encode(text, add_special_tokens=add_special_tokens, add_eos=add_eos)
                for text in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")

    def token_bytes(self) -> tuple[bytes, ...]:
        """The bytes each id adds to a decoded text (none for the special ids)."""
        return tuple(bytes([i]) for i in range(256)) + (b"",) * (self.vocab_size - 256)

    def fingerprint(self) -> str:
        return self.name


def _around(ids: Sequence[int] | np.ndarray, tokenizer: Tokenizer, add_special_tokens: bool,
            add_eos: bool) -> np.ndarray:
    """`ids` with the tokenizer's prefix and suffix (`add_special_tokens`), then its EOS unless
    they already end with it (`add_eos`)."""
    parts = [np.asarray(ids, np.int32)]
    if add_special_tokens:
        parts = [np.asarray(tokenizer.prefix, np.int32), *parts,
                 np.asarray(tokenizer.suffix, np.int32)]
    out = np.concatenate(parts)
    if add_eos and tokenizer.eos_id is not None and not (len(out) and out[-1] == tokenizer.eos_id):
        out = np.append(out, np.int32(tokenizer.eos_id))
    return out


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer (tokenizer.json) with the conventions transformers
    applies around it (`TokenizerSource`): the ids it puts before and after a text (`prefix`,
    `suffix`: BOS where its post-processor adds one, none for SmolLM2 or Qwen2), the ids that
    end a generation (`stop_ids`: generation_config.json's EOS ids), the chat template."""

    name = "hf"

    def __init__(self, path: str, bos_id: int | None = None, eos_id: int | None = None, *,
                 prefix: Sequence[int] = (), suffix: Sequence[int] = (),
                 stop_ids: Sequence[int] | None = None, chat_template: str | None = None):
        from tokenizers import Tokenizer

        if not os.path.isfile(path):
            raise FileNotFoundError(f"tokenizer file {path!r} does not exist")
        try:
            self._tokenizer = Tokenizer.from_file(path)
        except Exception as error:  # the Rust library raises plain Exceptions
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(f"{path} is not a Hugging Face tokenizer.json ({first})") from None
        self.path = os.path.abspath(path)
        self._token_bytes: tuple[bytes, ...] | None = None
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, None
        self.prefix, self.suffix = tuple(prefix), tuple(suffix)
        self.stop_ids = tuple(stop_ids if stop_ids is not None else
                              () if eos_id is None else (eos_id,))
        self.chat_template = chat_template
        self.vocab_size = self._tokenizer.get_vocab_size()
        _check_special_ids(self, self.vocab_size, f"the tokenizer in {path}")

    def encode(self, text: str, *, add_special_tokens: bool = False,
               add_eos: bool = False) -> np.ndarray:
        """The text's ids; with `add_special_tokens` the tokenizer's own prefix and suffix
        around them (transformers' `tokenizer(text)`), with `add_eos` its EOS after them."""
        return self.encode_batch([text], add_special_tokens=add_special_tokens,
                                 add_eos=add_eos)[0]

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = False,
                     add_eos: bool = False) -> list[np.ndarray]:
        """`encode` of each text, in parallel by the Rust library."""
        return [_around(encoding.ids, self, add_special_tokens, add_eos) for encoding in
                self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def token(self, token_id: int | None) -> str | None:
        """The text of one id (a chat template's `bos_token`), None for None."""
        return None if token_id is None else self._tokenizer.id_to_token(token_id)

    @functools.cache  # noqa: B019 (one table per tokenizer, which lives as long as its model)
    def token_bytes(self) -> tuple[bytes, ...]:
        """The bytes each id stands for in a text, read from the vocabulary as transformers'
        `StopStringCriteria.clean_tokenizer_vocab` reads it: a byte-level token's bytes, a
        byte-fallback token <0xNN>'s byte, else the decoder's text of the token after a fixed
        prefix (so that a leading space is kept), in UTF-8. Read once (SmolLM2: 0.3 s)."""
        if self._token_bytes is None:
            self._token_bytes = self._read_token_bytes()
        return self._token_bytes

    def _read_token_bytes(self) -> tuple[bytes, ...]:
        decoder = self._tokenizer.decoder
        spec = json.loads(self._tokenizer.to_str()).get("decoder")
        mode = ("byte_level" if type(decoder).__name__ == "ByteLevel" else
                "byte_fallback" if _has_type(spec, "ByteFallback") else
                "byte_level" if _has_type(spec, "ByteLevel") else None)
        byte_of = {char: byte for byte, char in _byte_level_chars().items()}
        prefix = "abcdef"
        base = self._tokenizer.encode(prefix, add_special_tokens=False).tokens
        join = decoder.decode if decoder is not None else " ".join
        table = [b""] * self.vocab_size
        for token, index in self._tokenizer.get_vocab(with_added_tokens=True).items():
            if mode == "byte_level" and all(char in byte_of for char in token):
                table[index] = bytes(byte_of[char] for char in token)
            elif mode == "byte_fallback" and re.fullmatch(r"<0x[0-9a-fA-F]{2}>", token):
                table[index] = bytes([int(token[3:5], 16)])
            else:
                text = join(base + [token])
                table[index] = text[text.index(prefix) + len(prefix):].encode("utf-8")
        return tuple(table)

    def fingerprint(self) -> str:
        """What identifies its token ids: the file's bytes and the ids put around a text."""
        with open(self.path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        return f"hf:{digest}:{list(self.prefix)}:{list(self.suffix)}:{self.eos_id}"

    def spec(self) -> dict:
        """The checkpoint metadata's record of this tokenizer, whose files `save_files` wrote
        into the workdir (`get_tokenizer` reads them back)."""
        return {"kind": self.name, "file": TOKENIZER_FILE, "bos_id": self.bos_id,
                "eos_id": self.eos_id, "prefix": list(self.prefix), "suffix": list(self.suffix)}

    def save_files(self, folder: str) -> list[str]:
        """Writes the tokenizer as a Hugging Face folder holds it, so that transformers and
        `read_tokenizer_folder` read the same conventions back: tokenizer.json with a
        post-processor putting `prefix` / `suffix` around a text, tokenizer_config.json (BOS,
        EOS, chat template), generation_config.json (the ids that end a generation). Returns
        the files written."""
        from tokenizers import Tokenizer, processors

        tokenizer = Tokenizer.from_str(self._tokenizer.to_str())
        around = ([f"{self.token(i)}:0" for i in self.prefix] + ["$A:0"]
                  + [f"{self.token(i)}:0" for i in self.suffix])
        tokenizer.post_processor = processors.TemplateProcessing(
            single=" ".join(around), pair=" ".join(around + ["$B:1"]),
            special_tokens=[(self.token(i), i) for i in dict.fromkeys(self.prefix + self.suffix)])
        settings = {key: value for key, value in (("bos_token", self.token(self.bos_id)),
                                                  ("eos_token", self.token(self.eos_id)),
                                                  ("chat_template", self.chat_template))
                    if value is not None}
        stops = list(self.stop_ids)
        generation = {key: value for key, value in (
            ("bos_token_id", self.bos_id),
            ("eos_token_id", stops[0] if len(stops) == 1 else stops or None)) if value is not None}
        tokenizer.save(os.path.join(folder, TOKENIZER_FILE))
        for name, values in (("tokenizer_config.json", settings),
                             ("generation_config.json", generation)):
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                json.dump(values, f, indent=2)
        return [TOKENIZER_FILE, "tokenizer_config.json", "generation_config.json"]


Tokenizer = ByteTokenizer | HFTokenizer


def _has_type(spec: object, kind: str) -> bool:
    """Whether a tokenizer.json component (nested dicts and lists) has a part of type `kind`."""
    if isinstance(spec, dict):
        return spec.get("type") == kind or any(_has_type(v, kind) for v in spec.values())
    return isinstance(spec, list) and any(_has_type(v, kind) for v in spec)


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable},
            **{b: chr(256 + n) for n, b in enumerate(others)}}


@dataclasses.dataclass(frozen=True)
class TokenizerSource:
    """A model's tokenizer as an import finds it (a Hugging Face folder, a GGUF file): the
    tokenizer.json text and what transformers applies around it."""

    json: str
    bos_id: int | None
    eos_id: int | None
    stop_ids: list[int]
    prefix: list[int]
    suffix: list[int]
    chat_template: str | None

    def check(self, vocab_size: int, source: str) -> None:
        """A one-line error naming `source`, before anything is written, for a tokenizer the
        model cannot use: one without tokens, one whose ids run past the model's `vocab_size`
        (another model's tokenizer.json) or special ids that are not among its own (an import
        would succeed and fail at the first prompt)."""
        from tokenizers import Tokenizer

        span = max(Tokenizer.from_str(self.json).get_vocab().values(), default=-1) + 1
        if span == 0:
            raise ValueError(f"{source}: its tokenizer has no tokens")
        if span > vocab_size:
            raise ValueError(f"{source}: its tokenizer's ids run to {span - 1}, past the model's "
                             f"vocabulary of {vocab_size} (a tokenizer of another model?)")
        _check_special_ids(self, span, f"the tokenizer of {source}")

    def save(self, folder: str) -> HFTokenizer:
        """Writes the tokenizer's files into `folder` (`HFTokenizer.save_files`); the tokenizer
        they hold."""
        path = os.path.join(folder, TOKENIZER_FILE)
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.json)
        tokenizer = HFTokenizer(path, self.bos_id, self.eos_id, prefix=self.prefix,
                                suffix=self.suffix, stop_ids=self.stop_ids,
                                chat_template=self.chat_template)
        tokenizer.save_files(folder)
        return tokenizer


def _check_special_ids(tokenizer: HFTokenizer | TokenizerSource, size: int, where: str) -> None:
    """A one-line error for the first BOS, EOS, prefix, suffix or stop id outside [0, size)."""
    named = {"bos_id": [tokenizer.bos_id], "eos_id": [tokenizer.eos_id],
             "prefix": tokenizer.prefix, "suffix": tokenizer.suffix,
             "stop_ids": tokenizer.stop_ids}
    for name, values in named.items():
        bad = [v for v in values if v is not None and not 0 <= v < size]
        if bad:
            raise ValueError(f"{name}={bad[0]} is not an id of {where} ({size} ids)")


def tokenizer_file(path: str) -> str:
    """The tokenizer.json `path` names: the file itself, or the one in a directory."""
    return os.path.join(path, TOKENIZER_FILE) if os.path.isdir(path) else path


def read_tokenizer_folder(path: str) -> TokenizerSource | None:
    """The tokenizer of a Hugging Face folder (or of the tokenizer.json `path` names) with
    transformers' conventions, read from the files beside it; None without a tokenizer.json.

    - BOS/EOS ids: config.json's `bos_token_id` / `eos_token_id` (the first of a list), else
      tokenizer_config.json's `bos_token` / `eos_token` looked up in the vocabulary.
    - The ids around a text: what tokenizer.json's own post-processor adds (transformers 5
      reads them from there, whatever tokenizer_config.json's `add_bos_token` says).
    - The ids that end a generation: generation_config.json's `eos_token_id` (an id or a
      list), else config.json's, else the EOS.
    - The chat template: chat_template.jinja, else tokenizer_config.json's `chat_template`
      (its "default" entry where it lists named templates).
    """
    file = tokenizer_file(path)
    if not os.path.isfile(file):
        return None
    folder = os.path.dirname(os.path.abspath(file))
    config = _json_beside(folder, "config.json")
    settings = _json_beside(folder, "tokenizer_config.json")
    generation = _json_beside(folder, "generation_config.json")
    from tokenizers import Tokenizer

    try:
        vocab = Tokenizer.from_file(file)
    except Exception as error:  # the Rust library raises plain Exceptions
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{file} is not a Hugging Face tokenizer.json ({first})") from None

    def named(key: str) -> int | None:
        token = settings.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        return vocab.token_to_id(token) if isinstance(token, str) else None

    if "bos_token_id" in config or "eos_token_id" in config:
        bos, eos = config.get("bos_token_id"), _first(config.get("eos_token_id"))
    else:
        bos, eos = named("bos_token"), named("eos_token")
    prefix, suffix = _post_processor_specials(vocab)
    stops = generation.get("eos_token_id", config.get("eos_token_id", eos))
    with open(file, encoding="utf-8") as f:
        text = f.read()
    return TokenizerSource(json=text, bos_id=bos, eos_id=eos,
                           stop_ids=[s for s in _as_list(stops) if s is not None],
                           prefix=prefix, suffix=suffix,
                           chat_template=_chat_template(folder, settings))


def _post_processor_specials(vocab) -> tuple[list[int], list[int]]:
    """The ids a tokenizer's post-processor puts before and after a text."""
    probe = "a b"
    plain = vocab.encode(probe, add_special_tokens=False).ids
    full = vocab.encode(probe, add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start], full[start + len(plain):]
    raise ValueError("the tokenizer's post-processor changes a text's own ids; only one that "
                     "adds ids before or after a text is supported")


def _chat_template(folder: str, settings: dict) -> str | None:
    path = os.path.join(folder, CHAT_TEMPLATE_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    template = settings.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}]
        template = {t.get("name"): t.get("template") for t in template}.get("default")
    return template if isinstance(template, str) else None


def _first(value):
    return value[0] if isinstance(value, list) and value else value


def _as_list(value) -> list:
    return list(value) if isinstance(value, list) else [value]


def _json_beside(folder: str, name: str) -> dict:
    path = os.path.join(folder, name)
    return read_json_object(path) if os.path.isfile(path) else {}


def load_tokenizer(path: str, bos_id: int | None = None,
                   eos_id: int | None = None) -> Tokenizer:
    """"bytes", or a tokenizer.json (or a folder holding one) with the conventions
    `read_tokenizer_folder` finds beside it; a `bos_id` given starts every text with it, an
    `eos_id` given ends documents and generations."""
    if path == ByteTokenizer.name:
        return ByteTokenizer()
    found = read_tokenizer_folder(path)
    if found is None:
        raise ValueError(f"no tokenizer at {path!r}: give 'bytes', a tokenizer.json or "
                         "a folder holding one")
    return HFTokenizer(tokenizer_file(path), found.bos_id if bos_id is None else bos_id,
                       found.eos_id if eos_id is None else eos_id,
                       prefix=found.prefix if bos_id is None else [bos_id],
                       suffix=found.suffix,
                       stop_ids=found.stop_ids if eos_id is None else [eos_id],
                       chat_template=found.chat_template)


def data_fields(spec: str | dict | None, workdir: str) -> dict | None:
    """The data config fields (tokenizer, bos_id, eos_id) that encode text as a checkpoint's
    tokenizer `spec` does (its file relative to `workdir`); None for a checkpoint without one.
    A recorded BOS prefix is given as `bos_id`; no prefix leaves the folder's conventions."""
    if spec is None:
        return None
    if spec == ByteTokenizer.name:
        return {"tokenizer": ByteTokenizer.name, "bos_id": UNSET_ID, "eos_id": UNSET_ID}
    if isinstance(spec, dict) and spec.get("kind") == HFTokenizer.name:
        prefix = _prefix(spec)
        return {"tokenizer": os.path.abspath(os.path.join(workdir, spec["file"])),
                "bos_id": prefix[0] if prefix else UNSET_ID,
                "eos_id": UNSET_ID if spec.get("eos_id") is None else spec["eos_id"]}
    raise ValueError(f"unknown tokenizer {spec!r} in the checkpoint of {workdir}")


def _prefix(spec: dict) -> list[int]:
    """The ids a workdir's tokenizer puts before a text. Workdirs written before conventions
    were recorded prepended the BOS (their models were trained so)."""
    if "prefix" in spec:
        return list(spec["prefix"])
    return [] if spec.get("bos_id") is None else [spec["bos_id"]]


def workdir_tokenizer(meta: dict, workdir: str) -> Tokenizer:
    """The tokenizer a workdir's checkpoint metadata records (bytes where it records none)."""
    return get_tokenizer(meta.get("tokenizer", ByteTokenizer.name), workdir)


def get_tokenizer(spec: str | dict, workdir: str | None = None) -> Tokenizer:
    """The tokenizer a config or checkpoint names: "bytes", or {"kind": "hf", "file": ...,
    "bos_id": ..., "eos_id": ..., "prefix": ..., "suffix": ...} (`HFTokenizer.spec`) with the
    file relative to `workdir`; the ids that end a generation and the chat template come from
    the files beside it (`read_tokenizer_folder`)."""
    if spec == ByteTokenizer.name:
        return ByteTokenizer()
    if isinstance(spec, dict) and spec.get("kind") == HFTokenizer.name:
        path = os.path.join(workdir or ".", spec["file"])
        found = read_tokenizer_folder(path) if os.path.isfile(path) else None
        return HFTokenizer(path, spec.get("bos_id"), spec.get("eos_id"), prefix=_prefix(spec),
                           suffix=spec.get("suffix", ()),
                           stop_ids=found.stop_ids if found and "prefix" in spec else None,
                           chat_template=found.chat_template if found else None)
    if spec is None:
        raise ValueError(NO_TOKENIZER)
    raise ValueError(f"unknown tokenizer {spec!r}; available: '{ByteTokenizer.name}' or a "
                     "Hugging Face tokenizer.json imported by tools/convert.py")
