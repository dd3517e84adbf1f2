"""The input pipeline's speed: building the token cache against the `tokenizers` library's own
batch encoding of the same texts, opening a cached corpus, and reading one training batch.

    python bench/data_bench.py --config tiny_code --config.data.tokenizer=runs/bpe

Each figure is the best of --repeats; the cache is built in a fresh temporary folder each time
(the corpus is read from its files, tokenized, written), the library encodes texts already in
memory. A batch read is what each train step adds: rows gathered from the memory-mapped cache.
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import tempfile
import time

import numpy as np
from absl import app, flags

from specjax.cli.decoding import require_positive_flags
from specjax.cli.entrypoint import define_config, parse_flags, run_cli
from specjax.cli.flags import define_output_flags
from specjax.data import BatchSampler, Corpus, DataConfig, iter_documents
from specjax.training.config import config_reference

__doc__ += "\n" + config_reference()  # `--help` lists the config fields too

_CONFIG = define_config(None, "The config whose data section is measured (and "
                        "train.batch_size).")
define_output_flags(repeats=3, output_json=False)
flags.mark_flags_as_required(["config"])


def best(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        tick = time.perf_counter()
        function()
        times.append(time.perf_counter() - tick)
    return min(times)


def bench(config, repeats: int) -> None:
    data = DataConfig.from_dict(config.data)
    tokenizer = data.make_tokenizer()
    texts = [text for _, text in iter_documents(data)]
    def encode():
        return tokenizer.encode_batch(texts, add_special_tokens=True, add_eos=True)

    tokens = sum(len(ids) for ids in encode())
    library = best(encode, repeats)
    build = best(lambda: Corpus.build(DataConfig.from_dict(
        {**config.data, "cache_dir": tempfile.mkdtemp()}), tokenizer), repeats)
    cached = tempfile.mkdtemp()
    corpus = Corpus.build(DataConfig.from_dict({**config.data, "cache_dir": cached}), tokenizer)
    opened = best(lambda: Corpus.build(DataConfig.from_dict(
        {**config.data, "cache_dir": cached}), tokenizer), repeats)
    sampler = BatchSampler(corpus.train, config.train.batch_size, seed=0)
    rng = np.random.default_rng(0)
    read = best(lambda: sampler.batch(int(rng.integers(0, 10**6))), repeats * 10)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"{len(texts)} documents, {mb:.1f} MB, {tokens / 1e6:.2f} M tokens "
          f"({mb * 1e6 / tokens:.2f} bytes/token) with {data.tokenizer!r}")
    print(f"encode_batch alone (texts in memory): {tokens / library / 1e6:.2f} M tokens/s")
    print(f"token cache built (files read, tokenized, written): {tokens / build / 1e6:.2f} M "
          f"tokens/s = {library / build:.2f}x of encode_batch alone")
    print(f"cached corpus opened in {opened * 1e3:.1f} ms; one batch of "
          f"{config.train.batch_size} x {data.seq_len + 1} tokens read in {read * 1e6:.0f} us")


def main(argv):
    del argv

    def run() -> None:
        require_positive_flags("repeats")  # best() of no repeats
        bench(_CONFIG.value, flags.FLAGS.repeats)

    run_cli(run)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
