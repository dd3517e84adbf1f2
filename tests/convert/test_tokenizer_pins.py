"""The tokenizer's conventions pinned where the fresh audit's plants got past
tests/convert/test_tokenizer_conventions.py and the stop-string tests (whose tokenizers are
byte-level): a SentencePiece-style vocabulary, read against transformers' own table."""

import pytest

from specjax.tokenizer import HFTokenizer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

# A Llama-2 style vocabulary: "▁" marks a word's leading space, <0xNN> byte-fallback tokens.
VOCAB = ["<unk>", "<s>", "</s>", "<0x41>", "<0x0A>", "▁the", "the", "▁", "re", "▁re", "é",
         *"abcdef"]


def _sentencepiece_file(path) -> str:
    from tokenizers import Tokenizer, decoders, models, normalizers

    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(VOCAB)}, merges=[],
                                     unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                                 normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                           decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    file = str(path / "tokenizer.json")
    tokenizer.save(file)
    return file


def test_a_sentencepiece_tokens_bytes_keep_its_leading_space(tmp_path):
    """Each id's bytes in a text (`token_bytes`, what stop strings are matched over) are
    transformers' `StopStringCriteria.clean_tokenizer_vocab`'s: "▁the" is b" the", "<0x41>" is
    b"A", "é" is its two UTF-8 bytes. Catches the decoder's text of a token stripped (the
    leading space of every word-initial SentencePiece token lost: a stop string "\\n the"
    never matched, one " the" never seen at a word start)."""
    from transformers.generation.stopping_criteria import StopStringCriteria

    file = _sentencepiece_file(tmp_path)
    table = HFTokenizer(file).token_bytes()
    by_hand = {"▁the": b" the", "the": b"the", "▁": b" ", "▁re": b" re", "<0x41>": b"A",
               "<0x0A>": b"\n", "é": "é".encode()}
    assert {t: table[VOCAB.index(t)] for t in by_hand} == by_hand
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=file)
    tokens, indices = StopStringCriteria.clean_tokenizer_vocab(theirs)
    assert dict(enumerate(table)) == {
        i: token.encode() for i, token in zip(indices, tokens, strict=True)}
