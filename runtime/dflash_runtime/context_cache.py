"""The draft's context cache (batch 1): context K/V per layer, one row per position, preallocated and written by index.

    k[layer], v[layer]: [1, nKV, capacity, d], post-RoPE; rows [start, end) hold the context, rows from end on
    are free (a step's block writes its own K/V there as scratch)
"""

from __future__ import annotations

import torch

CACHE_ROUND = 256  # cache rows are allocated in multiples of this (fewer distinct shapes to compile)


class ContextCache:
    """The draft's context K/V (batch 1): one preallocated pair of tensors per layer, written by index.

    Row p holds position p. Context [start, end) is valid; rows from end on are free, and a step's
    block writes its own K/V there as scratch. Dropping old context (a draft window) only moves
    start: nothing is copied. The cache grows by reallocation only when a caller goes past it; the
    new tensors replace the old ones in `k` and `v`, so every draft sharing this cache (the backend
    variants of one draft) reads and writes the same rows."""

    def __init__(self, num_layers: int, n_kv: int, head_dim: int, *, device, dtype: torch.dtype):
        self.num_layers, self.n_kv, self.head_dim = num_layers, n_kv, head_dim
        self.device, self.dtype = torch.device(device), dtype
        self.k: list[torch.Tensor] = []  # per layer [1, nKV, capacity, d], post-RoPE, row = position
        self.v: list[torch.Tensor] = []
        self.static = False  # compiled steps read the tensors in place: reallocated ones are marked too
        self.block = 0  # rows past the context a compiled step writes (its block size)
        self.start = 0  # first valid context position (rows before it are dropped or never written)
        self.end = 0  # position after the last cached row

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def __len__(self) -> int:
        """Context positions held."""
        return self.end - self.start

    @torch.inference_mode()
    def reset(self, max_len: int | None = None) -> None:
        """Forget all context; `max_len`: positions the run will reach, so the rows are allocated once."""
        if max_len is not None and max_len > self.capacity:
            self.grow(max_len, keep=False)
        for t in (*self.k, *self.v):
            t.zero_()  # in place (static addresses); free rows must stay finite: masked keys still meet q
        self.start = self.end = 0

    @torch.inference_mode()
    def grow(self, needed: int, keep: bool = True) -> None:
        """Reallocate to at least `needed` rows (rounded up, at least doubling), keeping the context when `keep`."""
        size = -(-max(needed, 2 * self.capacity) // CACHE_ROUND) * CACHE_ROUND
        old = self.capacity
        new = []
        for t_old in (*self.k, *self.v) if old else [None] * (2 * self.num_layers):
            t = torch.zeros(1, self.n_kv, size, self.head_dim, device=self.device, dtype=self.dtype)
            if keep and old:
                t[:, :, :old] = t_old
            if self.static:
                torch._dynamo.mark_static_address(t)
            new.append(t)
        self.k, self.v = new[:self.num_layers], new[self.num_layers:]

    def mark_static(self) -> None:
        """Compiled steps read and write the cache in place (CUDA graphs need fixed addresses)."""
        self.static = True
        for t in (*self.k, *self.v):
            torch._dynamo.mark_static_address(t)

    def keep_last(self, n: int) -> None:
        """Forget all but the last n context positions."""
        self.start = max(self.start, self.end - n)

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [1, nKV, n, d] of positions [n] into layer's rows at those positions."""
        self.k[layer].index_copy_(2, positions, k)
        self.v[layer].index_copy_(2, positions, v)

    def rows(self, layer: int, lo, hi) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer's K, V rows [lo, hi): views [1, nKV, hi-lo, d]."""
        return self.k[layer][:, :, lo:hi], self.v[layer][:, :, lo:hi]
