"""Ranks a workdir's token ids by frequency so that its drafters draft over part of the
vocabulary (`specjax/decoding/draft_vocab.py`): the N most frequent ids of the workdir's
training data (or of --texts_file) are stored in the workdir (`draft_vocab.json`) and N becomes
its decoding default (`calibrated_decoding.json`; `--draft_vocab 0` drafts over every id
again). Verification keeps the full head, so the output is unchanged; the draft head shrinks
from V rows to N.

On a head's workdir it counts its base's data with its base's tokenizer and stores the ranking
in the head's workdir, which decoding from there reads before the base's. An EAGLE-3 head with
a reduced vocabulary (a published head's d2t, whatever version of specjax imported it) ranks
only its own ids: --size N keeps the N most frequent of them, and more than it has is refused.

    python infer/draft_vocab.py --workdir runs/smollm2 --size 8192
    python infer/draft_vocab.py --workdir runs/tiny --texts_file code.jsonl --size 64
    python infer/draft_vocab.py --workdir runs/eagle_imported --size 16384
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import numpy as np
from absl import app, flags

from specjax.cli.decoding import require_positive_flags
from specjax.cli.entrypoint import parse_flags, run_cli
from specjax.cli.flags import define_model_flags
from specjax.cli.texts import define_texts_flags, given_texts
from specjax.config import ModelConfig
from specjax.data import heldout_data, iter_documents
from specjax.heads.eagle import drafted_ids
from specjax.io.calibrated_defaults import write_calibrated
from specjax.io.checkpoint import Checkpointer, load_model_config
from specjax.io.draft_vocab import rank_ids, within, write_ranking
from specjax.loading import load_model
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
    cfg, meta, model_workdir, own = ranked_model(FLAGS.workdir)
    if FLAGS.size > cfg.vocab_size:
        raise ValueError(f"--size={FLAGS.size} exceeds the model's {cfg.vocab_size} ids")
    if own is not None and FLAGS.size > len(own):
        raise ValueError(f"--size={FLAGS.size} exceeds the {len(own)} ids the EAGLE-3 head in "
                         f"{FLAGS.workdir} drafts (its d2t)")
    tokenizer = workdir_tokenizer(meta, model_workdir)
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

    ranking = rank_ids(rows(), cfg.vocab_size, cfg.vocab_size)
    if counted == 0:
        raise ValueError(f"{source} holds no tokens to count")
    ranking = (ranking if own is None else within(ranking, own))[:FLAGS.size]
    record = {"source": source, "tokens": counted, "size": FLAGS.size}
    path = write_ranking(FLAGS.workdir, ranking, record)
    write_calibrated(FLAGS.workdir, meta["step"], {"draft_vocab": FLAGS.size},
                     {"draft_vocab": record})
    print(f"{FLAGS.size} most frequent of {cfg.vocab_size if own is None else len(own)} ids "
          f"in {counted} tokens of {source} "
          f"-> {path}; drafters with a vocabulary head now draft over them by default "
          "(--draft_vocab 0: every id)")


def ranked_model(workdir: str) -> tuple[ModelConfig, dict, str, np.ndarray | None]:
    """The model whose ids `workdir` ranks (a head's: its base's); the metadata its text and
    tokenizer come from (a head's base's, with the head's step, which its calibrated defaults
    are for); the workdir its tokenizer files lie in; the ids an EAGLE-3 head there drafts
    (None: every id)."""
    head = Checkpointer(workdir, create=False).read_meta()
    if "base" not in head:
        return (*load_model_config(workdir), workdir, None)
    base = head["base"]["workdir"]
    cfg, meta = load_model_config(base)
    eagle = load_model(workdir).draft_weights.get("eagle")
    return (cfg, {**meta, "step": head["step"]}, base,
            None if eagle is None else drafted_ids(eagle.params))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
