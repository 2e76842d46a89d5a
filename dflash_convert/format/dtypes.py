"""The one dtype table: every safetensors dtype code the project reads, and what each code means.

Per code: bytes per element, the torch dtype name, the numpy dtype that reads its values without
torch (ints, bool, IEEE floats), and for floats the raw-bit test for NaN/Inf: a value is non-finite
exactly when `bits & nan_mask == nan_value` (IEEE formats: all exponent bits set; float8_e4m3fn has
no Inf and its NaN is S.1111.111; the `fnuz` formats and e8m0 have a single NaN pattern, and the
`fnuz` formats no negative zero: their 0x80 is the NaN). Nothing
here imports torch; `torch_dtype` imports it on demand.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_convert.errors import DFlashError


@dataclass(frozen=True)
class DType:
    code: str  # safetensors header code
    itemsize: int  # bytes per element
    torch: str | None  # torch dtype attribute name (None: torch has no such dtype)
    kind: str  # "float", "int" or "bool"
    numpy: str | None = None  # numpy dtype reading the values without torch (None: numpy has none)
    nan_mask: int = 0  # floats: bits & nan_mask == nan_value <=> NaN or Inf
    nan_value: int = 0
    zero_mask: int | None = None  # floats: bits & zero_mask == 0 <=> +0 or -0 (None: no zero, e8m0)
    cast_target: bool = False  # a --dtype users may ask for (convert casts, the runtime computes in it)
    short: str | None = None  # the short spelling users also type (bf16, fp16, fp32)
    upper_half_of: str | None = None  # bf16 is the upper half of an f32: read its values through that

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def bits(self) -> str:
        """Unsigned integer numpy dtype of the same width: the raw-bit view of an element."""
        return {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}[self.itemsize]


DTYPES: dict[str, DType] = {d.code: d for d in (
    DType("F64", 8, "float64", "float", "<f8", 0x7FF0000000000000, 0x7FF0000000000000, (1 << 63) - 1),
    DType("F32", 4, "float32", "float", "<f4", 0x7F800000, 0x7F800000, 0x7FFFFFFF, cast_target=True, short="fp32"),
    DType("BF16", 2, "bfloat16", "float", None, 0x7F80, 0x7F80, 0x7FFF, cast_target=True, short="bf16",
          upper_half_of="F32"),
    DType("F16", 2, "float16", "float", "<f2", 0x7C00, 0x7C00, 0x7FFF, cast_target=True, short="fp16"),
    DType("F8_E4M3", 1, "float8_e4m3fn", "float", None, 0x7F, 0x7F, 0x7F),
    DType("F8_E5M2", 1, "float8_e5m2", "float", None, 0x7C, 0x7C, 0x7F),
    DType("F8_E4M3FNUZ", 1, "float8_e4m3fnuz", "float", None, 0xFF, 0x80, 0xFF),
    DType("F8_E5M2FNUZ", 1, "float8_e5m2fnuz", "float", None, 0xFF, 0x80, 0xFF),
    DType("F8_E8M0", 1, "float8_e8m0fnu", "float", None, 0xFF, 0xFF, None),
    DType("I64", 8, "int64", "int", "<i8"),
    DType("I32", 4, "int32", "int", "<i4"),
    DType("I16", 2, "int16", "int", "<i2"),
    DType("I8", 1, "int8", "int", "i1"),
    DType("U64", 8, "uint64", "int", "<u8"),
    DType("U32", 4, "uint32", "int", "<u4"),
    DType("U16", 2, "uint16", "int", "<u2"),
    DType("U8", 1, "uint8", "int", "u1"),
    DType("BOOL", 1, "bool", "bool", "?"),
)}
# --dtype choices, by torch name: float32, bfloat16, float16.
CAST_TARGETS: dict[str, str] = {d.torch: c for c, d in DTYPES.items() if d.cast_target}
# what a --dtype flag accepts: auto (each tensor/checkpoint its own), the torch names and the short ones
DTYPE_CHOICES: tuple[str, ...] = ("auto", *CAST_TARGETS, *(d.short for d in DTYPES.values() if d.cast_target))
_BY_TORCH = {d.torch: c for c, d in DTYPES.items() if d.torch}


def code_for_name(name: str) -> str | None:
    """Safetensors code of a --dtype spelling (float32, bfloat16, float16, fp32, bf16, fp16), else None."""
    for code, d in DTYPES.items():
        if d.cast_target and name in (d.torch, d.short):
            return code
    return None


def compute_name(code: str | None) -> str:
    """The --dtype a tensor of this code computes in: its own when it is a cast target, else float32."""
    d = DTYPES.get(code) if code else None
    return d.torch if d and d.cast_target else "float32"


def torch_dtype(code: str, *, tensor: str | None = None, file=None):
    """The torch dtype of a safetensors code; a one-line error naming the tensor when torch has none."""
    import torch

    d = DTYPES.get(code)
    found = getattr(torch, d.torch, None) if d and d.torch else None
    if found is None:
        what = f"tensor `{tensor}`: " if tensor else ""
        raise DFlashError(f"{what}dtype {code} has no torch equivalent in torch {torch.__version__}", file=file)
    return found


def code_for_torch(dtype, *, tensor: str | None = None, file=None) -> str:
    """Safetensors code of a torch dtype (pickle checkpoints); a one-line error for dtypes safetensors lacks."""
    name = str(dtype).removeprefix("torch.")
    if name not in _BY_TORCH:
        what = f"tensor `{tensor}`: " if tensor else ""
        raise DFlashError(f"{what}torch dtype {name} has no safetensors code", file=file)
    return _BY_TORCH[name]
