"""`--device {auto,cpu,cuda}` and `--dtype {float32,bfloat16,float16}` as torch objects."""

from __future__ import annotations

import torch

from dflash_convert.format.dtypes import CAST_TARGETS, code_for_name, torch_dtype
from dflash_convert.errors import UsageError


def resolve_device(name: str = "auto") -> torch.device:
    """auto = cuda when present, else cpu; asking for cuda without one is a usage error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise UsageError(f"--device {name!r}: choose auto, cpu or cuda")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine")
    return torch.device(name)


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """A compute dtype by name (the dtype table's cast targets: float32, bfloat16, float16, or fp32, bf16, fp16)."""
    if isinstance(name, torch.dtype):
        return name
    code = code_for_name(name)
    if code is None:
        *rest, last = CAST_TARGETS
        raise UsageError(f"--dtype {name!r}: choose {', '.join(rest)} or {last}")
    return torch_dtype(code)
