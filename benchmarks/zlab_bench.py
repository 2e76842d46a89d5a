#!/usr/bin/env python
"""z-lab's reference loop against ours, on the same weights and prompts: outputs equal to the target's greedy
`generate`, tau (tokens committed per verify step) and milliseconds per new token for
  zlab            z-lab's `dflash_generate` (dflash/model.py of github.com/z-lab/dflash, imported from a copy
                  beside the tree: --zlab DIR; it is never copied into this repository)
  ours_eager      our runtime's speculative_generate, eager
  ours_compiled   the same, compiled (static caches, torch.compile; CUDA graphs on a GPU)
  generate        the target alone: transformers' greedy `generate` (the reference the others are compared to)
Every method is warmed up on the first prompt (compiles included) before it is timed, and each is timed the
way z-lab's loop times itself: decode time after the prefill over the new tokens (for `generate`: a whole run's
time less a one-token run's, over the tokens after the first).

Pairs (--pairs):
  bundled  examples/pair, its draft converted to the z-lab (HF) layout as non-causal by our converter
  8b       a Qwen3-8B-DFlash-b16-shaped random draft with a Qwen3-8B-shaped random target (benchmarks/
           runtime_bench.py builds them; random weights accept nothing, so tau is 1): per committed token against
           the floor of reading the target's and the draft's weights once
  small    the same random pair at hidden 256 (the 8b code path, CPU-sized: what --dry-run uses)

    python benchmarks/zlab_bench.py --zlab build/zlab-dflash --pairs bundled 8b --json zlab.json   # on a GPU
    python benchmarks/zlab_bench.py --zlab build/zlab-dflash --dry-run    # CPU, float32, 2 prompts x 16 tokens

Exit 1 when z-lab's copy is absent or cannot run with these weights (said on stderr), except in --dry-run,
which then runs ours alone.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "examples" / "pair"
METHODS = ("generate", "zlab", "ours_eager", "ours_compiled")


def now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


# ----------------------------------------------------------------------------- z-lab's copy

def zlab_model_file(path: Path) -> Path:
    """dflash/model.py in a copy of z-lab/dflash (or the file itself)."""
    return path if path.is_file() else path / "dflash" / "model.py"


def load_zlab(path: Path, device: torch.device):
    """z-lab's model.py as a module of its own (imported from where it lies, never copied). Its `_cuda_time`
    synchronizes CUDA unconditionally; on a machine without CUDA (a dry run) it is replaced by a plain clock."""
    spec = importlib.util.spec_from_file_location("zlab_dflash_model", zlab_model_file(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if device.type != "cuda":
        module._cuda_time = time.perf_counter
    return module


def zlab_commit(path: Path) -> str | None:
    """The commit the copy was taken at: COMMIT beside it (prepare-gpu.sh writes one) or its git head."""
    root = path.parent.parent if path.is_file() else path
    if (root / "COMMIT").exists():
        return (root / "COMMIT").read_text().strip()
    p = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() or None


def zlab_draft(module, config: dict, tensors: dict[str, torch.Tensor], device, dtype):
    """z-lab's DFlashDraftModel from an HF-layout config and its tensors (strict: every weight must line up)."""
    from transformers import Qwen3Config

    cfg = Qwen3Config(**{k: v for k, v in config.items() if k not in ("architectures", "dtype", "torch_dtype")})
    cfg._attn_implementation = "sdpa"
    with torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = module.DFlashDraftModel(cfg).to(dtype).eval()
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if not m.startswith("rotary")]
    if missing or unexpected:
        raise ValueError(f"the weights do not line up with z-lab's DFlashDraftModel: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    return model


# ----------------------------------------------------------------------------- the pairs

def bundled_pair(device, dtype, work: Path) -> dict:
    """examples/pair: its target loaded once by transformers (shared by every method), its draft converted to the
    HF layout, non-causal (z-lab's attention is non-causal), and loaded by us and by z-lab from that one file."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from dflash_convert.convert.conversion import ConvertOptions, convert

    draft_dir = work / "draft-hf"
    # the verifier fills num_target_layers, which z-lab's DFlashDraftModel reads even beside target_layer_ids
    convert(PAIR / "draft", draft_dir, ConvertOptions(to="hf", causal=False, verifier=PAIR / "target"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        target = AutoModelForCausalLM.from_pretrained(PAIR / "target", dtype=dtype, attn_implementation="sdpa")
    prompts = [list(map(int, line.split())) for line in (PAIR / "prompts.txt").read_text().splitlines() if line.strip()]
    tensors = {k: v.to(device, dtype) for k, v in load_file(draft_dir / "model.safetensors").items()}
    return dict(target=target.to(device).eval(), config=json.loads((draft_dir / "config.json").read_text()),
                tensors=tensors, prompts=prompts, draft_dir=draft_dir)


def random_pair(shape: str, device, dtype, prompts: int) -> dict:
    """runtime_bench's random draft and target of the shape (random prompts of 512 tokens)."""
    import runtime_bench

    cfg = runtime_bench.draft_config(shape)
    from dflash_convert.format.mapping import spec_from_config

    spec = spec_from_config(cfg)
    with torch.inference_mode():
        pool = runtime_bench.random_pool(device, dtype)
        tensors = runtime_bench.random_draft(spec, device, dtype, pool)
        target = runtime_bench.random_target(shape, device, dtype, pool)
    del pool
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, target.config.vocab_size - 2, (runtime_bench.CONTEXT,), generator=g).tolist()
           for _ in range(prompts)]
    weight_bytes = runtime_bench.nbytes(target.parameters()) + runtime_bench.nbytes(tensors.values())
    return dict(target=target, config=cfg, tensors=tensors, prompts=ids,
                spec=spec, weight_bytes=weight_bytes,
                floor_ms_per_token=weight_bytes / runtime_bench.copy_bandwidth(device) * 1e3)


def our_draft(pair: dict, device, dtype, compile: bool):
    from dflash_runtime import load_draft
    from dflash_runtime.draft import DFlashDraft

    if "draft_dir" in pair:
        return load_draft(pair["draft_dir"], device=device, dtype=dtype, backend="sdpa", compile=compile)
    spec = pair["spec"]
    return DFlashDraft(spec, dict(pair["tensors"]), layer_causal=[False] * spec.num_layers, backend="sdpa",
                       device=device, dtype=dtype, compile=compile)


# ----------------------------------------------------------------------------- the methods

def run_generate(target, prompt, tokens, device) -> tuple[list[int], float, float]:
    """(new tokens, tau 1, ms per token after the first): transformers' greedy generate, timed whole and with one
    new token (its prefill and first token), the difference over the rest."""
    ids = torch.tensor([prompt], device=device)
    eos = target.generation_config.eos_token_id

    def gen(n):
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = now(device)
            out = target.generate(ids, max_new_tokens=n, min_new_tokens=0, do_sample=False,
                                  pad_token_id=eos if isinstance(eos, int) else 0)
            return out[0, len(prompt):].tolist(), now(device) - t

    new, whole = gen(tokens)
    _, first = gen(1)
    return new, 1.0, (whole - first) / max(len(new) - 1, 1) * 1e3


def run_zlab(module, model, target, prompt, tokens, device) -> tuple[list[int], float, float]:
    eos = target.generation_config.eos_token_id
    stops = None if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    out = module.dflash_generate(model, target, torch.tensor([prompt], device=device), max_new_tokens=tokens,
                                 stop_token_ids=stops, temperature=0.0, return_stats=True)
    new = out.output_ids[0, out.num_input_tokens:].tolist()
    return new, statistics.mean(out.acceptance_lengths), out.time_per_output_token * 1e3


def run_ours(draft, target, prompt, tokens) -> tuple[list[int], float, float]:
    from dflash_runtime import speculative_generate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = speculative_generate(draft, target, prompt, max_new_tokens=tokens)
    return g.tokens, g.stats.tau, 1e3 / g.stats.tokens_per_s if g.stats.tokens_per_s else float("nan")


def bench_pair(name: str, pair: dict, methods: list[str], zlab_path: Path | None, device, dtype, tokens: int,
               results: dict, record) -> None:
    """Each method over every prompt (the first run twice: a warm-up, untimed), figures rewritten after each."""
    from dflash_runtime import load_target

    prompts, target = pair["prompts"], pair["target"]
    figures = results.setdefault(name, {})
    figures.update(prompts=len(prompts), new_tokens=tokens)
    if "floor_ms_per_token" in pair:
        figures.update(floor_ms_per_token=pair["floor_ms_per_token"], weight_bytes=pair["weight_bytes"])
    reference: list[list[int]] = []
    print(f"\n== {name} pair: {len(prompts)} prompts x {tokens} new tokens, {str(dtype)[6:]} on {device} ==")
    print(f"{'method':14} {'equal':>7} {'tau':>6} {'ms/token':>9}")
    for method in methods:
        if method != "generate" and not reference:
            raise RuntimeError("generate runs first: it is the reference")
        try:
            if method == "generate":
                run = lambda p: run_generate(target, p, tokens, device)  # noqa: E731
            elif method == "zlab":
                if zlab_path is None:
                    figures["zlab"] = {"status": "absent: no copy of z-lab/dflash (--zlab DIR)"}
                    print(f"{'zlab':14} absent: no copy of z-lab/dflash (--zlab DIR)")
                    record()
                    continue
                module = load_zlab(zlab_path, device)
                model = zlab_draft(module, pair["config"], pair["tensors"], device, dtype)
                run = lambda p: run_zlab(module, model, target, p, tokens, device)  # noqa: E731
            else:
                compiled = method == "ours_compiled"
                ours_target = load_target(target, device=device, dtype=dtype, compile=compiled)
                draft = our_draft(pair, device, dtype, compiled)
                run = lambda p: run_ours(draft, ours_target, p, tokens)  # noqa: E731
            t = time.perf_counter()
            run(prompts[0])  # warm-up: CUDA kernels, the compiled mode's compiles
            warm_s = time.perf_counter() - t
            outs = [run(p) for p in prompts]
        except Exception as exc:  # noqa: BLE001 (one method that cannot run is reported; the others still run)
            figures[method] = {"status": f"failed: {type(exc).__name__}: {str(exc)[:300]}"}
            print(f"{method:14} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            record()
            if method == "generate":
                raise
            continue
        if method == "generate":
            reference = [o[0] for o in outs]
        equal = sum(o[0] == ref for o, ref in zip(outs, reference))
        ms = statistics.mean(o[2] for o in outs)
        tau = statistics.mean(o[1] for o in outs)
        figures[method] = {"status": "ok", "equal": equal, "tau": tau, "ms_per_token": ms, "warm_up_s": warm_s}
        print(f"{method:14} {equal:>3}/{len(prompts):<3} {tau:6.2f} {ms:9.3f}   (warm-up {warm_s:.1f} s)", flush=True)
        record()
        if method.startswith("ours"):
            ours_target.set_capture([])
            del draft, ours_target
        gc.collect()


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zlab", type=Path, default=ROOT / "build" / "zlab-dflash",
                    help="a copy of z-lab/dflash (the directory holding dflash/model.py) or that model.py")
    ap.add_argument("--pairs", nargs="+", default=["bundled"], choices=["bundled", "8b", "small"])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS,
                    help="generate always runs first (the reference)")
    ap.add_argument("--random-pair-methods", nargs="+", default=["generate", "zlab", "ours_eager"], choices=METHODS,
                    help="methods for the 8b pair (compiling a 36-layer target takes minutes: ours_compiled is "
                    "left out of one loan's run)")
    ap.add_argument("--prompts", type=int, default=8, help="bundled pair: its first N prompts")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per prompt (bundled pair)")
    ap.add_argument("--random-prompts", type=int, default=2)
    ap.add_argument("--random-tokens", type=int, default=32)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--dry-run", action="store_true", help="CPU, float32, the bundled and the small pair, 2 prompts "
                    "x 16 tokens; runs ours alone when z-lab's copy is absent")
    ap.add_argument("--json", type=Path, default=None, help="the figures as JSON, rewritten after each method")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.device, args.pairs, args.prompts, args.tokens = "cpu", ["bundled", "small"], 2, 16
        args.random_prompts, args.random_tokens = 1, 8
    args.methods = ["generate", *[m for m in args.methods if m != "generate"]]
    args.random_pair_methods = ["generate", *[m for m in args.random_pair_methods if m != "generate"]]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from dflash_runtime.device import resolve_device, resolve_dtype

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    zlab = args.zlab if args.zlab is not None and zlab_model_file(args.zlab).exists() else None
    figures: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                     "dtype": str(dtype)[6:], "torch": torch.__version__,
                     "zlab_commit": zlab_commit(zlab) if zlab else None}

    def record() -> None:
        if args.json is not None:
            args.json.write_text(json.dumps(figures, indent=1) + "\n")

    record()
    if zlab is None:
        print(f"zlab_bench: no copy of z-lab/dflash at {args.zlab} (dflash/model.py): "
              + ("ours alone (dry run)" if args.dry_run else "fetch one (scripts/prepare-gpu.sh) or pass --zlab DIR"),
              file=sys.stderr)
        if not args.dry_run:
            return 1
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="zlab-bench-") as work:
        for name in args.pairs:
            if name == "bundled":
                pair = bundled_pair(device, dtype, Path(work))
                pair["prompts"] = pair["prompts"][:args.prompts]
                bench_pair(name, pair, args.methods, zlab, device, dtype, args.tokens, figures, record)
            else:
                pair = random_pair(name, device, dtype, args.random_prompts)
                bench_pair(name, pair, args.random_pair_methods, zlab, device, dtype, args.random_tokens, figures,
                           record)
                for method in args.random_pair_methods:
                    run = figures[name].get(method, {})
                    if "ms_per_token" in run:
                        run["vs_floor"] = run["ms_per_token"] / pair["floor_ms_per_token"]
                print(f"floor: {pair['weight_bytes'] / 1e9:.2f} GB of weights read once per committed token: "
                      f"{pair['floor_ms_per_token']:.3f} ms")
                record()
            del pair
            gc.collect()
    failed = [f"{name}.{m}" for name in args.pairs for m, run in figures[name].items()
              if isinstance(run, dict) and run.get("status", "ok").startswith("failed")]
    if failed:
        print(f"zlab_bench: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or (zlab is None and not args.dry_run) else 0


if __name__ == "__main__":
    sys.exit(main())
