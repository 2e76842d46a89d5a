"""Validation time and peak memory, measured as a user runs it: the whole `dflash-convert validate` process.

1. static (+ numeric) of a Qwen3-8B-DFlash-b16-shaped draft (random bf16, ~2.1 GB, built in a temporary
   directory) against a Qwen3-8B target config.json (shapes only).          Target: < 60 s on 2 cores.
2. the bundled trained pair (examples/pair): static + numeric, and all levels end to end.
3. end to end against a random-weight Qwen3-shaped target built here (never downloaded), bf16:
   `--target-shape 8b`: the 8B-shaped draft with the deepest Qwen3-8B-shaped target (hidden 4096,
   up to its 36 layers) that the memory plan says fits this machine; `--target-shape small`: a
   Qwen3-0.6B-shaped target (28 layers, hidden 1024) with a 2-layer draft for it; `--target-shape tiny`
   (hidden 64, 4 layers, vocab 512): the code path in seconds (scripts/gpu-check.sh --dry-run).
   Target: peak RSS of the whole run <= 1.2 x (target bytes + draft bytes).

Each figure is the whole CLI process (imports included) plus the time the report says the run took;
peak RSS is read inside the child (VmHWM, file-backed pages of mapped weights included), and so is the
peak GPU memory PyTorch's allocator held (torch.cuda.max_memory_reserved) when the run used a GPU.
`--json FILE` writes every figure to FILE as well.

    python benchmarks/validate_bench.py                                  # everything (8B: ~20 GB RAM)
    python benchmarks/validate_bench.py --skip-8b --target-shape small   # bundled pair + small shape
    python benchmarks/validate_bench.py --skip-8b --skip-pair --target-shape small --size-context-lengths 8k
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _shapes  # noqa: E402

from dflash_convert.validate import memory  # noqa: E402
from dflash_convert.format.catalogue import expected_shapes  # noqa: E402
from dflash_convert.format.mapping import build_target_layer_ids, spec_from_config  # noqa: E402
from dflash_convert.io.safetensors import header_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "examples" / "pair"
# run the CLI module in this process, and at exit write its peak RSS and (where it used a GPU) the peak
# GPU memory its torch allocator held to stderr
HWM = ("import atexit, sys, runpy\n"
       "def peaks():\n"
       "    sys.stderr.write('VmHWM ' + [l.split()[1] for l in open('/proc/self/status') "
       "if l.startswith('VmHWM')][0] + chr(10))\n"
       "    torch = sys.modules.get('torch')\n"
       "    if torch is not None and torch.cuda.is_initialized():\n"
       "        sys.stderr.write(f'CUDAPeak {torch.cuda.max_memory_reserved()}' + chr(10))\n"
       "atexit.register(peaks)\n"
       "sys.argv = sys.argv[1:]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")
RSS_ALLOWANCE = 1.2  # peak RSS <= 1.2 x (target + draft bytes)
# Qwen3 dimensions: hidden, intermediate, heads, kv heads, head dim, vocab, layers
SHAPES = {"8b": dict(hidden=4096, inter=12288, heads=32, kv=8, head_dim=128, vocab=151936, layers=36),
          "small": dict(hidden=1024, inter=3072, heads=16, kv=8, head_dim=128, vocab=151936, layers=28),
          "tiny": dict(hidden=64, inter=128, heads=4, kv=2, head_dim=16, vocab=512, layers=4)}
ALL_LEVELS = "static,numeric,end_to_end"
DRAFT_LAYERS = {"8b": 5, "small": 2, "tiny": 2}
FIGURES: dict = {}  # every figure printed, by label (written by --json)


def validate(*args: str) -> tuple[float, float, dict]:
    """(wall s, peak RSS bytes, JSON report) of one `dflash-convert validate ... --json` process; the peak GPU
    memory, when it used a GPU, is kept in the report under "_peak_gpu_bytes"."""
    cmd = [sys.executable, "-c", HWM, "dflash_convert", "validate", *args, "--json"]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode not in (0, 3):
        raise SystemExit(f"validate {' '.join(args)} could not run (exit {p.returncode}):\n{p.stderr[-3000:]}")
    hwm = [line.split()[1] for line in p.stderr.splitlines() if line.startswith("VmHWM ")]
    gpu = [int(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("CUDAPeak ")]
    report = json.loads(p.stdout)
    if gpu:
        report["_peak_gpu_bytes"] = gpu[-1]
    return wall, int(hwm[-1]) * 1024 if hwm else float("nan"), report


def describe(label: str, wall: float, rss: float, report: dict, target_s: float | None = None) -> None:
    failed = [c["name"] for c in report["checks"] if c["status"] == "fail"]
    verdict = "" if target_s is None else f"  (target < {target_s:.0f} s: {'met' if wall < target_s else 'MISSED'})"
    env = report["environment"]
    gpu = report.get("_peak_gpu_bytes")
    FIGURES[label] = dict(wall_s=wall, validation_s=report["duration_s"], peak_rss_bytes=rss, peak_gpu_bytes=gpu,
                          device=env.get("device"), levels=report["levels_run"], failed=failed)
    print(f"{label}: {wall:.1f} s wall, validation {report['duration_s']:.1f} s, peak RSS {rss / 1e6:.0f} MB, "
          + (f"peak GPU memory {gpu / 1e9:.2f} GB, " if gpu is not None else "")
          + f"levels {','.join(report['levels_run'])}, {len(report['checks'])} checks, failed: {failed or 'none'}, "
          f"{env.get('threads')} thread(s), load average {env.get('load_average')}{verdict}")
    a = report.get("acceptance")
    if a:
        FIGURES[label].update(tau=a["acceptance_length"], speedup=a["speedup"])
        low, high = a.get("speedup_range") or [a["speedup"], a["speedup"]]
        print(f"    tau {a['acceptance_length']:.2f} (block {a['block_size']}), {a['outputs_equal']}/{a['prompts']} "
              f"outputs equal, speedup {a['speedup']:.2f}x ({a['speculative_tokens_per_s']:.1f} vs "
              f"{a['target_tokens_per_s']:.1f} tok/s; per round {low:.2f}-{high:.2f}x over "
              f"{a.get('timing_rounds', 1)} rounds), {a['new_tokens']} tokens")
        for c in a.get("per_context_length") or []:
            print(f"    context {c['context_tokens']} tokens: tau {c['acceptance_length']:.2f}, outputs equal "
                  f"{c['outputs_equal']}/{c['prompts']}")


# ----------------------------------------------------------------------------- random checkpoints

def _write(path: Path, tensors: list[tuple[str, tuple[int, ...]]]) -> int:
    """A safetensors file of random finite bf16 values (one random block tiled); returns its data bytes."""
    head, offsets = header_bytes([(n, "BF16", s) for n, s in tensors], {"format": "pt"})
    block = _shapes.random_bf16_block(64 << 20)
    with open(path, "wb") as f:
        f.write(head)
        for begin, end in offsets:
            left = end - begin
            while left:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
    return offsets[-1][1] if offsets else 0


def target_tensors(d: dict, layers: int) -> list[tuple[str, tuple[int, ...]]]:
    h, i, q, kv = d["hidden"], d["inter"], d["heads"] * d["head_dim"], d["kv"] * d["head_dim"]
    out = [("model.embed_tokens.weight", (d["vocab"], h))]
    for n in range(layers):
        p = f"model.layers.{n}."
        out += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                (p + "self_attn.q_norm.weight", (d["head_dim"],)), (p + "self_attn.k_norm.weight", (d["head_dim"],)),
                (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (d["vocab"], h))]


def target_config(d: dict, layers: int) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": d["hidden"],
            "intermediate_size": d["inter"], "num_hidden_layers": layers, "num_attention_heads": d["heads"],
            "num_key_value_heads": d["kv"], "head_dim": d["head_dim"], "vocab_size": d["vocab"], "rms_norm_eps": 1e-6,
            "max_position_embeddings": 40960, "eos_token_id": min(151645, d["vocab"] - 2),
            "bos_token_id": min(151643, d["vocab"] - 3), "dtype": "bfloat16",
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": False}


def draft_config(d: dict, draft_layers: int, target_layers: int) -> dict:
    ids = build_target_layer_ids(target_layers, 5 if target_layers >= 8 else 1)
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": d["hidden"],
            "intermediate_size": d["inter"], "num_hidden_layers": draft_layers, "num_attention_heads": d["heads"],
            "num_key_value_heads": d["kv"], "head_dim": d["head_dim"], "vocab_size": d["vocab"], "rms_norm_eps": 1e-6,
            "hidden_act": "silu", "attention_bias": False, "max_position_embeddings": 40960,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "layer_types": ["full_attention"] * draft_layers, "tie_word_embeddings": False, "block_size": 16,
            "num_target_layers": target_layers, "dtype": "bfloat16",
            "dflash_config": {"mask_token_id": min(151669, d["vocab"] - 1), "target_layer_ids": ids, "block_size": 16}}


def write_pair(root: Path, shape: str, target_layers: int, draft_layers: int) -> tuple[Path, Path, int, int]:
    d = SHAPES[shape]
    target, draft = root / f"target-{shape}", root / f"draft-{shape}"
    target.mkdir(parents=True)
    draft.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps(target_config(d, target_layers), indent=1))
    target_bytes = _write(target / "model.safetensors", target_tensors(d, target_layers))
    config = draft_config(d, draft_layers, target_layers)
    (draft / "config.json").write_text(json.dumps(config, indent=1))
    draft_bytes = _write(draft / "model.safetensors", list(expected_shapes(spec_from_config(config)).items()))
    return target, draft, target_bytes, draft_bytes


def deepest_target(shape: str, draft_layers: int) -> int:
    """The most layers (up to the shape's own) whose bf16 run the memory plan says fits here, with the
    RSS allowance kept free as well."""
    d = SHAPES[shape]
    free = memory.cpu_available() or 0
    per_layer = sum(math.prod(s) for _, s in target_tensors(d, 1)) - sum(math.prod(s) for _, s in target_tensors(d, 0))
    fixed = sum(math.prod(s) for _, s in target_tensors(d, 0))
    draft = sum(math.prod(s) for _, s in expected_shapes(spec_from_config(draft_config(d, draft_layers, 36))).items())
    for layers in range(d["layers"], 0, -1):
        need = 2 * (fixed + layers * per_layer + draft) * RSS_ALLOWANCE + memory.LIBRARY_ALLOWANCE
        if need <= free:
            return layers
    raise SystemExit(f"not even a 1-layer {shape} target fits in {free / 1e9:.1f} GB free")


def end_to_end_at_size(root: Path, shape: str, max_new_tokens: str, layers: int | None, device: str,
                       levels: str, context_lengths: str | None = None) -> None:
    draft_layers = DRAFT_LAYERS[shape]
    layers = layers or deepest_target(shape, draft_layers)
    t = time.perf_counter()
    target, draft, target_bytes, draft_bytes = write_pair(root, shape, layers, draft_layers)
    print(f"built a random {shape}-shaped pair: target {layers} layers {target_bytes / 1e9:.2f} GB, draft "
          f"{draft_layers} layers {draft_bytes / 1e9:.2f} GB (bf16) in {time.perf_counter() - t:.1f} s")
    prompts = root / f"prompts-{shape}.txt"
    vocab = SHAPES[shape]["vocab"]
    prompts.write_text(" ".join(str((1000 + 37 * i) % (vocab - 3)) for i in range(32)) + "\n")  # one 32-token prompt
    for f in (*target.iterdir(), *draft.iterdir()):  # warm page cache, as after a download
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    wall, rss, report = validate(str(draft), "--target", str(target), "--prompts", str(prompts), "--max-new-tokens",
                                 max_new_tokens, "--threads", str(len(os.sched_getaffinity(0))), "--device", device,
                                 "--levels", levels, *(["--context-lengths", context_lengths] if context_lengths else []))
    label = f"{shape}-shaped pair, {'all levels' if levels == ALL_LEVELS else levels}" + (
        f", --context-lengths {context_lengths}" if context_lengths else "")
    describe(label, wall, rss, report)
    total = target_bytes + draft_bytes
    FIGURES[label].update(target_layers=layers, target_bytes=target_bytes, draft_bytes=draft_bytes)
    print(f"    peak RSS {rss / 1e9:.2f} GB = {rss / total:.2f} x (target + draft {total / 1e9:.2f} GB); "
          f"target <= {RSS_ALLOWANCE:.1f}x: {'met' if rss <= RSS_ALLOWANCE * total else 'MISSED'}")
    shutil.rmtree(target)
    shutil.rmtree(draft)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir, removed after)")
    ap.add_argument("--skip-8b", action="store_true", help="skip the 8B-shaped draft's static + numeric runs")
    ap.add_argument("--target-shape", choices=("8b", "small", "tiny", "none"), default="8b",
                    help="random target built for the end-to-end size run (8b needs ~20 GB free)")
    ap.add_argument("--target-layers", type=int, default=None, help="target depth (default: the deepest that fits)")
    ap.add_argument("--max-new-tokens", default="64", help="bundled pair")
    ap.add_argument("--size-new-tokens", default="4", help="the size run (a random draft accepts nothing, so every "
                    "token is a verify step of a whole block: seconds each at 8B on CPU)")
    ap.add_argument("--pair", type=Path, default=PAIR, help="trained pair directory (target/, draft/, prompts.txt)")
    ap.add_argument("--skip-pair", action="store_true", help="skip the trained pair's runs")
    ap.add_argument("--device", default="auto", help="validate's --device for the end-to-end size run")
    ap.add_argument("--size-levels", default=ALL_LEVELS, help="validate's --levels for the end-to-end size run")
    ap.add_argument("--size-context-lengths", default=None, metavar="L[,L...]", help="the size run also measures "
                    "validate --context-lengths L (e.g. 8k: the wall time of tau at 8k tokens of context)")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="dflash-validate-bench-"))
    try:
        cores = len(os.sched_getaffinity(0))
        print(f"machine: {cores} cores, load average {os.getloadavg()[0]:.1f} at start, "
              f"{(memory.cpu_available() or 0) / 1e9:.1f} GB available; python {sys.version.split()[0]}")
        if not args.skip_8b:
            t = time.perf_counter()
            draft = _shapes.write_draft(root / "qwen3-8b-dflash-b16", "hf", layers=5)
            (root / "qwen3-8b").mkdir(exist_ok=True)
            (root / "qwen3-8b" / "config.json").write_text(json.dumps(_shapes.target_config()))
            print(f"built the 8B-shaped draft ({_shapes.size_bytes(5) / 1e9:.2f} GB) in {time.perf_counter() - t:.1f} s")
            for f in draft.iterdir():  # warm page cache, as after a download
                with open(f, "rb") as fh:
                    while fh.read(64 << 20):
                        pass
            wall, rss, report = validate(str(draft), "--levels", "static", "--target", str(root / "qwen3-8b"))
            describe("8B-shaped, static only (with target config)", wall, rss, report)
            wall, rss, report = validate(str(draft), "--levels", "static,numeric", "--target", str(root / "qwen3-8b"))
            describe("8B-shaped, static + numeric", wall, rss, report, 60)
            shutil.rmtree(draft)
        pair = args.pair
        if args.skip_pair:
            pass
        elif (pair / "draft" / "config.json").exists():
            wall, rss, report = validate(str(pair / "draft"), "--levels", "static,numeric", "--target",
                                         str(pair / "target"))
            describe(f"pair {pair}, static + numeric", wall, rss, report)
            for threads in ([], ["--threads", str(cores)]):
                wall, rss, report = validate(str(pair / "draft"), "--target", str(pair / "target"), "--prompts",
                                             str(pair / "prompts.txt"), "--max-new-tokens", args.max_new_tokens,
                                             *threads)
                describe(f"pair {pair}, end to end (all levels)", wall, rss, report, 20)
        else:
            print(f"trained pair {pair} not present: skipped")
        if args.target_shape != "none":
            end_to_end_at_size(root, args.target_shape, args.size_new_tokens, args.target_layers, args.device,
                               args.size_levels, args.size_context_lengths)
    finally:
        if args.json is not None:
            args.json.write_text(json.dumps(FIGURES, indent=1) + "\n")
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
