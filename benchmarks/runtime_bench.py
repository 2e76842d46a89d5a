#!/usr/bin/env python
"""Runtime speed, printed (never asserted).

Part 1: one draft step (block 16, context 512) at the Qwen3-8B-DFlash-b16 shape (FORMATS.md
section 4: 5 layers, hidden 4096, 32/8 heads, head_dim 128, intermediate 12288, 5 target ids,
vocab 151936), random weights built in memory, for each dtype and each attention backend:
  cold   = empty cache: fuse + cache K/V of 512 context tokens, then the block forward + lm_head
  steady = context of 512 cached: add 4 newly committed tokens, then the block forward + lm_head
The lm_head is a random [151936, 4096] matrix standing in for the target's (it is 1/3 of the
step's FLOPs); the block is embedded from a small random table (a 16-row gather costs nothing).

Part 2 (when examples/pair exists): greedy speculative vs target-only decoding on the trained
pair's held-out prompts: tau, tokens/s, speedup, and the draft/verify split.

    python benchmarks/runtime_bench.py [--dtypes float32 bfloat16] [--backends ...] [--steady 3] [--threads N]
    python benchmarks/runtime_bench.py --skip-step --threads 1 --pair-block-sizes 0 8   # trained pair only
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _shapes import H, HEAD_DIM, HEADS, INTER, KV, TARGET_IDS, VOCAB, config  # noqa: E402

from dflash_convert.mapping import spec_from_config  # noqa: E402
from dflash_runtime.attention import BACKENDS  # noqa: E402
from dflash_runtime.model import DFlashDraft  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BLOCK, CONTEXT, NEW_PER_STEP = 16, 512, 4


def random_tensors(spec, dtype) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Random draft weights of the real shapes in `dtype` (norm weights near 1) and a random
    [vocab, H] lm_head. Matrices are cut from one random pool at shifting offsets: drawing 1.7 B
    normals one by one takes a minute on this machine."""
    from dflash_convert.catalogue import expected_shapes

    g = torch.Generator().manual_seed(0)
    pool = (torch.randn(1 << 24, generator=g) * 0.02).to(dtype)
    half = len(pool) // 2
    offset = 0

    def matrix(shape):
        nonlocal offset
        flat = torch.empty(shape[0] * shape[1], dtype=dtype)
        for i in range(0, flat.numel(), half):
            n = min(half, flat.numel() - i)
            offset = (offset + 7919) % half
            flat[i:i + n] = pool[offset:offset + n]
        return flat.view(shape)

    out = {name: matrix(shape) if len(shape) == 2 else (1 + 0.1 * torch.randn(shape, generator=g)).to(dtype)
           for name, shape in expected_shapes(spec).items()}
    return out, matrix((VOCAB, H))


def gemm_floor(tensors, lm_head_weight, dtype) -> float:
    """Seconds for the steady step's matrix products alone (no attention, norms or RoPE): fc on
    4 new rows, k/v on 4 rows, every layer's projections on 16 rows, lm_head on 15 rows."""
    F = torch.nn.functional
    rows = {16: torch.randn(16, H).to(dtype), 4: torch.randn(4, H).to(dtype)}
    t = time.perf_counter()
    F.linear(torch.randn(NEW_PER_STEP, len(TARGET_IDS) * H).to(dtype), tensors["fc.weight"])
    for name, w in tensors.items():
        if name.startswith("layers.") and w.dim() == 2:
            F.linear(torch.randn(16, w.shape[1]).to(dtype), w)
            if name.endswith(("k_proj.weight", "v_proj.weight")):
                F.linear(rows[4], w)
    F.linear(rows[16][:15], lm_head_weight)
    return time.perf_counter() - t


def bench_draft_step(dtypes, backends, steady_steps: int) -> None:
    spec = spec_from_config(config("hf", 5))
    assert (spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.intermediate_size) == \
        (H, HEADS, KV, HEAD_DIM, INTER)
    print(f"== draft step at Qwen3-8B-DFlash-b16 shape: 5 layers, fc [{H}, {len(TARGET_IDS) * H}], "
          f"block {BLOCK}, context {CONTEXT}, lm_head [{VOCAB}, {H}], {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f} ==")
    print(f"{'dtype':9} {'backend':10} {'mode':11} {'cold s':>8} {'steady s':>9}")
    for dtype in dtypes:
        t = time.perf_counter()
        tensors, lm_head_weight = random_tensors(spec, dtype)
        embed_table = torch.randn(1024, H).to(dtype) * 0.02
        print(f"  (built {sum(x.numel() for x in tensors.values()) / 1e9:.2f} B draft params + lm_head in "
              f"{dtype} in {time.perf_counter() - t:.1f} s)")
        floor = sorted(gemm_floor(tensors, lm_head_weight, dtype) for _ in range(3))[1]
        print(f"{str(dtype)[6:]:9} {'(gemms)':10} {'floor':11} {'':8} {floor:9.3f}   <- matrix products alone")

        def lm_head(h):
            return torch.nn.functional.linear(h, lm_head_weight)

        def embed(ids):
            return embed_table[ids % 1024]

        features = torch.randn(CONTEXT + NEW_PER_STEP * steady_steps, len(TARGET_IDS) * H).to(dtype)
        for name in backends:
            backend = BACKENDS[name]
            reason = backend.why_not([False] * 5, False, "cpu", dtype)
            if reason is not None:
                print(f"{str(dtype)[6:]:9} {name:10} {'-':11} unavailable: it {reason}")
                continue
            modes = [("non-causal", False)] + ([("causal", True)] if name == "sdpa" else [])
            for mode, causal in modes:
                draft = DFlashDraft(spec, tensors, layer_causal=[causal] * 5, backend=name, device="cpu", dtype=dtype)
                t = time.perf_counter()
                draft.add_context(features[:CONTEXT], 0)
                draft.propose(7, CONTEXT, embed=embed, lm_head=lm_head)
                cold = time.perf_counter() - t
                times = []
                start = CONTEXT
                for _ in range(steady_steps):
                    t = time.perf_counter()
                    draft.add_context(features[start:start + NEW_PER_STEP], start)
                    start += NEW_PER_STEP
                    draft.propose(7, start, embed=embed, lm_head=lm_head)
                    times.append(time.perf_counter() - t)
                steady = sorted(times)[len(times) // 2]
                print(f"{str(dtype)[6:]:9} {name:10} {mode:11} {cold:8.3f} {steady:9.3f}", flush=True)
                del draft
                gc.collect()
        del tensors, lm_head_weight
        gc.collect()


def bench_pair(pair: Path, max_new_tokens: int, limit: int, block_sizes) -> None:
    print(f"\n== speculative vs target-only decoding on the trained pair ({pair}) ==")
    if not (pair / "draft").is_dir() or not (pair / "target").is_dir():
        print(f"skipped: no trained pair at {pair} (expected draft/ and target/; make it with "
              "examples/train_pair.py)")
        return
    from dflash_runtime import load_draft, load_target, speculative_generate, target_generate

    prompts_file = pair / "prompts.txt"
    prompts = [list(map(int, line.split())) for line in prompts_file.read_text().splitlines() if line.strip()]
    prompts = prompts[:limit]
    draft, target = load_draft(pair / "draft"), load_target(pair / "target")
    print(f"target: {target.num_layers} layers, hidden {target.hidden_size}; draft: {draft.spec.num_layers} layers, "
          f"block {draft.block_size}, backend {draft.backend}; {len(prompts)} prompts x {max_new_tokens} tokens; "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    target_generate(target, prompts[0], max_new_tokens=4)  # warm-up
    speculative_generate(draft, target, prompts[0], max_new_tokens=4)
    base_time = base_tokens = 0.0
    for p in prompts:
        g = target_generate(target, p, max_new_tokens=max_new_tokens)
        base_time += g.stats.total_time_s - g.stats.prefill_time_s
        base_tokens += g.stats.new_tokens
    base_tps = base_tokens / base_time
    print(f"{'block':>5} {'tau':>6} {'tok/s':>8} {'target-only tok/s':>18} {'speedup':>8} {'draft s':>8} "
          f"{'verify s':>9} {'other s':>8} {'equal':>6}")
    for bs in block_sizes:
        acc = drafts = 0
        t_draft = t_verify = t_decode = 0.0
        tokens = equal = 0
        for p in prompts:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                g = speculative_generate(draft, target, p, max_new_tokens=max_new_tokens, block_size=bs)
            ref = target_generate(target, p, max_new_tokens=max_new_tokens)
            equal += g.tokens == ref.tokens
            acc += g.stats.accepted
            drafts += g.stats.num_drafts
            t_draft += g.stats.draft_time_s
            t_verify += g.stats.verify_time_s
            t_decode += g.stats.total_time_s - g.stats.prefill_time_s
            tokens += g.stats.new_tokens
        tps = tokens / t_decode
        print(f"{bs or draft.block_size:>5} {1 + acc / drafts:6.2f} {tps:8.1f} {base_tps:18.1f} {tps / base_tps:7.2f}x "
              f"{t_draft:8.2f} {t_verify:9.2f} {t_decode - t_draft - t_verify:8.2f} {equal:>3}/{len(prompts)}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS))
    ap.add_argument("--steady", type=int, default=3, help="steady-state steps timed (median reported)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own); tiny "
                    "models run faster on 1 thread, especially on a busy machine")
    ap.add_argument("--skip-step", action="store_true", help="only the trained-pair part")
    ap.add_argument("--pair", type=Path, default=ROOT / "examples" / "pair")
    ap.add_argument("--pair-tokens", type=int, default=64)
    ap.add_argument("--pair-prompts", type=int, default=8)
    ap.add_argument("--pair-block-sizes", type=int, nargs="+", default=[0], help="0 = the draft's own")
    args = ap.parse_args()
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")  # flex is eager here
    if args.threads:
        torch.set_num_threads(args.threads)
    with torch.inference_mode():
        if not args.skip_step:
            bench_draft_step([getattr(torch, d) for d in args.dtypes], args.backends, args.steady)
    bench_pair(args.pair, args.pair_tokens, args.pair_prompts, [b or None for b in args.pair_block_sizes])


if __name__ == "__main__":
    main()
