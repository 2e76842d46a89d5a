"""Memory plan: will the draft and the target fit, known before anything is loaded.

Weights: parameter counts from the safetensors headers times the size of the dtype they will be
loaded in (floating tensors take the run's dtype; integer tensors keep theirs). Runtime: the
target's KV cache for the longest sequence of the run, the draft's context cache, and the largest
activations of one forward (prefill hidden states and MLP, attention scores, float32 logits),
plus a fixed allowance for the libraries' own allocations. Free memory: MemAvailable from
/proc/meminfo (psutil where /proc is absent), bounded by a cgroup memory limit when one is set;
on CUDA, torch.cuda.mem_get_info per GPU.

No torch is imported for CPU plans; nothing is read beyond JSON configs and safetensors headers.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_convert.io.reading import read_json

from dflash_convert.format import catalogue, quantization
from dflash_convert.io.checkpoint import Checkpoint, weight_headers
from dflash_convert.format.dtypes import DTYPES, code_for_name, compute_name
from dflash_convert.format.mapping import TargetInfo, target_info
from dflash_convert.io.safetensors import TensorInfo

LIBRARY_ALLOWANCE = 384 << 20  # torch/transformers allocations beyond tensors (allocator slack, kernels)
GB = 1e9


def _fmt(n: int) -> str:
    return f"{n / GB:.2f} GB" if n >= 0.1 * GB else f"{n / 2**20:.0f} MB"


# ----------------------------------------------------------------------------- what is there

def itemsize(dtype: str) -> int:
    """Bytes per element of a --dtype name (float32, bfloat16, ...)."""
    return DTYPES[code_for_name(dtype)].itemsize


def config_dtype(raw: dict[str, Any]) -> str | None:
    """The checkpoint's own compute dtype from its config (`dtype`, older `torch_dtype`, or a text_config's)."""
    for cfg in (raw, raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}):
        for key in ("dtype", "torch_dtype"):
            value = cfg.get(key)
            if isinstance(value, str):
                code = code_for_name(value.removeprefix("torch."))
                return DTYPES[code].torch if code else None
    return None


def stored_dtype(tensors: dict[str, TensorInfo]) -> str | None:
    """The compute dtype of the code most floating bytes are stored in (when a config names none)."""
    by: dict[str, int] = {}
    for t in tensors.values():
        if t.dtype in DTYPES and DTYPES[t.dtype].is_float:
            by[t.dtype] = by.get(t.dtype, 0) + t.nbytes
    return compute_name(max(by, key=by.get)) if by else None


def draft_tensors(ckpt: Checkpoint) -> list[TensorInfo]:
    """The draft's tensors as the runtime holds them: a quantized module's weight as its dequantized float."""
    return quantization.memory_plan_tensors(ckpt.quantized_modules(), ckpt.tensors,
                                            catalogue.expected_shapes(ckpt.spec))


def bytes_at(tensors, dtype: str) -> int:
    """Bytes of these tensors once loaded with floating ones cast to `dtype`."""
    size = itemsize(dtype)
    return sum(t.numel * (size if DTYPES[t.dtype].is_float else DTYPES[t.dtype].itemsize) for t in tensors)


def runtime_bytes(target: TargetInfo, draft_layers: int, draft_kv_width: int, *, dtype: str,
                  sequence: int, block: int, logit_rows: int | None = None, scores: bool = True) -> int:
    """KV caches and the largest activations of a batch-1 run over `sequence` positions. `logit_rows`: the most
    rows of logits one forward keeps (a prefill keeps its last row, a verify its block, the greedy check its new
    tokens in chunks; None: every position). `scores`: whether attention materializes its [heads, q, k] scores
    (eager attention does; sdpa's CPU and CUDA kernels do not: a prefill of 8192 tokens with 32 heads peaked 70 MB
    above the weights, where the scores alone are 8.6 GB)."""
    size = itemsize(dtype)
    hidden, layers, vocab = target.hidden_size, target.num_layers, target.vocab_size
    heads, kv_heads, head_dim = target.num_attention_heads, target.num_key_value_heads, target.head_dim
    inter = target.intermediate_size
    kv = 2 * layers * kv_heads * head_dim * sequence * size * 2  # x2: a cache grown by concatenation is copied
    draft_kv = 2 * draft_layers * draft_kv_width * sequence * size
    activations = (sequence * (4 * hidden + 3 * inter) * size  # one layer's hidden, attention and MLP buffers
                   + (heads * sequence * sequence * 4 if scores else 0)  # attention scores (float32), eager
                   + 3 * max(sequence if logit_rows is None else logit_rows, block) * vocab * 4)  # float32 logits,
    # their softmax and a copy
    return kv + draft_kv + activations


# ----------------------------------------------------------------------------- what is free

def _cgroup_limit() -> int | None:
    """Bytes this process may still allocate under a cgroup v2/v1 memory limit, or None."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            return max(int(limit) - usage, 0)
    return None


def cpu_available() -> int | None:
    """Bytes a new allocation can get without swapping: MemAvailable (or psutil), within a cgroup limit."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    if available is None:
        try:
            import psutil

            available = int(psutil.virtual_memory().available)
        except ImportError:
            return None
    limit = _cgroup_limit()
    return min(available, limit) if limit is not None else available


def device_available(device: str) -> int | None:
    """Free bytes on `device` ('cpu', 'cuda', 'cuda:1'), None when unknown."""
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        free, _ = torch.cuda.mem_get_info(index)
        return int(free)
    return cpu_available()


def placement_budget(max_memory: dict[str, int] | None) -> dict[str, int | None]:
    """Per-device bytes a device map may use: --max-memory where given, else what is free (GPUs, then CPU)."""
    if max_memory:
        return dict(max_memory)
    budget: dict[str, int | None] = {}
    if "torch" in sys.modules:  # GPUs exist only for a process that uses torch (CPU plans never import it)
        import torch

        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                budget[str(i)] = device_available(f"cuda:{i}")
    budget["cpu"] = cpu_available()
    return budget


# ----------------------------------------------------------------------------- the plan

@dataclass
class MemoryPlan:
    device: str
    draft_dtype: str
    draft_bytes: int
    target_dtype: str | None = None
    target_bytes: int = 0
    runtime_bytes: int = 0
    available: int | None = None  # free bytes on `device` (where the draft runs)
    device_map: str | None = None
    budget: dict[str, int | None] = field(default_factory=dict)  # device-map runs: per-device budget
    alternatives: dict[str, int] = field(default_factory=dict)  # option -> bytes needed with it

    @property
    def needed(self) -> int:
        return self.draft_bytes + self.target_bytes + self.runtime_bytes + LIBRARY_ALLOWANCE

    @property
    def needed_here(self) -> int:
        """Bytes that must fit on `device`: all of it, or with a device map (the target spills to other
        devices, CPU memory, then disk) the draft, the caches and the activations."""
        return self.needed - (self.target_bytes if self.device_map else 0)

    @property
    def fits(self) -> bool:
        return self.available is None or self.needed_here <= self.available

    def parts(self) -> list[str]:
        parts = [f"draft {_fmt(self.draft_bytes)} {self.draft_dtype}"]
        if self.target_dtype is not None:
            parts += [f"target {_fmt(self.target_bytes)} {self.target_dtype}",
                      f"KV cache + activations {_fmt(self.runtime_bytes)}"]
        return parts + [f"libraries {_fmt(LIBRARY_ALLOWANCE)}"]

    def where(self) -> str:
        if not self.device_map:
            return self.device
        budget = ", ".join(f"{k} {'free memory' if v is None else _fmt(v)}" for k, v in self.budget.items())
        return f"{self.device} (device map {self.device_map}: {budget}, then disk)"

    def describe(self) -> str:
        free = "unknown" if self.available is None else _fmt(self.available)
        return f"{' + '.join(self.parts())} = {_fmt(self.needed)}; {free} free on {self.where()}"

    def refusal(self) -> str:
        """The one line said when the run does not fit (before anything is loaded)."""
        options = [f"{opt} (needs {_fmt(n)})" if n else opt for opt, n in self.alternatives.items()]
        return (f"not enough memory on {self.where()}: the run needs {_fmt(self.needed_here)} ({', '.join(self.parts())}),"
                f" {_fmt(self.available or 0)} free; options: " + "; ".join(options))


def plan(draft_tensors: list[TensorInfo], draft_dtype: str, *, device: str, target_dir: Path | None = None,
         target_dtype: str | None = None, draft_layers: int = 0, draft_kv_width: int = 0, sequence: int = 0,
         block: int = 16, device_map: str | None = None, max_memory: dict[str, int] | None = None,
         logit_rows: int | None = None, attention: str | None = None) -> MemoryPlan:
    """The plan for a run that loads the draft (and the target when `target_dir` is given); `attention`: the
    target's attn_implementation as asked (None: what the runtime picks, sdpa where its model supports it)."""
    p = MemoryPlan(device=device, draft_dtype=draft_dtype, draft_bytes=bytes_at(draft_tensors, draft_dtype))
    if target_dir is not None:
        cfg_file = Path(target_dir) / "config.json"
        target = target_info(read_json(cfg_file), str(target_dir), file=str(cfg_file))
        target_tensors = list(weight_headers(target_dir).values())
        p.target_dtype = target_dtype
        p.target_bytes = bytes_at(target_tensors, target_dtype)
        p.runtime_bytes = runtime_bytes(target, draft_layers, draft_kv_width, dtype=target_dtype,
                                        sequence=sequence, block=block, logit_rows=logit_rows,
                                        scores=not _fused_attention(target, attention))
    p.available = device_available(device)
    if device_map is not None:
        p.device_map = device_map
        p.budget = placement_budget(max_memory)
    if not p.fits:
        if target_dir is not None:
            for smaller in ("bfloat16",):
                if itemsize(smaller) < max(itemsize(target_dtype), itemsize(draft_dtype)):
                    alt = plan(draft_tensors, smaller, device=device, target_dir=target_dir, target_dtype=smaller,
                               draft_layers=draft_layers, draft_kv_width=draft_kv_width, sequence=sequence,
                               block=block, logit_rows=logit_rows, attention=attention)
                    p.alternatives[f"--dtype {smaller}"] = alt.needed
            if device_map is None:
                p.alternatives["--device-map auto (the target spills to CPU memory, then disk)"] = 0
            p.alternatives["--levels static,numeric"] = p.draft_bytes + LIBRARY_ALLOWANCE  # the draft only
        elif itemsize("bfloat16") < itemsize(draft_dtype):
            p.alternatives["--dtype bfloat16"] = (bytes_at(draft_tensors, "bfloat16") + LIBRARY_ALLOWANCE)
        if not p.alternatives:
            p.alternatives["--levels static (headers only)"] = 0
    return p


def _fused_attention(target: TargetInfo, attention: str | None) -> bool:
    """Whether the target's attention runs a fused kernel that never holds the [heads, q, k] scores: sdpa (asked,
    or picked because its config's transformers class supports it) or flash / flex attention. Eager, and a class
    not found, count the scores (the estimate errs towards refusing)."""
    if attention is not None:
        return attention != "eager"
    try:
        import transformers

        name = next((a for a in target.architectures if hasattr(transformers, a)), None)
        return bool(name) and bool(getattr(getattr(transformers, name), "_supports_sdpa", False))
    except Exception:  # noqa: BLE001 (no verdict rides on it: the estimate then counts the scores)
        return False


def parse_max_memory(text: str) -> dict[str, int]:
    """`0=20GiB,cpu=30GiB` or `cpu=200MB` -> {'0': bytes, 'cpu': bytes} (GPU indices, cpu)."""
    from dflash_convert.io.safetensors import parse_size

    out: dict[str, int] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or not (key == "cpu" or key.isdigit()):
            raise ValueError(f"{item!r}: expected DEVICE=SIZE with DEVICE a GPU index or cpu (e.g. 0=20GiB,cpu=30GiB)")
        try:
            out[key] = parse_size(value)
        except ValueError as exc:
            raise ValueError(f"{item!r}: {exc}") from None
        if out[key] <= 0 or not math.isfinite(out[key]):
            raise ValueError(f"{item!r}: the size must be positive")
    if not out:
        raise ValueError("empty --max-memory")
    return out
