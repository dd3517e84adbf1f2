"""Ranks a workdir's token ids by frequency so that its drafters draft over part of the
vocabulary (`specjax/decoding/draft_vocab.py`): the N most frequent ids of the workdir's
training data (or of --texts_file) are stored in the workdir (`draft_vocab.json`) and N becomes
its decoding default (`calibrated_decoding.json`; `--draft_vocab 0` drafts over every id
again). Verification keeps the full head, so the output is unchanged; the draft head shrinks
from V rows to N.

    python infer/draft_vocab.py --workdir runs/smollm2 --size 8192
    python infer/draft_vocab.py --workdir runs/tiny --texts_file code.jsonl --size 64
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

from absl import app, flags

from specjax.cli.decoding import require_positive_flags
from specjax.cli.entrypoint import parse_flags, run_cli
from specjax.cli.flags import define_model_flags
from specjax.cli.texts import define_texts_flags, given_texts
from specjax.data import heldout_data, iter_documents
from specjax.io.calibrated_defaults import write_calibrated
from specjax.io.checkpoint import load_model_config
from specjax.io.draft_vocab import rank_ids, write_ranking
from specjax.outputs import check_writable
from specjax.tokenizer import workdir_tokenizer

define_model_flags()
flags.DEFINE_integer("size", None, "How many ids to draft over (N).")
define_texts_flags("Text to count ids in", "the documents of the workdir's training data, else "
                   "of the embedded corpus")
flags.DEFINE_integer("max_tokens", 2_000_000, "Count ids in at most this many tokens.")
flags.mark_flags_as_required(["workdir", "size"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    run_cli(run)


def run() -> None:
    require_positive_flags("size", "max_tokens")
    check_writable(FLAGS.workdir, f"--workdir {FLAGS.workdir}")
    cfg, meta = load_model_config(FLAGS.workdir)
    if FLAGS.size > cfg.vocab_size:
        raise ValueError(f"--size={FLAGS.size} exceeds the model's {cfg.vocab_size} ids")
    tokenizer = workdir_tokenizer(meta, FLAGS.workdir)
    texts, source = given_texts(), FLAGS.texts_file
    if texts is None:
        data = heldout_data(meta)
        texts = (text for _, text in iter_documents(data))
        source = f"the {data.source!r} data"
    counted = 0

    def rows():
        nonlocal counted
        for text in texts:
            ids = tokenizer.encode(text)[:FLAGS.max_tokens - counted]
            counted += len(ids)
            yield ids
            if counted >= FLAGS.max_tokens:
                return

    ranking = rank_ids(rows(), cfg.vocab_size, FLAGS.size)
    if counted == 0:
        raise ValueError(f"{source} holds no tokens to count")
    record = {"source": source, "tokens": counted, "size": FLAGS.size}
    path = write_ranking(FLAGS.workdir, ranking, record)
    write_calibrated(FLAGS.workdir, meta["step"], {"draft_vocab": FLAGS.size},
                     {"draft_vocab": record})
    print(f"{FLAGS.size} most frequent of {cfg.vocab_size} ids in {counted} tokens of {source} "
          f"-> {path}; drafters with a vocabulary head now draft over them by default "
          "(--draft_vocab 0: every id)")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
