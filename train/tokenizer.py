"""Trains a byte-level BPE tokenizer.json (Hugging Face `tokenizers`) on a config's training
documents, as a model of your own would ship one.

    python train/tokenizer.py --config tiny_code --vocab_size 4096 \\
        --output_dir runs/bpe

Only the training split is read (the validation documents stay unseen). Ids 0 and 1 are the
special tokens <s> (BOS) and </s> (EOS); a tokenizer_config.json beside tokenizer.json names
them, and tokenizer.json's post-processor starts every text with BOS (as Llama's does), so
`data.tokenizer=runs/bpe` finds them as it does in a Hugging Face checkpoint. Writes
into a new (or empty) --output_dir only.
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import json
import os

from absl import app, flags
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from specjax.cli.entrypoint import define_config, parse_flags, run_cli
from specjax.data import DataConfig, is_validation_key, iter_documents
from specjax.outputs import staged_dir
from specjax.training.config import config_reference

__doc__ += "\n" + config_reference()  # `--help` lists the config fields too

_CONFIG = define_config(None, "The config whose data section names the documents.")
_VOCAB = flags.DEFINE_integer("vocab_size", 4096, "Ids in the tokenizer, the two special "
                              "tokens included (>= 258: every byte has one).", lower_bound=258)
_OUTPUT = flags.DEFINE_string("output_dir", None, "New or empty folder for tokenizer.json and "
                              "tokenizer_config.json.")
flags.mark_flags_as_required(["config", "output_dir"])

SPECIAL = ("<s>", "</s>")


def train_tokenizer(data: DataConfig, vocab_size: int, output_dir: str) -> int:
    """Writes the tokenizer into `output_dir` (made whole in a temporary folder beside it,
    then renamed); returns its vocabulary size."""
    if os.path.exists(output_dir) and (not os.path.isdir(output_dir) or os.listdir(output_dir)):
        raise ValueError(f"--output_dir {output_dir!r} exists and is not an empty folder")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    texts = (text for key, text in iter_documents(data)
             if not is_validation_key(key, data.val_fraction))
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{SPECIAL[0]} $A", pair=f"{SPECIAL[0]} $A {SPECIAL[0]} $B",
        special_tokens=[(SPECIAL[0], bpe.token_to_id(SPECIAL[0]))])
    with staged_dir(output_dir) as staging:
        bpe.save(os.path.join(staging, "tokenizer.json"))
        with open(os.path.join(staging, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({"bos_token": SPECIAL[0], "eos_token": SPECIAL[1]}, f)
    return bpe.get_vocab_size()


def main(argv):
    del argv
    data = run_cli(lambda: DataConfig.from_dict(_CONFIG.value.data))
    size = run_cli(lambda: train_tokenizer(data, _VOCAB.value, _OUTPUT.value))
    print(f"wrote a {size}-id byte-level BPE tokenizer to {_OUTPUT.value}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
