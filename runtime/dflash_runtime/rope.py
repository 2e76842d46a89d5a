"""RoPE for the draft: the inverse frequencies of its config (plain or scaled, transformers' rope types), the
cos/sin tables of a step and the rotation (HF Qwen3 numerics).

    positions [n] x inv_freq [d/2] -> angles [n, d/2] -> cos, sin [n, d] (float32, cast to the model dtype)
    x [1, heads, n, d] -> x * cos + rotate_half(x) * sin
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_convert.errors import NotRunnable
from dflash_convert.format.configs import DraftSpec

# scaled RoPE types (transformers' names): static ones fix their frequencies; "dynamic" (NTK) and
# "longrope" choose them by the sequence length a step reaches (LengthRope)
SUPPORTED_ROPE = ("linear", "llama3", "yarn", "dynamic", "longrope")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_kind(spec: DraftSpec) -> str:
    scaling = spec.rope_scaling or {}
    return scaling.get("rope_type") or scaling.get("type") or "default"


def rope_inv_freq(spec: DraftSpec) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [d/2] and the cos/sin scale (1.0 unless a scaled RoPE says otherwise)."""
    d = spec.head_dim
    scaling = spec.rope_scaling
    if scaling is None:
        return 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float) / d)), 1.0
    kind = rope_kind(spec)
    if kind not in SUPPORTED_ROPE:
        raise NotRunnable(f"RoPE type {kind!r} is not supported by the runtime "
                          f"(supported: default, {', '.join(SUPPORTED_ROPE)})")
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = Qwen3Config(**{k: v for k, v in spec.decoder.items() if k != "model_type"})
    inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    return inv_freq.float(), float(scale)


@dataclass
class LengthRope:
    """Frequencies chosen by the sequence length a draft step reaches, as transformers' rotary embedding
    chooses them per call (dynamic_rope_update): one length per step, the block's end; context rows are
    rotated with the length of the step that first reads them (z-lab computes them in that step's call).
    "dynamic": NTK base theta * (factor * L / M - (factor - 1)) ** (d / (d - 2)) once L passes
    max_position_embeddings M; "longrope": the long factors once L passes original_max_position_embeddings."""
    kind: str
    threshold: int  # the length up to which the unscaled frequencies hold
    short: torch.Tensor  # [d/2] those frequencies
    long: torch.Tensor | None = None  # [d/2] longrope's long-factor frequencies
    theta: float = 10000.0
    factor: float = 1.0

    @classmethod
    def of(cls, spec: DraftSpec) -> "LengthRope | None":
        kind = rope_kind(spec)
        if kind not in ("dynamic", "longrope"):
            return None
        from transformers import Qwen3Config
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        config = Qwen3Config(**{k: v for k, v in spec.decoder.items() if k != "model_type"})
        params = config.rope_parameters
        init = ROPE_INIT_FUNCTIONS[kind]
        if kind == "dynamic":
            return cls(kind, config.max_position_embeddings, init(config, "cpu")[0].float(),
                       theta=float(params["rope_theta"]), factor=float(params["factor"]))
        threshold = int(params["original_max_position_embeddings"])
        return cls(kind, threshold, init(config, "cpu", seq_len=threshold)[0].float(),
                   long=init(config, "cpu", seq_len=threshold + 1)[0].float())

    def to(self, device) -> "LengthRope":
        return LengthRope(self.kind, self.threshold, self.short.to(device),
                          None if self.long is None else self.long.to(device), self.theta, self.factor)

    def inv_freq(self, length) -> torch.Tensor:
        """[d/2] for a step reaching `length` positions (an int or a 0-d tensor: compiled steps pass one)."""
        length = torch.as_tensor(length, device=self.short.device)
        if self.kind == "longrope":
            return torch.where(length > self.threshold, self.long, self.short)
        dim = 2 * self.short.numel()
        length = torch.clamp(length.long(), min=self.threshold)  # float32 from here, as transformers' per-call path
        base = self.theta * ((self.factor * length / self.threshold) - (self.factor - 1)) ** (dim / (dim - 2))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=self.short.device).float() / dim
        return 1.0 / (base ** exponents)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, d] for positions [n] (HF Qwen3 numerics: float32 angles, cast to the model dtype)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [n, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [1, heads, n, d] rotated (neox rotate_half) by tables [n, d]."""
    return x * cos + rotate_half(x) * sin
