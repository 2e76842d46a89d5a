#!/usr/bin/env python
"""The draft steps (dflash, dflash2, DSpark) at the Qwen3-8B-DFlash-b16 shape, timed and profiled: what bounds each.

For each kind and mode (eager, compiled: torch.compile, CUDA graphs on a GPU), one steady step as in
runtime_bench.py's step part (add 4 newly committed rows to a 512-row context, propose a block of 16, lm_head
included; dflash2's selector walk and DSpark's Markov walk included), reported as
  first_round_ms  the median of the first --steps steps after the first call: what a single measurement in a
                  fresh process sees (an eager figure taken first in a process was 8-10x later ones on the H200)
  ms              the median of a round taken once two rounds in a row agree within 5 % (at most 6 rounds)
  floor_ms        the bytes the step must read (draft weights + lm_head) / the measured device copy bandwidth
and then --profile-steps steps under torch.profiler: the time the device was busy per step (the rest of the
step is launch and host time), the top kernels by device time, and their share by kind (GEMMs, attention,
reductions such as argmax/top-k, fused elementwise, copies) with the GEMMs' time set against the floor. The
line `bound` names what bounds the step from those numbers. dflash2 and DSpark are also given as a ratio to the
dflash step of the same body.

    python benchmarks/profile_step.py --json steps.json        # on a GPU: 8b shape, bf16, every kind, both modes
    python benchmarks/profile_step.py --dry-run                # CPU, small shape, eager, 2 steps (a minute)
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import runtime_bench as rb  # noqa: E402

from dflash_convert.format.catalogue import expected_shapes  # noqa: E402
from dflash_convert.format.mapping import spec_from_config  # noqa: E402
from dflash_runtime.draft import DFlashDraft  # noqa: E402

KINDS = ("dflash", "dflash2", "dspark")
# kernel name fragments -> what the kernel does (the first that matches; lower case)
KERNEL_KINDS = [
    ("gemm", ("gemm", "matmul", "cutlass", "xmma", "nvjet", "cublas", "gemv", "splitk", "::mm", "bmm", "addmm", "linear")),
    ("attention", ("flash", "attention", "fmha", "sdpa", "flex", "softmax")),
    ("reduction", ("argmax", "topk", "top_k", "reduce", "sort", "max_", "sum_")),
    ("copy", ("copy", "memcpy", "memset", "cat", "index", "gather", "scatter", "embedding")),
    ("fused elementwise", ("triton", "elementwise", "vectorized", "unrolled")),
]


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, frags in KERNEL_KINDS if any(f in low for f in frags)), "other")


def family_draft(kind: str, cfg: dict, tensors: dict, device, dtype, pool):
    """The spec and tensors of a `kind` draft with the dflash draft's body (its own modules random)."""
    if kind == "dflash":
        return spec_from_config(cfg), tensors
    extra, _ = rb.FAMILY[kind]
    cfg2 = {**cfg, **extra, "dflash_config": {**cfg["dflash_config"], **extra.get("dflash_config", {})}}
    spec = spec_from_config(cfg2)
    tensors2, offset = dict(tensors), 3
    for name, shape in expected_shapes(spec).items():
        if name not in tensors2:
            tensors2[name] = torch.empty(shape, device=device, dtype=dtype)
            offset = rb.fill_random(tensors2[name], pool, offset)
    return spec, tensors2


def profile(step, device, n: int, top: int, step_ms: float, floor_ms: float) -> dict:
    """n steps under torch.profiler: device-busy time per step, the top kernels, the time by kernel kind, what
    bounds the step. On a CPU (a dry run) the same over CPU operators."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(n):
            step()
        rb.sync(device)
    events = prof.key_averages()
    if cuda:
        rows = [(e.key, e.self_device_time_total / 1e3 / n, e.count // n) for e in events
                if e.self_device_time_total > 0 and getattr(e, "device_type", None) != torch.autograd.DeviceType.CPU]
    else:
        rows = [(e.key, e.self_cpu_time_total / 1e3 / n, e.count // n) for e in events if e.self_cpu_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    busy = sum(r[1] for r in rows)
    by_kind: dict[str, float] = {}
    for name, ms, _ in rows:
        by_kind[kernel_kind(name)] = by_kind.get(kernel_kind(name), 0.0) + ms
    out = {"busy_ms_per_step": busy, "busy_share": busy / step_ms if step_ms else 0.0,
           "launches_per_step": sum(r[2] for r in rows),
           "ms_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
           "top": [{"name": name[:120], "ms_per_step": ms, "calls_per_step": calls, "kind": kernel_kind(name)}
                   for name, ms, calls in rows[:top]]}
    return {"bound": bound(out, step_ms, floor_ms, cuda), **out}


def bound(p: dict, step_ms: float, floor_ms: float, cuda: bool) -> str:
    """What bounds the step, in words, from the profile's numbers."""
    if not cuda:
        top = p["top"][0]["name"] if p["top"] else "-"
        return f"CPU operators (dry run): {p['busy_ms_per_step']:.2f} ms of {step_ms:.2f} ms in ops, top {top}"
    if p["busy_ms_per_step"] == 0:
        return "no kernel seen by the profiler (kernels replayed inside CUDA graphs are not traced here)"
    idle = 1 - p["busy_share"]
    gemm = p["ms_by_kind"].get("gemm", 0.0)
    parts = [f"GPU busy {p['busy_ms_per_step']:.3f} of {step_ms:.3f} ms ({idle:.0%} idle: launch/host gaps)",
             f"GEMMs {gemm:.3f} ms vs the weight-read floor {floor_ms:.3f} ms ({gemm / floor_ms:.2f}x)",
             "non-GEMM kernels " + ", ".join(f"{k} {v:.3f} ms" for k, v in p["ms_by_kind"].items() if k != "gemm")]
    if idle > 0.3:
        verdict = "bound by launches/host work between kernels"
    elif gemm >= 0.6 * p["busy_ms_per_step"]:
        verdict = ("bound by weight reads at the floor" if gemm <= 1.15 * floor_ms else
                   "bound by GEMMs reading weights below the copy bandwidth (small-batch GEMM efficiency)")
    else:
        verdict = f"bound by non-GEMM kernels ({max((k for k in p['ms_by_kind'] if k != 'gemm'), key=p['ms_by_kind'].get)})"
    return verdict + ": " + "; ".join(parts)


def bench_kind(kind: str, spec, tensors, lm_head, embed, device, dtype, args, bandwidth, out: dict, record) -> None:
    weights = rb.nbytes(tensors.values())
    moved = weights + lm_head.weight.numel() * lm_head.weight.element_size()
    floor_ms = moved / bandwidth * 1e3
    out.update(floor_ms=floor_ms, bytes_read=moved)
    total = rb.CONTEXT + rb.NEW_PER_STEP * (args.steps * 8 + args.profile_steps + 16)
    features = torch.randn(total, spec.context_width, device=device).to(dtype)
    for mode in args.modes:
        draft = DFlashDraft(spec, tensors, layer_causal=[False] * spec.num_layers, backend=args.backend,
                            device=device, dtype=dtype, compile=mode == "compiled")
        draft.reset(total + rb.BLOCK, rb.BLOCK)
        draft.add_context(features[:rb.CONTEXT], 0)
        state = {"start": rb.CONTEXT}

        def step():
            s = state["start"]
            if s + rb.NEW_PER_STEP > total:  # the context is full: start over at the same length (a rare reset)
                s = state["start"] = rb.CONTEXT
            draft.add_context(features[s:s + rb.NEW_PER_STEP], s)
            state["start"] = s + rb.NEW_PER_STEP
            draft.propose(7, s + rb.NEW_PER_STEP, embed=embed, lm_head=lm_head)

        t = time.perf_counter()
        step()  # the compiled mode compiles here
        rb.sync(device)
        out[f"{mode}_first_call_s"] = time.perf_counter() - t
        first, settled, rounds = rb.steady_rounds(step, device, args.steps)
        out.update({f"{mode}_first_round_ms": first * 1e3, f"{mode}_ms": settled * 1e3, f"{mode}_rounds": rounds})
        record()
        print(f"{kind:8} {mode:9} first call {out[f'{mode}_first_call_s']:7.2f} s; first round {first * 1e3:9.3f} ms; "
              f"settled {settled * 1e3:9.3f} ms ({rounds} rounds of {args.steps}); floor {floor_ms:.3f} ms "
              f"({settled * 1e3 / floor_ms:.2f}x)", flush=True)
        if args.profile_steps:
            try:
                p = profile(step, device, args.profile_steps, args.top, settled * 1e3, floor_ms)
            except Exception as exc:  # noqa: BLE001 (the profiler under CUDA graphs: say so, the timings stand)
                p = {"status": f"profile failed: {type(exc).__name__}: {str(exc)[:200]}", "top": []}
                print(f"{'':8} {mode:9} {p['status']}", file=sys.stderr)
            out.setdefault("profile", {})[mode] = p
            record()
            print(f"{'':8} {mode:9} {p.get('bound', '')}")
            for k in p["top"]:
                print(f"{'':19} {k['ms_per_step']:8.3f} ms x{k['calls_per_step']:<4} {k['kind']:18} {k['name'][:90]}")
        del draft
        gc.collect()


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=["8b", "small"], default="8b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    ap.add_argument("--backend", default="sdpa")
    ap.add_argument("--steps", type=int, default=20, help="steps per timed round (median reported)")
    ap.add_argument("--profile-steps", type=int, default=5, help="steps under the profiler (0: none)")
    ap.add_argument("--top", type=int, default=8, help="kernels listed per profile")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dry-run", action="store_true", help="CPU, small shape, eager, 2 steps a round")
    ap.add_argument("--json", type=Path, default=None, help="the figures as JSON, rewritten as they come")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.shape, args.device, args.modes, args.steps, args.profile_steps = "small", "cpu", ["eager"], 2, 2
        args.threads = args.threads or 1
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device, dtype = rb.setup(args)
    bandwidth = rb.copy_bandwidth(device)
    figures: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                     "dtype": str(dtype)[6:], "shape": args.shape, "torch": torch.__version__,
                     "copy_bandwidth_GBps": bandwidth / 1e9}

    def record() -> None:
        if args.json is not None:
            args.json.write_text(json.dumps(figures, indent=1) + "\n")

    print(f"device {figures['device']}, {figures['dtype']}, shape {args.shape}, copy bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s; block {rb.BLOCK}, context {rb.CONTEXT} (+{rb.NEW_PER_STEP} rows a step)")
    cfg = rb.draft_config(args.shape)
    with torch.inference_mode():
        pool = rb.random_pool(device, dtype)
        tensors = rb.random_draft(spec_from_config(cfg), device, dtype, pool)
        lm_head = torch.nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False, device=device, dtype=dtype)
        rb.fill_random(lm_head.weight.data, pool, 1)
        table = torch.empty(1024, cfg["hidden_size"], device=device, dtype=dtype)
        rb.fill_random(table, pool, 2)

        def embed(ids):
            return torch.nn.functional.embedding(ids % 1024, table)

        record()
        failed = []
        for kind in args.kinds:
            spec, kind_tensors = family_draft(kind, cfg, tensors, device, dtype, pool)
            try:
                bench_kind(kind, spec, kind_tensors, lm_head, embed, device, dtype, args, bandwidth,
                           figures.setdefault(kind, {}), record)
            except Exception as exc:  # noqa: BLE001 (one kind that cannot run is reported; the next still runs)
                figures[kind]["status"] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
                failed.append(kind)
                print(f"{kind}: {figures[kind]['status']}", file=sys.stderr)
                record()
                gc.collect()
            if kind != "dflash" and "dflash" in figures:
                for mode in args.modes:
                    if f"{mode}_ms" in figures[kind] and f"{mode}_ms" in figures["dflash"]:
                        figures[kind][f"{mode}_ratio"] = figures[kind][f"{mode}_ms"] / figures["dflash"][f"{mode}_ms"]
                        print(f"{kind} / dflash, {mode}: {figures[kind][f'{mode}_ratio']:.2f}x")
                record()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
