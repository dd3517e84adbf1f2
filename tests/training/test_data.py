import json
import os

import numpy as np
import pytest

from specjax import data as D
from specjax.tokenizer import ByteTokenizer, get_tokenizer


def test_byte_tokenizer_round_trips_unicode():
    tok = ByteTokenizer()
    text = "def f(x):\n    return 'é→λ'\n"
    ids = tok.encode(text, add_special_tokens=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == text
    assert tok.vocab_size == 259 and max(ids) < tok.vocab_size
    with pytest.raises(ValueError, match="unknown tokenizer"):
        get_tokenizer("sentencepiece")


def test_stdlib_corpus_excludes_tests_and_site_packages():
    keys = [key for key, _ in D.iter_documents(D.DataConfig())]
    assert len(keys) > 200 and all(k.endswith(".py") for k in keys)
    parts = {p for k in keys for p in os.path.dirname(k).split(os.sep)}
    assert not parts & {"test", "tests", "site-packages"}
    assert "os.py" in keys and "json/__init__.py" in keys


def test_split_is_deterministic_and_disjoint():
    cfg = D.DataConfig(val_fraction=0.1)

    def split():
        keys = [key for key, _ in D.iter_documents(cfg)]
        flags = [D.is_validation_key(key, 0.1) for key in keys]
        return ([k for k, f in zip(keys, flags, strict=True) if not f],
                [k for k, f in zip(keys, flags, strict=True) if f], len(keys))

    (train_a, val_a, count), (train_b, val_b, _) = split(), split()
    assert train_a == train_b and val_a == val_b
    assert not set(train_a) & set(val_a)
    assert len(train_a) + len(val_a) == count
    assert 0.03 < len(val_a) / count < 0.2
    texts = dict(D.iter_documents(cfg))
    assert list(D.validation_texts(cfg)) == [texts[key] for key in val_a]
    # The assignment is a pure function of the key, independent of the other documents.
    for key in val_a[:5]:
        assert D.is_validation_key(key, 0.1)


def test_corpus_packs_bos_doc_eos_streams_into_windows(tmp_path):
    """Catches packing that drops the BOS/EOS between documents, overlaps windows or mixes
    validation documents into the training stream."""
    texts = [f"doc{i}" * (i + 1) for i in range(16)]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    corpus = D.Corpus.build(D.DataConfig(source="files", files=(str(path),), seq_len=4,
                                         val_fraction=0.5, cache_dir=str(tmp_path / "cache")))
    for packed, validation in ((corpus.train, False), (corpus.validation, True)):
        stream = [t for i, text in enumerate(texts)
                  if D.is_validation_key(f"{path}:{i}", 0.5) == validation
                  for t in (256, *text.encode(), 257)]
        assert packed.shape == (len(stream) // 5, 5)
        assert np.asarray(packed).flatten().tolist() == stream[:packed.size]


def test_sampler_is_a_pure_function_of_seed_and_index():
    sequences = np.arange(10 * 3).reshape(10, 3)
    a, b = D.BatchSampler(sequences, 4, seed=7), D.BatchSampler(sequences, 4, seed=7)
    order = [a.batch(4 * i) for i in range(6)]
    # Random access (as after a resume) gives the same batches as sequential access.
    for i in (5, 2, 0, 4):
        np.testing.assert_array_equal(b.batch(4 * i), order[i])
    # A different batch size reads the same stream from the same position.
    wide = D.BatchSampler(sequences, 8, seed=7)
    np.testing.assert_array_equal(wide.batch(8), np.concatenate(order[2:4]))
    # Each epoch is a permutation: the first 10 rows drawn cover every sequence once.
    first_epoch = np.concatenate(order)[:10, 0] // 3
    assert sorted(first_epoch.tolist()) == list(range(10))
    assert not np.array_equal(D.BatchSampler(sequences, 4, seed=8).batch(0), order[0])


def test_local_jsonl_and_text_files(tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(json.dumps({"body": f"document number {i}\n" * 20})
                               for i in range(30)))
    text = tmp_path / "notes.txt"
    text.write_text("plain text file\n" * 50)
    cfg = D.DataConfig(source="files", files=(str(jsonl), str(text)), text_field="body",
                       seq_len=16, val_fraction=0.2)
    corpus = D.Corpus.build(cfg)
    assert corpus.train.shape[1] == 17 and len(corpus.train) > 0 and len(corpus.validation) > 0
    with pytest.raises(ValueError, match="no field 'text'"):
        list(D.iter_documents(D.DataConfig(source="files", files=(str(jsonl),))))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(D.iter_documents(D.DataConfig(source="files",
                                           files=(str(tmp_path / "missing.txt"),))))


def test_max_documents_and_config_errors():
    assert len(list(D.iter_documents(D.DataConfig(max_documents=7)))) == 7
    with pytest.raises(ValueError, match="data.files must list"):
        D.DataConfig(source="files")
    with pytest.raises(ValueError, match="data.hub_name must be set"):
        D.DataConfig(source="hub")


@pytest.mark.parametrize("meta", [{}, {"config": None}, {"config": {"decoding": {}}},
                                  {"config": {"data": None}}])
def test_a_checkpoint_naming_no_data_reads_as_none_or_the_default_corpus(meta):
    """An imported model's metadata (no data section, or a null one) is `run_data` None and
    `heldout_data` the default corpus, for every caller (bench, search, exit report, the auto
    tree). Catches the six readers' drift back: one crashing on a null config, one giving the
    default corpus where the caller must know the checkpoint named none."""
    assert D.run_data(meta) is None
    assert D.heldout_data(meta) == D.DataConfig()


def test_a_checkpoints_data_section_is_read_as_its_run_config_reads_it():
    """A run's data section reads as `DataConfig.from_dict` (comma-separated files split, its
    checks applied). Catches a reader building `DataConfig(**section)` (files kept as one
    string; a bad section not refused in one line)."""
    meta = {"config": {"data": {"source": "files", "files": "a.jsonl, b.txt", "seq_len": 64}}}
    assert D.run_data(meta) == D.DataConfig(source="files", files=("a.jsonl", "b.txt"),
                                            seq_len=64)
    assert D.heldout_data(meta) == D.run_data(meta)
    with pytest.raises(ValueError, match=r"^data.seq_len=1 must be >= 2$"):
        D.run_data({"config": {"data": {"seq_len": 1}}})


def test_a_bad_jsonl_line_is_the_same_error_from_a_corpus_and_a_prompts_file(tmp_path):
    """One JSONL reader (`data.jsonl_rows`) under the training corpus and `--prompts_file`:
    a broken line is "path:N: not valid JSON (...)" from both, and bytes that are not UTF-8
    are refused in a prompt but read (as U+FFFD, warned) in a corpus. Catches the two
    readers drifting apart again (the corpus once said "path, line N: not a JSON object",
    the prompts "path:N: not valid JSON")."""
    from specjax.cli.decoding import read_prompts_file

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a", "prompt": "a"}\n\n{oops\n')
    corpus = D.DataConfig(source="files", files=(str(broken),))
    for read in (lambda: list(D.iter_documents(corpus)), lambda: read_prompts_file(str(broken))):
        with pytest.raises(ValueError, match=rf"^{broken}:3: not valid JSON \(Expecting"):
            read()
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"text": "caf\xe9", "prompt": "caf\xe9"}\n')
    assert [text for _, text in D.iter_documents(D.DataConfig(
        source="files", files=(str(latin1),)))] == ["caf\ufffd"]
    with pytest.raises(ValueError, match=rf"^{latin1}:1: not UTF-8 text$"):
        read_prompts_file(str(latin1))


def test_a_gzipped_jsonl_file_reads_through_the_same_reader(tmp_path):
    """`jsonl_rows` reads a .gz file (HumanEval's prompts) line by line with the same errors.
    Catches the prompt sets keeping readers of their own (a bad packaged line a bare
    JSONDecodeError) or a .gz path read as compressed bytes."""
    import gzip

    path = tmp_path / "set.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'{"prompt": "a"}\n\n{"prompt": "b"}\n{oops\n')
    rows = D.jsonl_rows(str(path))
    assert [next(rows), next(rows)] == [(1, {"prompt": "a"}), (3, {"prompt": "b"})]
    with pytest.raises(ValueError, match=rf"^{path}:4: not valid JSON"):
        next(rows)
