"""The embedded default: a byte-level Llama trained on the Python standard library's source.

Sized to train in minutes on a 2-core CPU with early exits good enough for self-speculation.
    python train/train.py --config tiny_code --workdir runs/tiny

Variant `smoke`: a 4-layer model of width 64 trained for 100 short steps (about 20 s on 2
cores), whose first exit already drafts: the README's smoke run and the notebooks' test size.
    python train/train.py --config tiny_code:smoke --workdir runs/smoke

Variant `peer25m`: a 25.8M-parameter model (8 layers, width 512, MHA) for the peer benchmark
against Hugging Face transformers, trained briefly (400 steps of 8 x 256 bytes, ~30 min on 2 cores).
    python train/train.py --config tiny_code:peer25m --workdir runs/peer25m

Variant `draft`: a separate draft model for the default (`--strategy draft --draft_workdir`):
4 layers of width 128 (0.77M parameters, an eighth of the default), same bytes and corpus.
    python train/train.py --config tiny_code:draft --workdir runs/draft
    python train/train.py --config tiny_code:draft --workdir runs/draft_distilled \
        --config.distill.teacher_workdir=runs/tiny

Variant `hybrid`: Mamba-2 and attention layers (three Mamba-2 layers, then one attention layer,
twice; Bamba-style layers with an MLP each), the default's width, exits and training.
    python train/train.py --config tiny_code:hybrid --workdir runs/hybrid

Variant `mamba2`: eight Mamba-2 layers without MLPs (Mamba2ForCausalLM's layout, expand 2).
    python train/train.py --config tiny_code:mamba2 --workdir runs/mamba2

Variant `standin`: a stand-in for a public checkpoint (the recipe in the README): a plain 12-layer
Llama (13.5M parameters, 54 MB in float32: more than a CPU's last-level cache, as every real
checkpoint is) on a 2,048-id BPE tokenizer, trained without LayerSkip (loss at the last exit,
no layer dropout), then exported to Hugging Face format.
    python train/tokenizer.py --config tiny_code --vocab_size 2048 --output_dir runs/bpe
    python train/train.py --config tiny_code:standin --workdir runs/standin
    python tools/convert.py --to_hf --workdir runs/standin --hf_dir runs/standin_hf

Variant `continual`: LayerSkip continual pretraining of --config.init.source (a Hugging Face
directory or a workdir): the source's model and tokenizer, early exits 1 and 2 supervised
beside the last, their loss warmed up over the first 50 steps.
    python train/train.py --config tiny_code:continual \
        --config.init.source=runs/standin_hf --workdir runs/continual

Variant `smollm2`: LayerSkip continual training of SmolLM2-135M-Instruct (30 layers, imported
from its GGUF into runs/smollm2, docs/guide/real-checkpoint.md) on the embedded corpus: exits 4
and 8 supervised beside the last, each early exit's target mostly the last layer's distribution
(self-distilled, `layerskip.exit_distill`), a learning rate low enough to keep the last layer's
loss near the checkpoint's; 80 steps of 8 x 256 tokens (about an hour on 2 cores).
`smollm2_gpu`: the same at a GPU's size (2,000 steps of 32 x 1,024 tokens in 4 micro-steps,
bfloat16 compute; about 22 minutes on an H200).
    python train/train.py --config tiny_code:smollm2 --workdir runs/smollm2_ls

Variant `smollm2_draft`: a draft model for SmolLM2 (4 layers of width 256 on its 49,152-id
tokenizer, 16M parameters: a draft token costs about a ninth of a SmolLM2 token) distilled
from it (DistillSpec) on the embedded corpus.
    python train/train.py --config tiny_code:smollm2_draft --workdir runs/smollm2_draft

Variant `gpu1b`: a 1.0B-parameter Llama (22 layers of width 2048, GQA 16:8) in bfloat16 for one
GPU: the train step's model-FLOPs utilisation, then a short run whose early exits draft.
    python bench/step_bench.py --config tiny_code:gpu1b
    python train/train.py --config tiny_code:gpu1b --workdir runs/gpu1b
"""

import ml_collections

from specjax.training.config import decoding_section

VARIANTS = ("", "smoke", "peer25m", "draft", "hybrid", "mamba2", "standin", "continual", "gpu1b",
            "smollm2", "smollm2_gpu", "smollm2_draft")
SMOLLM2 = "runs/smollm2"  # SmolLM2-135M-Instruct imported from its GGUF


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"unknown config variant {variant!r}; available: "
                         + ", ".join(repr(v) for v in VARIANTS if v))
    config = ml_collections.ConfigDict()
    config.model = ml_collections.ConfigDict(dict(
        vocab_size=259, d_model=256, num_layers=8, num_heads=4, num_kv_heads=2, mlp_dim=704,
        rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=True, dtype="float32",
        param_dtype="float32", init_std=0.02,
        # The early-exit loss supervises the two draft candidates and the final exit. Measured
        # (300 steps): exit-1/exit-2 agreement with the final layer .830/.887 versus .785/.836
        # when all 8 exits share the loss, for a final loss of 1.371 versus 1.337 nats/byte.
        exit_layers=(1, 2, 8),
        # DeepSeek-V3's multi-token-prediction modules trained with the model (0: none): they
        # then draft for it (--strategy mtp), their loss weighted by layerskip.mtp_weight.
        mtp_depth=0))
    # source: "stdlib" (embedded), "files" (files: comma-separated paths or globs of .jsonl,
    # .parquet or text files) or "hub" (a `datasets` name or local dataset folder, streamed);
    # text_field names the JSONL/Parquet/hub column. tokenizer: "bytes" or a tokenizer.json (a
    # run on init.source takes the source's); bos_id/eos_id -1: the ones found beside it.
    config.data = ml_collections.ConfigDict(dict(
        source="stdlib", files="", hub_name="", hub_config="", hub_split="train",
        text_field="text", tokenizer="bytes", bos_id=-1, eos_id=-1, seq_len=256,
        val_fraction=0.05, max_documents=0, cache_dir=""))
    # Continual training: source = a Hugging Face checkpoint directory or a specjax workdir whose
    # weights are step 0 (its model and tokenizer replace the sections here).
    config.init = ml_collections.ConfigDict(dict(source=""))
    # Device mesh (data, fsdp, tensor); -1 = the devices the others leave. One device: (1, 1, 1).
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    config.train = ml_collections.ConfigDict(dict(
        batch_size=16, total_steps=300, learning_rate=2e-3, warmup_steps=40, min_lr_ratio=0.1,
        weight_decay=0.1, b1=0.9, b2=0.95, grad_clip=1.0, seed=0, eval_every=100,
        eval_batches=8, save_every=100, keep_checkpoints=3, log_every=10, remat="none",
        grad_accum=1, frozen="", feature_cache=""))
    # Layer dropout is available (p_max, dropout_schedule="exp" from scratch) but off: at this
    # scale p_max=0.1 left every exit's agreement unchanged and cost 0.012 nats of final loss.
    config.layerskip = ml_collections.ConfigDict(dict(
        p_max=0.0, dropout_schedule="constant", e_scale=1.0, exit_scale="uniform",
        curriculum="none", rotation_interval=1, e_scale_warmup=0, mtp_weight=0.3,
        exit_distill=0.0))
    # Defaults for infer/generate.py and bench/bench.py: draft with layers [0, exit_layer).
    config.decoding = decoding_section(exit_layer=1, num_draft=6)
    if variant == "draft":  # no early exits: it drafts with all of its layers
        config.model.update(d_model=128, num_layers=4, num_heads=2, num_kv_heads=1, mlp_dim=352,
                            exit_layers=(4,))
        # DistillSpec: --config.distill.teacher_workdir=runs/tiny trains it to the target's
        # distribution instead of the corpus' tokens.
        config.distill = ml_collections.ConfigDict(dict(teacher_workdir=""))
    if variant == "hybrid":
        config.model.update(layer_pattern=("mamba2", "mamba2", "mamba2", "attention") * 2,
                            ssm=ml_collections.ConfigDict(dict(
                                num_heads=8, head_dim=32, state_size=16, groups=1, conv_width=4,
                                chunk_size=64, mlp=True)))
    if variant == "mamba2":
        config.model.update(layer_pattern=("mamba2",) * 8,
                            ssm=ml_collections.ConfigDict(dict(
                                num_heads=16, head_dim=32, state_size=16, groups=1, conv_width=4,
                                chunk_size=64, mlp=False)))
    if variant == "gpu1b":
        config.model.update(d_model=2048, num_layers=22, num_heads=16, num_kv_heads=8,
                            mlp_dim=5632, dtype="bfloat16", param_dtype="bfloat16",
                            exit_layers=(2, 4, 22))
        config.data.update(seq_len=1024)
        config.train.update(batch_size=16, total_steps=600, learning_rate=3e-4, warmup_steps=60,
                            eval_every=200, save_every=200, log_every=20)
        config.decoding.update(exit_layer=4)
    if variant == "standin":
        config.model.update(vocab_size=2048, d_model=320, num_layers=12, num_heads=5,
                            num_kv_heads=1, mlp_dim=864, exit_layers=(12,))
        config.data.update(tokenizer="runs/bpe", seq_len=512)
        config.train.update(batch_size=32, total_steps=1000, learning_rate=1e-3,
                            warmup_steps=100, eval_every=250, save_every=250, log_every=50)
    if variant == "continual":
        config.data.update(seq_len=512)
        config.train.update(batch_size=32, total_steps=500, learning_rate=5e-4,
                            warmup_steps=50, eval_every=250, save_every=250, log_every=50)
        config.layerskip.update(e_scale_warmup=50)
    if variant in ("smollm2", "smollm2_gpu"):
        config.init.source = SMOLLM2
        config.model.update(exit_layers=(4, 8, 30))
        config.layerskip.update(exit_distill=0.8)
        config.train.update(batch_size=8, total_steps=80, learning_rate=5e-5, warmup_steps=8,
                            weight_decay=0.0, eval_every=40, eval_batches=4, save_every=20,
                            log_every=5)
        config.decoding.update(exit_layer=8, num_draft=4)
    if variant == "smollm2_gpu":
        config.model.update(dtype="bfloat16")
        config.data.update(seq_len=1024)
        # grad_accum 4: in one step the three 49,152-way exits' temporaries are 159.6 GiB, more
        # than an H200 holds; 4 micro-steps of 8 x 1,024 tokens estimate 42.6 GiB.
        config.train.update(batch_size=32, total_steps=2000, learning_rate=1e-4,
                            warmup_steps=100, eval_every=250, eval_batches=8, save_every=250,
                            log_every=50, grad_accum=4)
    if variant == "smollm2_draft":
        config.model.update(vocab_size=49152, exit_layers=(4,), num_layers=4)
        config.data.update(tokenizer=SMOLLM2)
        config.distill = ml_collections.ConfigDict(dict(teacher_workdir=SMOLLM2))
        config.train.update(batch_size=8, total_steps=500, warmup_steps=50, eval_every=250,
                            eval_batches=4, save_every=50, log_every=10)
        config.decoding.update(exit_layer=1, num_draft=4)
    if variant == "smoke":
        config.model.update(d_model=64, num_layers=4, num_heads=4, num_kv_heads=2, mlp_dim=176,
                            exit_layers=(1, 2, 4))
        config.data.update(seq_len=64, max_documents=300)
        config.train.update(batch_size=8, total_steps=100, warmup_steps=20, eval_every=100,
                            eval_batches=2, save_every=100, log_every=10)
    if variant == "peer25m":
        config.model.update(d_model=512, num_heads=8, num_kv_heads=8, mlp_dim=1408)
        config.train.update(batch_size=8, total_steps=400, warmup_steps=40, eval_every=100,
                            save_every=100)
    return config
