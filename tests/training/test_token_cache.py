"""Data in the model's own tokenizer: BPE round trips, BOS/EOS at pack boundaries, the split,
the on-disk token cache (reused, rebuilt when the documents change, never half-written), and
the sources at real sizes (globs, Parquet, a `datasets` folder)."""

import json
import os

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from specjax import data as D
from specjax.tokenizer import HFTokenizer, load_tokenizer
from tests.support import ROOT
from tests.support.scripts import run_script

TEXTS = [f"def function_{i}(value):\n    return value * {i} + 'é→λ'\n" * (i % 4 + 1)
         for i in range(40)]


def write_bpe_tokenizer(folder, vocab_size: int = 300) -> HFTokenizer:
    """A byte-level BPE tokenizer.json trained on `TEXTS` (ids 0 and 1: <s> and </s>) whose
    post-processor puts a BOS before every text, with a tokenizer_config.json naming them, as
    Llama's Hugging Face checkpoints ship; returns it loaded."""
    os.makedirs(folder, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXTS, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)])
    bpe.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<s>", "eos_token": {"content": "</s>"}}, f)
    return load_tokenizer(str(folder))


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return write_bpe_tokenizer(tmp_path_factory.mktemp("bpe"))


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def test_bpe_round_trips_and_finds_bos_eos_beside_it(bpe):
    """Catches BOS/EOS ids read from the wrong file (or not at all) and an encoding that adds
    the tokenizer's own template or loses text."""
    assert (bpe.bos_id, bpe.eos_id, bpe.vocab_size) == (0, 1, 300)
    for text in TEXTS[:5]:
        ids = bpe.encode(text, add_special_tokens=True, add_eos=True)
        assert ids[0] == 0 and ids[-1] == 1 and 0 not in ids[1:-1]
        assert bpe.decode(ids[1:-1]) == text
    assert [list(x) for x in bpe.encode_batch(TEXTS[:3])] == [list(bpe.encode(t))
                                                             for t in TEXTS[:3]]


def test_streams_pack_documents_between_bos_and_eos_and_keep_the_split(bpe, tmp_path):
    """Catches validation documents in the training stream, and pack boundaries without the
    model's BOS/EOS."""
    path = _jsonl(tmp_path / "docs.jsonl", TEXTS)
    cfg = D.DataConfig(source="files", files=(path,), seq_len=16, val_fraction=0.3,
                       tokenizer=str(tmp_path), cache_dir=str(tmp_path / "cache"))
    (tmp_path / "tokenizer.json").write_bytes(open(bpe.path, "rb").read())
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    corpus = D.Corpus.build(cfg)
    for packed, validation in ((corpus.train, False), (corpus.validation, True)):
        expected = [int(t) for i, text in enumerate(TEXTS)
                    if D.is_validation_key(f"{path}:{i}", 0.3) == validation
                    for t in bpe.encode(text, add_special_tokens=True, add_eos=True)]
        assert np.asarray(packed).ravel().tolist() == expected[:packed.size]


def test_the_cache_is_reused_and_rebuilt_when_a_file_changes(bpe, tmp_path, monkeypatch):
    """Catches a second run that tokenizes again, and a cache that survives a change of its
    documents (stale tokens)."""
    path = _jsonl(tmp_path / "docs.jsonl", TEXTS)
    cfg = D.DataConfig(source="files", files=(path,), seq_len=16, val_fraction=0.3,
                       cache_dir=str(tmp_path / "cache"))
    first = D.Corpus.build(cfg, bpe)
    calls = []
    real = bpe.encode_batch
    monkeypatch.setattr(bpe, "encode_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    second = D.Corpus.build(cfg, bpe)
    assert not calls
    np.testing.assert_array_equal(first.train, second.train)
    assert isinstance(second.train.base, np.memmap) or isinstance(second.train, np.memmap)
    _jsonl(tmp_path / "docs.jsonl", TEXTS[::-1])
    D.Corpus.build(cfg, bpe)
    assert calls


def test_an_interrupted_build_leaves_no_cache(bpe, tmp_path, monkeypatch):
    """Catches a cache folder that exists before its tokens are complete (the next run would
    train on a truncated corpus)."""
    path = _jsonl(tmp_path / "docs.jsonl", TEXTS * 30)  # several batches of documents
    cfg = D.DataConfig(source="files", files=(path,), seq_len=16,
                       cache_dir=str(tmp_path / "cache"))
    real, seen = bpe.encode_batch, []

    def failing(texts, **options):
        seen.append(1)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return real(texts, **options)

    monkeypatch.setattr(bpe, "encode_batch", failing)
    with pytest.raises(KeyboardInterrupt):
        D.Corpus.build(cfg, bpe)
    assert os.listdir(tmp_path / "cache" / "tokens") == []
    monkeypatch.setattr(bpe, "encode_batch", real)
    assert len(D.Corpus.build(cfg, bpe).train) > 0


def test_globs_parquet_and_a_local_datasets_folder_read_the_same_documents(tmp_path):
    """Catches a source that drops or reorders documents (their keys decide the split), and a
    glob that is not expanded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "shards"
    folder.mkdir()
    for shard in range(2):
        pq.write_table(pa.table({"body": TEXTS[shard * 20:(shard + 1) * 20]}),
                       folder / f"part-{shard}.parquet")
    parquet = D.DataConfig(source="files", files=(str(folder / "*.parquet"),),
                           text_field="body", cache_dir=str(tmp_path / "cache"))
    assert [t for _, t in D.iter_documents(parquet)] == TEXTS
    assert D.source_identity(parquet)["files"][1][0].endswith("part-1.parquet")
    local = tmp_path / "dataset"
    local.mkdir()
    _jsonl(local / "train.jsonl", TEXTS)
    hub = D.DataConfig(source="hub", hub_name=str(local), cache_dir=str(tmp_path / "cache"))
    assert [t for _, t in D.iter_documents(hub)] == TEXTS
    # Keys name the dataset's path, so the split of 40 documents varies with tmp_path: at
    # val_fraction .05 it left no validation document in one run of eight.
    split = D.DataConfig(**{**hub.__dict__, "seq_len": 32, "val_fraction": 0.5})
    assert len(D.Corpus.build(split).train) > 0


@pytest.mark.parametrize("files, message", [
    (("{tmp}/nothing-*.jsonl",), "match no file"),
    (("{tmp}/empty.txt",), "is empty"),
    (("{tmp}/wrong.jsonl",), "wrong.jsonl:1: no field 'text'"),
    (("{tmp}/broken.jsonl",), "broken.jsonl:2: not valid JSON"),
])
def test_bad_data_files_are_one_line_errors(tmp_path, files, message):
    """Catches a bad data file reaching a traceback (or an empty corpus) instead of naming
    the file."""
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "wrong.jsonl").write_text('{"body": "x"}\n')
    (tmp_path / "broken.jsonl").write_text('{"text": "x"}\n{oops\n')
    cfg = D.DataConfig(source="files", files=tuple(f.format(tmp=tmp_path) for f in files),
                       cache_dir=str(tmp_path / "cache"))
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        D.Corpus.build(cfg, load_tokenizer("bytes"))
    assert not os.path.exists(tmp_path / "cache" / "tokens") or not os.listdir(
        tmp_path / "cache" / "tokens")


def test_the_data_bench_runs(tmp_path):
    """Catches the data bench's command failing (it is the docs' tokenization figure)."""
    result = run_script("bench/data_bench.py", "--config",
                        os.path.join(ROOT, "tests", "configs", "tiny.py"), "--repeats=1",
                        "--config.data.max_documents=20")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "x of encode_batch alone" in result.stdout and "read in" in result.stdout
