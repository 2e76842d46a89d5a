#!/usr/bin/env python
"""Runtime speed, printed (never asserted): the draft step, the target's verify step and decoding,
eager vs compiled (static caches, torch.compile; CUDA graphs on a GPU), next to the memory floor.

Shapes (random weights built in memory on the device, nothing downloaded):
  8b     the Qwen3-8B-DFlash-b16 draft (5 layers, hidden 4096, 32/8 heads, head_dim 128, intermediate
         12288, 5 target ids, vocab 151936; 2.1 GB in bf16) and a Qwen3-8B-shaped target (36 layers)
  small  the same structure at hidden 256: exercises every code path on a CPU in seconds

Parts (--parts, default all but pair):
  step    one steady draft step (block 16, context 512): add 4 newly committed rows to the context,
          propose a block, lm_head [V, H] included. Floor = bytes the step must read (draft weights +
          lm_head) / the device's measured copy bandwidth; achieved GB/s = those bytes / step time.
  verify  the target verifying a block of 16 after 512 cached positions (its KV cache cropped back).
  hybrid  per-verify-step latency of a hybrid linear-attention target (Qwen3.5 layout: 3 Gated DeltaNet
          layers per full-attention layer) against the attention-only target of the same size and
          depth: block 16 after 512 cached positions, 4 tokens committed per step (3 proposals
          accepted), so the hybrid's state is rolled back every step (copy before verify, restore,
          re-run the 4 committed tokens); also the hybrid with every proposal accepted (no rollback).
  decode  speculative vs target-only decoding of the random pair: per-step latencies (acceptance is
          meaningless with random weights: the step times are not).
  zlab    with --zlab-model PATH (z-lab's dflash/model.py, used in place, never copied): the same
          draft step through its DFlashDraftModel with the same weights.
  pair    the trained pair in examples/pair (CPU-sized): tau, tokens/s, speedup, outputs equal.
  dflash2 the same draft step for a dflash2 draft of the same size (speculators' default convolution
          and selector sizes: 2 taps, groups of 16, rank 256, top-16; the walk included) against the
          dflash draft: the cost of the convolutions and the candidate selector.
  dspark  the same for a dspark draft (speculators' defaults: vanilla Markov head of rank 256, confidence head
          over [hidden; Markov embedding], the anchor's slot proposing): B proposals per block, the Markov walk
          (one [V, 256] bias per slot, in turn) and the confidence head included.

    python benchmarks/runtime_bench.py                          # 8b shape on the GPU (bf16)
    python benchmarks/runtime_bench.py --shape small --device cpu   # code paths on a CPU
    python benchmarks/runtime_bench.py --shape 8b --device cpu --dtype float32 --parts step
    python benchmarks/runtime_bench.py --parts step --json step.json   # the figures as JSON too (gpu-check)
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _shapes  # noqa: E402

from dflash_convert.format.catalogue import expected_shapes  # noqa: E402
from dflash_convert.format.mapping import spec_from_config  # noqa: E402
from dflash_runtime.draft import DFlashDraft  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BLOCK, CONTEXT, NEW_PER_STEP = 16, 512, 4
SMALL = dict(hidden_size=256, intermediate_size=768, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             vocab_size=4096)


# ----------------------------------------------------------------------------- building

def draft_config(shape: str) -> dict:
    cfg = _shapes.config("hf", 5 if shape == "8b" else 2)
    if shape == "small":
        cfg.update(SMALL)
        cfg["dflash_config"] = dict(cfg["dflash_config"], mask_token_id=SMALL["vocab_size"] - 1,
                                    target_layer_ids=[0, 2, 3])
        cfg["num_target_layers"] = 4
    return cfg


def target_config(shape: str):
    from transformers import Qwen3Config

    cfg = _shapes.target_config()
    if shape == "small":
        cfg.update(SMALL, num_hidden_layers=4, eos_token_id=SMALL["vocab_size"] - 2, bos_token_id=None)
    return Qwen3Config(**cfg, attn_implementation="sdpa")


def random_pool(device, dtype) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(0)
    return (torch.randn(1 << 24, generator=g, device=device) * 0.02).to(dtype)


def fill_random(t: torch.Tensor, pool: torch.Tensor, offset: int) -> int:
    """Fill t from the pool at a shifting offset (drawing billions of normals one by one takes a minute
    on a CPU); norm-like vectors get values near 1."""
    if t.dim() == 1:
        t.copy_(1 + pool[offset % 4096:offset % 4096 + t.numel()].float() * 5)
        return offset + 1
    flat = t.view(-1)
    half = len(pool) // 2
    for i in range(0, flat.numel(), half):
        n = min(half, flat.numel() - i)
        offset = (offset + 7919) % half
        flat[i:i + n] = pool[offset:offset + n]
    return offset


def random_draft(spec, device, dtype, pool) -> dict[str, torch.Tensor]:
    tensors, offset = {}, 0
    for name, shape in expected_shapes(spec).items():
        tensors[name] = torch.empty(shape, device=device, dtype=dtype)
        offset = fill_random(tensors[name], pool, offset)
    return tensors


def random_target(shape: str, device, dtype, pool):
    """A Qwen3ForCausalLM of the shape, random weights, built directly on the device."""
    from transformers import Qwen3ForCausalLM

    with torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Qwen3ForCausalLM._from_config(target_config(shape), dtype=dtype)
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            offset = fill_random(p.data, pool, offset)
    return model.eval()


# ----------------------------------------------------------------------------- measuring

def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeat: int) -> float:
    """Median seconds of `repeat` calls (after the caller's warm-up)."""
    times = []
    for _ in range(repeat):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def steady_rounds(step, device, steps: int, max_rounds: int = 6) -> tuple[float, float, int]:
    """(first round's median, the settled round's median, rounds taken), seconds: rounds of `steps` calls until two
    in a row agree within 5 %. The first eager measurement in a process was 8-10x later ones on an H200 (43-58 ms
    against 5.2-5.9 ms), so the settled round is the figure and the first is kept beside it."""
    first = previous = timed(step, device, steps)
    rounds = 1
    while rounds < max_rounds:
        current = timed(step, device, steps)
        rounds += 1
        if abs(current - previous) <= 0.05 * previous:
            return first, current, rounds
        previous = current
    return first, previous, rounds


def copy_bandwidth(device) -> float:
    """Bytes/s moved by a device-to-device copy (read + write), the memory floor's denominator."""
    nbytes = (1 << 30) if device.type == "cuda" else (1 << 28)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = timed(lambda: dst.copy_(src), device, 10)
    del src, dst
    return 2 * nbytes / seconds


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def row(what: str, mode: str, seconds: float, moved: int | None = None, floor: float | None = None) -> None:
    extra = ""
    if moved is not None:
        extra += f" {moved / seconds / 1e9:9.1f}"
    if floor is not None:
        extra += f" {seconds / floor:8.2f}x"
    print(f"{what:34} {mode:10} {seconds * 1e3:10.3f}{extra}", flush=True)


def header() -> None:
    print(f"{'what':34} {'mode':10} {'ms':>10} {'GB/s':>9} {'vs floor':>9}")


# ----------------------------------------------------------------------------- parts

def no_record() -> None:
    pass


def bench_step(spec, tensors, lm_head, embed, device, dtype, modes, backend, steps, bandwidth, results=None,
               record=no_record) -> dict:
    """Fills `results` (mode -> ms, the floor) and calls `record` after each mode: a run stopped in the
    compiled mode's compile keeps the eager figure."""
    weights = nbytes(tensors.values())
    moved = weights + lm_head.weight.numel() * lm_head.weight.element_size()
    floor = moved / bandwidth
    results = {} if results is None else results
    results.update(floor_ms=floor * 1e3, bytes_read=moved)
    print(f"\n== draft step, block {BLOCK}, context {CONTEXT} (+{NEW_PER_STEP} rows per step): draft "
          f"{weights / 1e9:.2f} GB + lm_head {(moved - weights) / 1e9:.2f} GB; floor {floor * 1e3:.3f} ms "
          f"(draft alone {weights / bandwidth * 1e3:.3f} ms) ==")
    header()
    features = torch.randn(CONTEXT + NEW_PER_STEP * (6 * steps + 8), spec.context_width, device=device).to(dtype)
    for mode in modes:
        draft = DFlashDraft(spec, tensors, layer_causal=[False] * spec.num_layers, backend=backend, device=device,
                            dtype=dtype, compile=mode == "compiled")
        draft.reset(CONTEXT + NEW_PER_STEP * (6 * steps + 8) + BLOCK, BLOCK)
        draft.add_context(features[:CONTEXT], 0)
        state = {"start": CONTEXT}

        def step():
            s = state["start"]
            draft.add_context(features[s:s + NEW_PER_STEP], s)
            state["start"] = s + NEW_PER_STEP
            draft.propose(7, s + NEW_PER_STEP, embed=embed, lm_head=lm_head)

        t = time.perf_counter()
        step()  # the compiled mode compiles here
        first = time.perf_counter() - t
        first_round, seconds, _ = steady_rounds(step, device, steps)
        results[mode + "_first_round_ms"] = first_round * 1e3
        results[mode + "_ms"] = seconds * 1e3
        if mode == "compiled":
            results["compiled_first_call_s"] = first
        record()
        row("draft step" + (f" (first call {first:.1f} s)" if mode == "compiled" else ""), mode, seconds, moved,
            floor)
        del draft
        gc.collect()
    return results


# the family drafts benchmarked against the dflash step of the same body: extra config keys (HF layout),
# and what the ratio line says beside the times
FAMILY = {
    "dflash2": ({"architectures": ["DFlash2DraftModel"],
                 "dflash_config": {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256,
                                   "selector_top_k": 16}}, ""),
    "dspark": ({"architectures": ["Qwen3DSparkModel"], "markov_rank": 256, "markov_head_type": "vanilla",
                "enable_confidence_head": True, "confidence_head_with_markov": True, "sample_from_anchor": True},
               f"; {BLOCK} vs {BLOCK - 1} proposals"),
}


def bench_family(kind: str, cfg: dict, spec, tensors, lm_head, embed, device, dtype, pool, args, bandwidth,
                 results=None, record=no_record) -> dict:
    """The dflash step against a `kind` draft of the same body (its own modules random)."""
    extra, note = FAMILY[kind]
    cfg2 = {**cfg, **extra, "dflash_config": {**cfg["dflash_config"], **extra.get("dflash_config", {})}}
    spec2 = spec_from_config(cfg2)
    tensors2, offset = dict(tensors), 3
    for name, shape in expected_shapes(spec2).items():
        if name not in tensors2:
            tensors2[name] = torch.empty(shape, device=device, dtype=dtype)
            offset = fill_random(tensors2[name], pool, offset)
    results = {} if results is None else results
    plain, other = results.setdefault("dflash", {}), results.setdefault(kind, {})
    print(f"\n== dflash (below: the same step as {kind}) ==")
    bench_step(spec, tensors, lm_head, embed, device, dtype, args.modes, args.backend, args.steps, bandwidth, plain,
               record)
    print(f"== {kind} ==")
    bench_step(spec2, tensors2, lm_head, embed, device, dtype, args.modes, args.backend, args.steps, bandwidth, other,
               record)
    for mode in args.modes:
        a, b = other[mode + "_ms"], plain[mode + "_ms"]
        results[mode + "_ratio"] = a / b
        print(f"{kind} / dflash draft step, {mode}: {a / b:.2f}x ({a:.2f} vs {b:.2f} ms{note})")
    record()
    return results


def bench_zlab(path: Path, cfg: dict, tensors, lm_head, embed, device, dtype, steps, bandwidth) -> None:
    """The same steady step through z-lab's DFlashDraftModel (its loop: features of the newly committed
    rows in, the block out, its cache cropped back to the context)."""
    from transformers import DynamicCache, Qwen3Config

    moved = nbytes(tensors.values()) + lm_head.weight.numel() * lm_head.weight.element_size()
    spec_ = importlib.util.spec_from_file_location("zlab_dflash_model", path)
    module = importlib.util.module_from_spec(spec_)
    try:
        spec_.loader.exec_module(module)
        config = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "dtype")})
        config._attn_implementation = "sdpa"
        with torch.device(device):
            model = module.DFlashDraftModel(config).to(dtype).eval()
        missing, unexpected = model.load_state_dict(tensors, strict=False)
    except Exception as exc:  # noqa: BLE001 (a reference file of another version: say why and go on)
        print(f"z-lab model.py at {path} could not be used: {type(exc).__name__}: {exc}")
        return
    if [m for m in missing if not m.startswith("rotary")] or unexpected:
        print(f"z-lab model.py: weights do not line up (missing {missing[:3]}, unexpected {unexpected[:3]})")
        return
    features = torch.randn(CONTEXT + NEW_PER_STEP * (steps + 8), len(cfg["dflash_config"]["target_layer_ids"])
                           * cfg["hidden_size"], device=device).to(dtype)
    block = torch.full((1, BLOCK), cfg["dflash_config"]["mask_token_id"], device=device)
    block[0, 0] = 7
    cache = DynamicCache(config=config)
    state = {"start": 0, "new": CONTEXT}

    @torch.inference_mode()
    def step():
        s, n = state["start"], state["new"]
        positions = torch.arange(s, s + n + BLOCK, device=device)[None]
        hidden = model(target_hidden=features[None, s:s + n], noise_embedding=embed(block[0])[None],
                       position_ids=positions, past_key_values=cache, use_cache=True)[:, 1:]
        cache.crop(-(cache.get_seq_length() - (s + n)))  # back to the context, as its loop does
        lm_head(hidden).argmax(-1)
        state["start"], state["new"] = s + n, NEW_PER_STEP

    for _ in range(4):
        step()
    row("draft step, z-lab model.py", "eager", timed(step, device, steps), moved, moved / bandwidth)


def bench_verify(target_model, device, modes, steps, results=None, record=no_record) -> dict:
    from dflash_runtime.target import Target

    moved = nbytes(p for p in target_model.parameters())
    print(f"\n== target verify step: block {BLOCK} after {CONTEXT} cached positions, "
          f"{moved / 1e9:.2f} GB of weights ==")
    header()
    ids = torch.randint(0, target_model.config.vocab_size - 2, (CONTEXT + BLOCK,), device=device)
    results = {} if results is None else results
    results["weight_bytes"] = moved
    for mode in modes:
        target = Target(target_model, compile=mode == "compiled")
        target.set_capture([0])
        target.reset(CONTEXT + 2 * BLOCK, BLOCK)
        target.forward(ids[:CONTEXT], 0, last_logits_only=True)

        def step():
            target.forward(ids[CONTEXT:], CONTEXT)
            target.crop(CONTEXT)

        for _ in range(4):
            step()
        results[mode + "_ms"] = timed(step, device, steps) * 1e3
        row("verify step", mode, results[mode + "_ms"] / 1e3, moved)
        record()
        target.set_capture([])
    return results


def hybrid_model(shape: str, device, dtype, pool):
    """A Qwen3.5-text target with the attention-only target's hidden size, depth, heads and MLP."""
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    base = target_config(shape).to_dict()
    linear = (dict(linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                   linear_value_head_dim=128) if shape == "8b" else
              dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64))
    keep = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings")
    config = Qwen3_5TextConfig(**{k: base[k] for k in keep}, **linear, full_attention_interval=4,
                               attn_implementation="sdpa")
    with torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Qwen3_5ForCausalLM._from_config(config, dtype=dtype)
    offset = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):  # decays exp(-exp(A_log) * dt) stay in (0, 1)
                p.fill_(0.0)
                continue
            offset = fill_random(p.data, pool, offset)
    return model.eval()


def bench_hybrid(shape: str, attention_model, device, dtype, pool, modes, steps, results=None,
                 record=no_record) -> dict:
    """Three targets stepped in turn (the same machine load for each): attention-only and the hybrid
    with 4 of 16 committed per step, the hybrid with all 16 committed (no rollback)."""
    from dflash_runtime.target import Target

    hybrid = hybrid_model(shape, device, dtype, pool)
    committed = 4  # anchor + 3 accepted proposals of the 15
    print(f"\n== verify step with rollback: hybrid (Qwen3.5 layout, {nbytes(hybrid.parameters()) / 1e9:.2f} GB) vs "
          f"attention-only ({nbytes(attention_model.parameters()) / 1e9:.2f} GB), {len(hybrid.model.layers)} layers, "
          f"block {BLOCK} after {CONTEXT} cached, {committed} committed per step; medians of {steps} steps each, "
          "taken in turn ==")
    print(f"{'mode':9} {'attention-only':>15} {'hybrid, all kept':>17} {'hybrid, rollback':>17} {'rollback cost':>14}")
    total = CONTEXT + (steps + 8) * BLOCK + BLOCK
    ids = torch.randint(0, attention_model.config.vocab_size - 2, (total,), device=device)
    results = {} if results is None else results
    for mode in modes:
        lanes = {}
        for name, model, keep in (("attention", attention_model, committed), ("kept", hybrid, BLOCK),
                                  ("rollback", hybrid, committed)):
            target = Target(model, compile=mode == "compiled")
            target.set_capture([0])
            target.reset(total, BLOCK)
            target.forward(ids[:CONTEXT], 0, last_logits_only=True)
            lanes[name] = dict(target=target, keep=keep, at=CONTEXT, times=[])

        def step(lane):
            lane["target"].forward(ids[lane["at"]:lane["at"] + BLOCK], lane["at"])
            lane["target"].crop(lane["at"] + lane["keep"])
            lane["at"] += lane["keep"]

        for i in range(steps + 4):
            for lane in lanes.values():
                sync(device)
                t = time.perf_counter()
                step(lane)
                sync(device)
                if i >= 4:  # warm-up (and compiles)
                    lane["times"].append(time.perf_counter() - t)
        ms = {name: statistics.median(lane["times"]) * 1e3 for name, lane in lanes.items()}
        results[mode] = dict(attention_only_ms=ms["attention"], hybrid_all_kept_ms=ms["kept"],
                             hybrid_rollback_ms=ms["rollback"], rollback_vs_attention=ms["rollback"] / ms["attention"])
        record()
        print(f"{mode:9} {ms['attention']:12.2f} ms {ms['kept']:14.2f} ms {ms['rollback']:14.2f} ms "
              f"{(ms['rollback'] / ms['kept'] - 1) * 100:+12.0f} %   (hybrid with rollback / attention-only: "
              f"{ms['rollback'] / ms['attention']:.2f}x)", flush=True)
        for lane in lanes.values():
            lane["target"].set_capture([])
        del lanes
        gc.collect()
    del hybrid
    gc.collect()
    return results


def bench_decode(draft_spec, tensors, target_model, device, dtype, modes, backend, tokens) -> None:
    from dflash_runtime import speculative_generate, target_generate
    from dflash_runtime.target import Target

    print(f"\n== decoding the random pair: prompt {CONTEXT}, {tokens} new tokens (random weights: acceptance is "
          "~0, so each step commits 1 token; per-step latencies are what matters) ==")
    prompt = torch.randint(0, target_model.config.vocab_size - 2, (CONTEXT,)).tolist()
    for mode in modes:
        target = Target(target_model, compile=mode == "compiled")
        draft = DFlashDraft(draft_spec, tensors, layer_causal=[False] * draft_spec.num_layers, backend=backend,
                            device=device, dtype=dtype, compile=mode == "compiled")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            speculative_generate(draft, target, prompt, max_new_tokens=2 * BLOCK)  # warm-up (compiles)
            target_generate(target, prompt, max_new_tokens=4)
            spec = speculative_generate(draft, target, prompt, max_new_tokens=tokens).stats
            base = target_generate(target, prompt, max_new_tokens=tokens).stats
        steps = max(spec.num_drafts, 1)
        draft_ms, verify_ms = spec.draft_time_s / steps * 1e3, spec.verify_time_s / steps * 1e3
        base_ms = (base.total_time_s - base.prefill_time_s) / max(base.new_tokens - 1, 1) * 1e3
        step_ms = (spec.total_time_s - spec.prefill_time_s) / steps * 1e3
        print(f"{mode:9} speculative step {step_ms:8.2f} ms (draft {draft_ms:.2f} + verify {verify_ms:.2f}); "
              f"target-only step {base_ms:.2f} ms; break-even tau {step_ms / base_ms:.2f}; "
              + ", ".join(f"at tau {t}: {t * base_ms / step_ms:.2f}x" for t in (4, 6, 8)), flush=True)
        target.set_capture([])
        del draft, target
        gc.collect()


def bench_pair(pair: Path, max_new_tokens: int, limit: int, modes) -> None:
    print(f"\n== speculative vs target-only decoding on the trained pair ({pair}) ==")
    if not (pair / "draft").is_dir() or not (pair / "target").is_dir():
        print(f"skipped: no trained pair at {pair} (expected draft/ and target/; make it with "
              "examples/train_pair.py)")
        return
    from dflash_runtime import load_draft, load_target, speculative_generate, target_generate

    prompts = [list(map(int, line.split())) for line in (pair / "prompts.txt").read_text().splitlines()
               if line.strip()][:limit]
    print(f"{len(prompts)} prompts x {max_new_tokens} tokens; {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'mode':9} {'tau':>6} {'tok/s':>8} {'target-only':>12} {'speedup':>8} {'equal':>6}")
    for mode in modes:
        draft = load_draft(pair / "draft", compile=mode == "compiled")
        target = load_target(pair / "target", compile=mode == "compiled")
        speculative_generate(draft, target, prompts[0], max_new_tokens=max_new_tokens)  # warm-up (compiles)
        target_generate(target, prompts[0], max_new_tokens=max_new_tokens)
        acc = drafts = equal = 0
        spec_time = spec_tokens = base_time = base_tokens = 0.0
        for p in prompts:
            g = speculative_generate(draft, target, p, max_new_tokens=max_new_tokens)
            b = target_generate(target, p, max_new_tokens=max_new_tokens)
            equal += g.tokens == b.tokens
            acc, drafts = acc + g.stats.accepted, drafts + g.stats.num_drafts
            spec_time += g.stats.total_time_s - g.stats.prefill_time_s
            base_time += b.stats.total_time_s - b.stats.prefill_time_s
            spec_tokens, base_tokens = spec_tokens + g.stats.new_tokens, base_tokens + b.stats.new_tokens
        tps, base_tps = spec_tokens / spec_time, base_tokens / base_time
        print(f"{mode:9} {1 + acc / max(drafts, 1):6.2f} {tps:8.1f} {base_tps:12.1f} {tps / base_tps:7.2f}x "
              f"{equal:>3}/{len(prompts)}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=["8b", "small"], default="8b")
    ap.add_argument("--device", default="auto", help="auto (cuda when present), cpu or cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--parts", nargs="+", default=["step", "verify", "hybrid", "decode", "zlab"],
                    choices=["step", "verify", "hybrid", "decode", "zlab", "pair", "dflash2", "dspark"])
    ap.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    ap.add_argument("--backend", default="sdpa", help="draft attention backend")
    ap.add_argument("--steps", type=int, default=20, help="timed steady steps (median reported)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per decode in the decode part")
    ap.add_argument("--zlab-model", type=Path, default=None, help="path to z-lab's dflash/model.py")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--pair", type=Path, default=ROOT / "examples" / "pair")
    ap.add_argument("--pair-tokens", type=int, default=64)
    ap.add_argument("--pair-prompts", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file (rewritten "
                    "after each mode of each part, so a run stopped midway leaves what it measured)")
    return ap.parse_args(argv)


def setup(args) -> tuple[torch.device, torch.dtype]:
    """(device, dtype) of a benchmark's --device / --dtype (bfloat16 on CUDA, else float32 by default), its
    --threads applied and the seed fixed: the start every benchmark script shares."""
    from dflash_runtime.device import resolve_device, resolve_dtype

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    return device, dtype


def main(argv=None) -> None:
    args = parse_args(argv)
    device, dtype = setup(args)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}"
    bandwidth = copy_bandwidth(device)
    print(f"device: {name}; dtype {str(dtype)[6:]}; shape {args.shape}; torch {torch.__version__}; measured "
          f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    if device.type != "cuda":
        print("NOTE: a CPU run. The GPU figures (8b shape, bf16, eager vs compiled with CUDA graphs, against the "
              "H100/H200 floor) are pending: run this script on a GPU machine.")
    figures = {"device": name, "dtype": str(dtype)[6:], "shape": args.shape, "torch": torch.__version__,
               "cuda": torch.version.cuda, "copy_bandwidth_GBps": bandwidth / 1e9}

    def record() -> None:
        if args.json is not None:
            args.json.write_text(json.dumps(figures, indent=1) + "\n")

    def part(name: str) -> dict:
        """The dict a part's figures go in (filled as the part goes)."""
        return figures.setdefault(name, {})

    figures["parts"] = args.parts
    record()
    run_parts(args, device, dtype, bandwidth, part, record)


def run_parts(args, device, dtype, bandwidth, part, record) -> None:
    cfg = draft_config(args.shape)
    spec = spec_from_config(cfg)
    needs_target = {"verify", "hybrid", "decode"} & set(args.parts)
    with torch.inference_mode():
        pool = random_pool(device, dtype)
        t = time.perf_counter()
        tensors = random_draft(spec, device, dtype, pool)
        lm_head = torch.nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, device=device, dtype=dtype)
        fill_random(lm_head.weight.data, pool, 1)
        table = torch.empty(1024, spec.hidden_size, device=device, dtype=dtype)  # a 16-row gather costs nothing
        fill_random(table, pool, 2)

        def embed(ids):
            return torch.nn.functional.embedding(ids % 1024, table)

        print(f"(random draft {nbytes(tensors.values()) / 1e9:.2f} GB built in {time.perf_counter() - t:.1f} s)")
        if "step" in args.parts:
            bench_step(spec, tensors, lm_head, embed, device, dtype, args.modes, args.backend, args.steps, bandwidth,
                       part("step"), record)
        for kind in ("dflash2", "dspark"):
            if kind in args.parts:
                bench_family(kind, cfg, spec, tensors, lm_head, embed, device, dtype, pool, args, bandwidth, part(kind),
                             record)
        if "zlab" in args.parts and args.zlab_model is not None:
            bench_zlab(args.zlab_model, cfg, tensors, lm_head, embed, device, dtype, args.steps, bandwidth)
        if needs_target:
            t = time.perf_counter()
            target_model = random_target(args.shape, device, dtype, pool)
            print(f"\n(random target {nbytes(target_model.parameters()) / 1e9:.2f} GB built in "
                  f"{time.perf_counter() - t:.1f} s)")
            if "verify" in args.parts:
                bench_verify(target_model, device, args.modes, args.steps, part("verify"), record)
            if "hybrid" in args.parts:
                bench_hybrid(args.shape, target_model, device, dtype, pool, args.modes, args.steps, part("hybrid"),
                             record)
    if "decode" in args.parts:
        bench_decode(spec, tensors, target_model, device, dtype, args.modes, args.backend, args.tokens)
    if "pair" in args.parts:
        bench_pair(args.pair, args.pair_tokens, args.pair_prompts, args.modes)


if __name__ == "__main__":
    main()
