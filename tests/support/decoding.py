"""The independent greedy reference, the loop's state mid-decoding, and checks every drafter's
tests share (export for TPU and CUDA, EOS mid-draft)."""

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig


def per_step_argmax(generator, prompts, new: int) -> list[list[int]]:
    """The independent greedy reference: each prompt continued `new` tokens, one argmax of a
    full `model.forward` over the whole sequence per token (no cache, no loop, no drafter)."""
    from specjax.model import forward

    params = {**generator.params, "layers": jax.tree.map(lambda *w: jax.numpy.stack(w),
                                                        *generator.params["layers"])}
    width = max(map(len, prompts)) + new
    next_token = jax.jit(lambda sequence, length: jax.numpy.argmax(
        forward(params, generator.cfg, sequence[None])[0, length - 1]))
    out = []
    for prompt in prompts:
        sequence = list(prompt)
        for _ in range(new):
            padded = jax.numpy.asarray(sequence + [0] * (width - len(sequence)))
            sequence.append(int(next_token(padded, len(sequence))))
        out.append(sequence[len(prompt):])
    return out


def decode_rounds(params, draft_params, cfg: ModelConfig, drafter, prompts, lengths, *,
                  rounds: int, max_new_tokens: int, cache_len: int):
    """The greedy loop's state after its prefill and `rounds` rounds (one jitted program), for
    tests that inspect caches mid-decoding."""
    from specjax.decoding import loop
    from specjax.decoding.drafter import DraftContext

    @jax.jit
    def run(params, draft_params):
        ctx = DraftContext(params=params, draft_params=draft_params, sampling=None, cfg=cfg)
        key = jax.random.PRNGKey(0)
        state = loop.prefill(ctx, drafter, prompts, lengths, key, jax.numpy.int32(-1),
                             max_new_tokens=max_new_tokens, cache_len=cache_len)
        for _ in range(rounds):
            state = loop.decode_round(ctx, drafter, key, jax.numpy.int32(-1), state)
        return state

    return run(params, draft_params)


def export_decode_loop(params, draft_params, cfg: ModelConfig, drafter, *, sampled: bool = True,
                       max_new_tokens: int = 32, cache_len: int = 64,
                       draft_ids: int = 0) -> jax.export.Exported:
    """`drafter`'s jitted decode loop on `params` and `draft_params`, exported for TPU and CUDA
    from their shapes (2 prompts of 16 tokens, sampled or greedy; `draft_ids` ids drafted over
    when > 0), both platforms asserted: host-side work in a drafter (a Python list, a numpy
    search, a callback) fails here."""
    from specjax.decoding.loop import generate_tokens
    from specjax.decoding.sampling import SamplingParams

    def spec(tree):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
                            tree)

    fn = jax.jit(lambda p, d, prompts, lengths, key, sp, eos, ids: generate_tokens(
        p, d, prompts, lengths, key, sp, eos, ids, cfg=cfg, drafter=drafter,
        max_new_tokens=max_new_tokens, cache_len=cache_len))
    exported = jax.export.export(fn, platforms=("tpu", "cuda"))(
        spec(params), spec(draft_params), jax.ShapeDtypeStruct((2, 16), jnp.int32),
        jax.ShapeDtypeStruct((2,), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.uint32),
        spec(SamplingParams.create()) if sampled else None, jax.ShapeDtypeStruct((), jnp.int32),
        jax.ShapeDtypeStruct((draft_ids,), jnp.int32) if draft_ids else None)
    assert exported.platforms == ("tpu", "cuda")
    return exported


def check_eos_mid_draft(generator, prompts, strategy, max_new_tokens: int) -> None:
    """A token that first appears mid-output in row 0 becomes the EOS: `strategy` must end
    every row exactly where `ar` does (the EOS kept, nothing after it)."""
    full = generator.generate(prompts, max_new_tokens=max_new_tokens).tokens
    eos = next(t for i, t in enumerate(full[0]) if i >= 4 and t not in full[0][:i])
    expected = generator.generate(prompts, max_new_tokens=max_new_tokens, eos_id=eos).tokens
    assert expected[0][-1] == eos and len(expected[0]) < max_new_tokens
    assert generator.generate(prompts, max_new_tokens=max_new_tokens, eos_id=eos,
                              strategy=strategy).tokens == expected
