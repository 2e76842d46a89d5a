"""The GPUs a prediction knows, as data: vendor datasheet figures (dense, no structured sparsity).

Memory bandwidth in GB/s, dense tensor-core peaks in TFLOP/s for bf16 and fp8 (None where the part has
no fp8 tensor cores: a fp8 model then computes at the bf16 rate), memory as the vendor's nominal GB (read as
GiB, NOMINAL_GB_BYTES), and the per-direction
GPU-to-GPU bandwidth a tensor-parallel all-reduce crosses (NVLink / Infinity Fabric where the part has it,
else PCIe). The figures are the vendors' published ones, not measured here; the calibration (calibration.py)
turns them into what an engine reaches.
"""

from __future__ import annotations

import math
import re

from dataclasses import dataclass

from dflash_convert.errors import UsageError


# A datasheet's "80 GB" of HBM is 80 GiB, not 80e9 bytes: an H100 80GB reports 81,559 MiB to CUDA (85.5e9 bytes),
# 80 x 2^30 = 85.9e9 is 0.4 % above it (an H200's 143,771 MiB against 141 x 2^30: 0.4 %). One rule for every GPU
# and for --gpu-spec mem=: the nominal figure times 2^30 bytes.
NOMINAL_GB_BYTES = 2 ** 30


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bandwidth_gbps: float
    bf16_tflops: float
    fp8_tflops: float | None
    memory_gb: float  # the vendor's nominal GB (0: not known)
    link_gbps: float  # one direction, to the other GPUs of a tensor-parallel group

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * NOMINAL_GB_BYTES

    def peak_tflops(self, compute: str) -> float:
        """The dense peak for `compute` ("bf16" or "fp8"); fp8 without fp8 tensor cores runs at the bf16 rate."""
        return self.fp8_tflops if compute == "fp8" and self.fp8_tflops else self.bf16_tflops


# name: bandwidth GB/s, bf16 TFLOP/s, fp8 TFLOP/s, memory (nominal GB), link GB/s (one direction). Vendor datasheets:
# NVIDIA H100/H200/H20/A100/A800/L40S/L4/RTX 4090/RTX PRO 6000 Blackwell/B200/GB200 product pages and
# datasheets, AMD Instinct MI300X/MI355X datasheets (dense figures: the sparse ones halved).
GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("H100-SXM", 3350, 989, 1979, 80, 450),
    GPU("H100-PCIe", 2000, 756, 1513, 80, 64),
    GPU("H200", 4800, 989, 1979, 141, 450),
    GPU("H20", 4000, 148, 296, 96, 450),
    GPU("A100-40GB", 1555, 312, None, 40, 300),
    GPU("A100-80GB", 2039, 312, None, 80, 300),
    GPU("A800", 2039, 312, None, 80, 200),
    GPU("L40S", 864, 362, 733, 48, 32),
    GPU("L4", 300, 121, 242, 24, 32),
    GPU("RTX-4090", 1008, 165, 330, 24, 32),
    GPU("RTX-PRO-6000", 1792, 504, 1008, 96, 64),
    GPU("B200", 8000, 2250, 4500, 180, 900),
    GPU("GB200", 8000, 2500, 5000, 186, 900),
    GPU("MI300X", 5300, 1307, 2615, 192, 448),
    GPU("MI355X", 8000, 2517, 5033, 288, 448),
)}

# Spellings users type for the same part: case, spaces, dashes, underscores and the vendor's words fold away (_fold),
# and these aliases name the table's parts. The long ones are the names the drivers report (nvidia-smi's "NVIDIA H100
# 80GB HBM3" is the SXM part, "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090"; amd-smi's "AMD Instinct MI300X"), so
# that a name pasted from the machine finds its part. Other variants of a part (H100 NVL, H200 NVL, A100 PCIe 80GB)
# have other figures and stay unknown: --gpu-spec describes them.
ALIASES = {"H100": "H100-SXM", "H100-80GB": "H100-SXM", "H100-SXM5": "H100-SXM", "A100": "A100-80GB",
           "A800-80GB": "A800", "4090": "RTX-4090", "RTXPRO6000": "RTX-PRO-6000", "RTX-PRO-6000-BLACKWELL":
           "RTX-PRO-6000", "H200-SXM": "H200", "H20-96GB": "H20",
           "H100-80GB-HBM3": "H100-SXM", "H100-SXM5-80GB": "H100-SXM", "H100-SXM-80GB": "H100-SXM",
           "A100-SXM4-80GB": "A100-80GB", "A100-SXM4-40GB": "A100-40GB", "A800-SXM4-80GB": "A800",
           "RTX-PRO-6000-BLACKWELL-SERVER-EDITION": "RTX-PRO-6000",
           "RTX-PRO-6000-BLACKWELL-WORKSTATION-EDITION": "RTX-PRO-6000", "H200-141GB": "H200"}
VENDOR_WORDS = ("NVIDIA", "GEFORCE", "TESLA", "AMD", "INSTINCT")
# Aliases that name a family of which the table has more than one part: the part taken, and the others' names.
# The drivers' long names (H100 80GB HBM3: the SXM part) name one part and are not here.
VARIANTS = {"H100": ("H100-SXM", "H100-PCIe"), "H100-80GB": ("H100-SXM", "H100-PCIe"),
            "A100": ("A100-80GB", "A100-40GB")}


def _fold(name: str) -> str:
    """A GPU name as compared: upper case, the vendor's words dropped, no separators ("rtx 4090", "RTX4090",
    "NVIDIA GeForce RTX 4090" and "RTX-4090" are one name; validate's list flags drop the spaces of a name)."""
    words = re.split(r"[\s_\-]+", name.strip().upper())
    folded = "".join(w for w in words if w not in VENDOR_WORDS)
    # validate's list flags drop spaces: "NVIDIA GeForce RTX 4090" arrives as NVIDIAGEFORCERTX4090
    while (vendor := next((v for v in VENDOR_WORDS if folded.startswith(v) and folded != v), None)) is not None:
        folded = folded[len(vendor):]
    return folded


def gpu(name: str, flag: str = "--gpu", spec_flag: str | None = "--gpu-spec") -> GPU:
    """The table's GPU for a name as a user writes it; an unknown name is a usage error naming the flag it was
    given with (`flag`) and listing the known ones, and pointing to `spec_flag` where the command has one."""
    folded = _fold(name)
    by_folded = {_fold(n): g for n, g in GPUS.items()}
    aliases = {_fold(a): _fold(n) for a, n in ALIASES.items()}
    found = by_folded.get(folded) or by_folded.get(aliases.get(folded, ""))
    if found is None:
        spec = (f" (or describe it with {spec_flag} name=...,bw=GB/s,bf16=TFLOP/s[,fp8=TFLOP/s][,mem=GB]"
                "[,link=GB/s])") if spec_flag else ""
        raise UsageError(f"{flag} {name}: unknown GPU; known: {', '.join(GPUS)}{spec}")
    return found


# --gpu-spec's figures: key -> (least, most, unit). Wide around the table's spread (bandwidth 300-8,000 GB/s,
# bf16 121-2,517 and fp8 242-5,033 TFLOP/s, memory 24-288 GB, link 32-900 GB/s) to admit parts not yet made, and
# narrow enough that a typo's 1e-300 or 1e9 is refused rather than predicted as 0.0 tok/s.
SPEC_BOUNDS: dict[str, tuple[float, float, str]] = {
    "bw": (1, 100_000, "GB/s"), "bf16": (0.1, 100_000, "TFLOP/s"), "fp8": (0.1, 100_000, "TFLOP/s"),
    "mem": (1, 10_000, "GB"), "link": (1, 100_000, "GB/s")}


def gpu_from_spec(text: str) -> GPU:
    """A GPU described on the command line: `name=X,bw=GB/s,bf16=TFLOP/s[,fp8=..][,mem=GB][,link=GB/s]`."""
    fields: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--gpu-spec {text}: expected key=value items, got {item!r}")
        if key.strip().lower() in fields:  # which one was meant is not ours to guess
            raise UsageError(f"--gpu-spec {text}: {key.strip().lower()} is given twice")
        fields[key.strip().lower()] = value.strip()
    unknown = set(fields) - {"name", *SPEC_BOUNDS}
    if unknown:
        raise UsageError(f"--gpu-spec {text}: unknown key {', '.join(sorted(unknown))} (name, bw, bf16, fp8, mem, "
                         "link)")
    if "name" in fields and not (fields["name"].isprintable() and fields["name"]):
        raise UsageError(f"--gpu-spec name {fields['name']!r}: not a printable, non-empty name (the table's heading)")
    missing = [k for k in ("bw", "bf16") if k not in fields]
    if missing:
        raise UsageError(f"--gpu-spec {text}: {' and '.join(missing)} missing (bw in GB/s, bf16 in TFLOP/s)")
    try:
        numbers = {k: float(v) for k, v in fields.items() if k != "name"}
    except ValueError:
        raise UsageError(f"--gpu-spec {text}: bw, bf16, fp8, mem and link are numbers") from None
    if any(not math.isfinite(v) or v <= 0 for v in numbers.values()):  # nan passes a `<= 0` test
        raise UsageError(f"--gpu-spec {text}: every figure must be a positive finite number")
    for key, value in numbers.items():
        least, most, unit = SPEC_BOUNDS[key]
        if not least <= value <= most:
            raise UsageError(f"--gpu-spec {text}: {key} must be in [{least:g}, {most:,g}] {unit}, got {value:g}")
    return GPU(fields.get("name", "custom"), numbers["bw"], numbers["bf16"], numbers.get("fp8"),
               numbers.get("mem", 0.0), numbers.get("link", 64.0))


def variant_note(name: str, flag: str = "--gpu") -> str | None:
    """A note where `name` picks one of several parts of the table (A100: the 80 GB one; H100: the SXM one), saying
    which was taken and how to name the others; None where the name is one part's."""
    folded = _fold(name)
    taken, *others = next((parts for alias, parts in VARIANTS.items() if _fold(alias) == folded), (None,))
    if taken is None:
        return None
    return (f"{flag} {name}: taken as {taken}, the figures of that part; name {' or '.join(others)} for the other "
            f"{'part' if len(others) == 1 else 'parts'}")
