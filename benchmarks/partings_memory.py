"""Peak memory of judging a long greedy output that parts from the target's (validate's greedy_output_equal):
the whole [N, V] float32 logits of both target paths, as validate kept them before, against the parting rows
only (end_to_end._partings, dflash_runtime.paths.one_token_partings / verify_logits(rows=...)).

A random 2-layer Qwen3-shaped target (hidden 64) with Qwen3's vocabulary (151936 ids), so that the logits, not
the weights, are the memory; one prompt, N generated tokens, two of them off the greedy choice. Each way runs
in its own process (peak RSS is per process) and prints its peak RSS and the partings found (equal both ways):

    python benchmarks/partings_memory.py --tokens 1024
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB = 151936


def build_target(directory: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=16384,
                         tie_word_embeddings=True)
    Qwen3ForCausalLM(config).to(torch.float32).save_pretrained(directory)


def measure(directory: Path, tokens: int, way: str) -> dict:
    """One way's partings and peak RSS (this process)."""
    from types import SimpleNamespace

    import torch

    from dflash_convert.validate import end_to_end
    from dflash_runtime import load_target, target_generate
    from dflash_runtime.paths import one_token_logits, verify_logits
    from dflash_runtime.sampling import Sampling

    torch.set_num_threads(1)
    target = load_target(directory)
    prompt = [11, 22, 33, 44]
    out = target_generate(target, prompt, max_new_tokens=tokens, sampling=Sampling(temperature=0.0)).tokens
    # two tokens off the greedy choice near the end (the tokens after them are no longer the greedy ones either):
    # each parting is judged by both paths
    for k in (tokens - 8, tokens - 3):
        out[k] = (out[k] + 1) % VOCAB
    steps = [3] * ((tokens - 1) // 4) + ([tokens - 1 - 4 * ((tokens - 1) // 4) - 1] if (tokens - 1) % 4 else [])
    run = SimpleNamespace(tokens=out, accepted_per_step=steps)
    kw = dict(proposals=3, max_new_tokens=tokens)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t = time.perf_counter()
    if way == "rows":
        found = end_to_end._partings(target, prompt, run, None, "float32", None, **kw)
        result = [(p.at, p.taken, p.other, p.taken_logit, p.other_logit, p.verify_taken, p.verify_other)
                  for p in found]
    else:  # the whole tensors, as validate held them before: the teacher-forced block, both paths
        ids = torch.tensor(prompt + out)
        target.set_capture([])
        target.reset()
        first, _ = target.forward(ids[:len(prompt)], 0, last_logits_only=True)
        rest = target.forward(ids[len(prompt):-1], len(prompt))[0]
        rows = torch.cat([first[-1:], rest])
        target.reset()
        one = one_token_logits(target, prompt, out, max_new_tokens=tokens)
        greedy = one.argmax(dim=-1).tolist()
        verify = verify_logits(target, prompt, out, steps, **kw)
        result = [(k, greedy[k], out[k], float(one[k, greedy[k]]), float(one[k, out[k]]),
                   float(verify[k, greedy[k]]), float(verify[k, out[k]])) for k in range(tokens) if greedy[k] != out[k]]
        del rows
    return {"way": way, "tokens": tokens, "seconds": round(time.perf_counter() - t, 1), "before_bytes": base,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "partings": result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024, help="generated tokens N")
    ap.add_argument("--child", nargs=2, metavar=("DIR", "WAY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(Path(args.child[0]), args.tokens, args.child[1])))
        return
    with tempfile.TemporaryDirectory() as tmp:
        build_target(Path(tmp))
        got = {}
        for way in ("whole", "rows"):
            done = subprocess.run([sys.executable, __file__, "--tokens", str(args.tokens), "--child", tmp, way],
                                  check=True, capture_output=True, text=True)
            got[way] = json.loads(done.stdout.strip().splitlines()[-1])
    n = args.tokens
    print(f"N = {n} generated tokens, V = {VOCAB}: one [N, V] float32 tensor is {n * VOCAB * 4 / 1e9:.2f} GB")
    for way, r in got.items():
        print(f"  {way:>5}: peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB (after loading and generating "
              f"{r['before_bytes'] / 1e9:.2f} GB), {r['seconds']} s, partings at {[p[0] for p in r['partings']]}")
    print(f"  the same partings, logits bit for bit: {got['whole']['partings'] == got['rows']['partings']}")


if __name__ == "__main__":
    main()
