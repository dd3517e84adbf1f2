"""Converts Hugging Face checkpoints (Llama, Mistral, Qwen2/3, SmolLM3, Phi-3, Gemma-2/3 text,
Mamba-2, Bamba: docs/guide/huggingface.md) and Llama-family GGUF files to specjax workdirs and
back, and imports published drafters for a model (Medusa heads, EAGLE-3 heads).

    python tools/convert.py --hf_dir path/to/hf_model --workdir runs/imported [--dtype float32]
    python tools/convert.py --hf_id HuggingFaceTB/SmolLM2-135M --workdir runs/smollm2_hf
    python tools/convert.py --gguf path/to/model.gguf --workdir runs/imported
    python tools/convert.py --to_hf --workdir runs/tiny --hf_dir exported/tiny
    python tools/convert.py --hf_dir path/to/medusa_heads --base_workdir runs/imported \
        --workdir runs/medusa_imported
    python tools/convert.py --hf_dir path/to/eagle3_head --base_workdir runs/imported \
        --workdir runs/eagle_imported
"""

import specjax.cli.early_interrupt  # noqa: F401  (first: Ctrl-C during the imports)

# isort: split

import os

from absl import app, flags

from specjax.cli.entrypoint import parse_flags, refuse_flags, run_cli
from specjax.cli.flags import define_model_flags
from specjax.config import DTYPES, ModelConfig
from specjax.convert.hf import export_checkpoint, import_checkpoint
from specjax.convert.hub import checkpoint_folder
from specjax.outputs import check_destinations
from specjax.training.heads.eagle import import_eagle, is_eagle3
from specjax.training.heads.medusa import import_medusa

flags.DEFINE_string("hf_dir", None, "Hugging Face checkpoint directory (read, or written with "
                    "--to_hf).")
flags.DEFINE_string("hf_id", None, "A Hugging Face Hub id (org/name) to import instead of "
                    "--hf_dir: downloaded, or found in the cache (HF_HUB_CACHE), with "
                    "huggingface_hub; a model or, with --base_workdir, its drafter.")
flags.DEFINE_string("gguf", None, "A GGUF file to import instead of --hf_dir (Llama family; "
                    "its tensors dequantized to --dtype, its tokenizer from its metadata; needs "
                    "the `gguf` package).")
define_model_flags()
flags.DEFINE_bool("to_hf", False, "Export the workdir's latest weights to --hf_dir.")
flags.DEFINE_enum("dtype", None, sorted(DTYPES), "Parameter and compute dtype of the "
                  "imported model, or of the exported weights (default: the checkpoint's).")
flags.DEFINE_float("max_shard_gb", 4.0, "Export: largest safetensors shard.")
flags.DEFINE_bool("overwrite", False, "Export: replace a non-empty --hf_dir (never mixed: the new "
                  "checkpoint is written beside it and swapped in).")
flags.DEFINE_enum("tokenizer", None, ["bytes"], "Import: record specjax's byte tokenizer (for a "
                  "checkpoint without tokenizer.json).")
flags.DEFINE_string("base_workdir", None, "Import a drafter instead: --hf_dir holds Medusa-1 "
                    "heads (config.json, medusa_lm_head.safetensors) or an EAGLE-3 head "
                    "(config.json, model.safetensors) trained on this workdir's model; --workdir "
                    "becomes the drafter's workdir.")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    run_cli(_check_sources)
    if FLAGS.to_hf:
        files = run_cli(_export)
        print(f"wrote {', '.join(files)} to {FLAGS.hf_dir}")
    elif FLAGS.base_workdir:
        print(run_cli(_import_drafter))
    else:
        cfg = run_cli(_import)
        print(f"imported a {cfg.num_layers}-layer model ({cfg.param_dtype}) into {FLAGS.workdir}")


def _check_sources() -> None:
    if FLAGS.gguf is not None and (FLAGS.to_hf or FLAGS.base_workdir):
        raise ValueError("--gguf imports a model: it takes no --to_hf or --base_workdir")
    if FLAGS.hf_id is not None and FLAGS.to_hf:
        raise ValueError("--hf_id names a checkpoint to import: --to_hf writes to --hf_dir")
    if [FLAGS.hf_dir, FLAGS.gguf, FLAGS.hf_id].count(None) != 2:
        raise ValueError("give --hf_dir (or, to import, a Hub id with --hf_id or a GGUF file "
                         "with --gguf instead)")


def _source() -> dict[str, str]:
    """The checkpoint to import, by its flag: --hf_id's id as its local folder (downloaded,
    or found in the cache), else --gguf or --hf_dir."""
    if FLAGS.hf_id is not None:
        return {"--hf_id": checkpoint_folder(FLAGS.hf_id)}
    return {"--gguf": FLAGS.gguf} if FLAGS.gguf else {"--hf_dir": FLAGS.hf_dir}


def _export() -> list[str]:
    refuse_flags(("tokenizer",), "an import")
    refuse_flags(("base_workdir",), "an import of a drafter")
    if FLAGS.max_shard_gb <= 0:
        raise ValueError(f"--max_shard_gb={FLAGS.max_shard_gb:g} must be > 0")
    check_destinations({"--hf_dir": FLAGS.hf_dir}, {"--workdir": FLAGS.workdir}, folders=True)
    return export_checkpoint(FLAGS.workdir, FLAGS.hf_dir,
                             max_shard_bytes=int(FLAGS.max_shard_gb * 2**30),
                             overwrite=FLAGS.overwrite, dtype=FLAGS.dtype)


def _import_drafter() -> str:
    """Imports the drafter in --hf_dir (EAGLE-3 or Medusa, from its config.json); what was
    imported."""
    refuse_flags(("max_shard_gb", "overwrite", "dtype", "tokenizer"), "a model's conversion")
    if os.path.isfile(FLAGS.workdir):
        raise ValueError(f"--workdir {FLAGS.workdir} is a file, not a directory")
    source = _source()
    check_destinations({"--workdir": FLAGS.workdir},
                       {**source, "--base_workdir": FLAGS.base_workdir}, folders=True)
    folder = next(iter(source.values()))
    if is_eagle3(folder):
        layers = import_eagle(folder, FLAGS.base_workdir, FLAGS.workdir)
        return (f"imported an EAGLE-3 head on layers {','.join(map(str, layers))} into "
                f"{FLAGS.workdir} (decode with --strategy eagle)")
    heads = import_medusa(folder, FLAGS.base_workdir, FLAGS.workdir)
    return f"imported {heads} Medusa heads into {FLAGS.workdir} (decode with --strategy medusa)"


def _import() -> ModelConfig:
    refuse_flags(("max_shard_gb", "overwrite"), "an export (--to_hf)")
    if os.path.isfile(FLAGS.workdir):
        raise ValueError(f"--workdir {FLAGS.workdir} is a file, not a directory")
    source = _source()
    check_destinations({"--workdir": FLAGS.workdir}, source, folders=True)
    return import_checkpoint(next(iter(source.values())), FLAGS.workdir, dtype=FLAGS.dtype,
                             tokenizer=FLAGS.tokenizer)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
