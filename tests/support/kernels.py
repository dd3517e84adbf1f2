"""The builds of the CPU kernels the kernel tests run."""

from specjax.kernels import library

# Builds of each CPU kernel the tests run: this machine's, and on an AVX-512 CPU also the
# 8-lane build CPUs without it use (their code paths differ).
KERNEL_BUILDS = ["native"] + (["no-avx512"] if " avx512f" in library.cpu_signature() else [])


def kernel_build(kernel, build: str) -> str:
    """The FFI target of a `KERNEL_BUILDS` build of `kernel` (a `specjax.kernels` module),
    built and registered on first use."""
    if build == "native":
        return kernel.TARGET
    target = f"{kernel.TARGET}_{build.replace('-', '_')}"
    assert library.load(kernel.SOURCE, kernel.SYMBOL, target, (*library.FLAGS, "-mno-avx512f"))
    return target
