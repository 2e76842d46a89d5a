"""Our validate beside real vLLM on the bundled pair: drafts / accepted / tau, three ways each, for the
draft as trained (causal), served non-causal (`sliding_window_non_causal: true`) and wired to the
wrong target layers (ids [2, 6] instead of [1, 5]). Prints a Markdown table (docs/validate-guide.md's).

    python benchmarks/vllm_side_by_side.py --engine-python build/vllm-venv/bin/python

Each row is one `validate --engine vllm --engine-python PATH` run (16 prompts x 64 tokens, greedy, each
checkpoint's own dtype, bfloat16): our loop (last block shortened), our loop counted as vLLM counts
(full last block) and vLLM's own counters.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from dflash_convert.validate import ValidateOptions, validate

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "examples" / "pair"


def copies(root: Path) -> dict[str, Path]:
    out = {"causal (as trained)": PAIR / "draft"}
    for name, edit in (("forced non-causal", lambda c: c.update(sliding_window_non_causal=True)),
                       ("wrong layer ids [2, 6]", lambda c: c.update(aux_hidden_state_layer_ids=[3, 7]))):
        dst = root / name.split()[0]
        shutil.copytree(PAIR / "draft", dst)
        cfg = json.loads((dst / "config.json").read_text())
        edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
        out[name] = dst
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine-python", required=True, help="a Python with vLLM (`self`: this one)")
    ap.add_argument("--engine-args", default="{}", help="JSON for vLLM's LLM(...)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, draft in copies(Path(tmp)).items():
            t0 = time.perf_counter()
            r = validate(draft, ValidateOptions(
                target=PAIR / "target", prompts=PAIR / "prompts.txt", max_new_tokens=64, sampling="greedy", engine="vllm",
                levels=["static", "end_to_end"], keep_going=True, timing_rounds=1,
                engine_python=args.engine_python, engine_args=json.loads(args.engine_args)),
                progress=lambda m: print(m, file=sys.stderr))
            a, full, e = r.acceptance, r.acceptance.vllm_counting, r.engine_run.counts
            agree = next(c.status for c in r.checks if c.name == "engine_acceptance_agrees")
            rows.append(f"| {name} | {a.num_drafts} / {a.accepted} / {a.acceptance_length:.3f} | {full.num_drafts} / "
                        f"{full.accepted} / {full.acceptance_length:.3f} | {e.num_drafts} / {e.accepted} / "
                        f"{e.acceptance_length:.3f} | {r.engine_run.outputs_equal}/{r.engine_run.prompts} | {agree} | "
                        f"{time.perf_counter() - t0:.0f} s |")
    version = r.engine_run.version
    print("| run | our loop: drafts / accepted / tau | ours, counted as vLLM: drafts / accepted / tau | "
          f"vLLM {version} CPU: drafts / accepted / tau | outputs equal | engine_acceptance_agrees | wall |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
