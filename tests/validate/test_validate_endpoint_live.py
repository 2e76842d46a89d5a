"""`validate --endpoint` against real vLLM servers on loopback (the CPU build: `python -m
vllm.entrypoints.openai.api_server`; its `vllm` script fails on the CPU distribution's package name).

Three servers, started together once for this module (a few minutes on a busy 2-core machine), each serving
several cases:
- `spec`: the bundled pair on two tensor-parallel workers, per-request statistics on, an API key required, and a
  tokenizer whose word `t<i>` is
  id i with a chat template that renders the contents alone (chat prompts are then the same ids);
- `plain`: the bundled target alone (the baseline, and a server that does not speculate);
- `miswired`: a copy of the bundled draft whose target layer ids are wrong, per-request statistics off (the
  counter path, other traffic, and a deployment that does not serve the draft as trained).
Not run here: data-parallel ranks (the counter path's sum over every `engine` label is tested against the fake
server), and SGLang (no CPU build).

Needs a Python with vLLM ($DFLASH_VLLM_PYTHON, else build/vllm-venv/bin/python); skipped without one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from factories import token_words_target
from processes import VLLM_PYTHON, needs_vllm

pytestmark = needs_vllm

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "examples" / "pair"
KEY = "sk-live-test-key-never-printed"
START_TIMEOUT_S = 900
TOKENS = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `vllm serve` of the pair's target on loopback, in its own process group."""

    def __init__(self, log: Path, *args: str, target: Path = PAIR / "target", env: dict | None = None):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
        tokenizer = [] if (target / "tokenizer.json").exists() else ["--skip-tokenizer-init"]
        command = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
                   "--served-model-name", "pair", *tokenizer, "--enforce-eager", "--max-model-len", "384",
                   "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def ready(self) -> bool:
        import httpx

        if self.proc.poll() is not None:
            raise RuntimeError(f"vLLM exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=wait)
                return
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue

    def metrics(self) -> str:
        import httpx

        return httpx.get(self.url + "/metrics", timeout=10).text


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    work = tmp_path_factory.mktemp("served")
    miswired = work / "miswired"
    shutil.copytree(PAIR / "draft", miswired)
    config = json.loads((miswired / "config.json").read_text())
    config["aux_hidden_state_layer_ids"] = [1, 5]  # the pair's draft reads layers 2 and 6
    (miswired / "config.json").write_text(json.dumps(config))

    def spec(draft: Path) -> list[str]:
        return ["--speculative-config", json.dumps({"method": "dflash", "model": str(draft),
                                                    "num_speculative_tokens": 15})]

    started = time.monotonic()
    worded = token_words_target(PAIR / "target", work / "target")  # chat prompts too
    running = {"spec": Server(work / "spec.log", *spec(PAIR / "draft"), "--per-request-spec-decode-metrics",
                              "summary", "--api-key", KEY, "--tensor-parallel-size", "2", target=worded,
                              env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}),  # a CPU build binds one range per worker
               "plain": Server(work / "plain.log"),
               "miswired": Server(work / "miswired.log", *spec(miswired))}
    try:
        while not all(s.ready() for s in running.values()):
            if time.monotonic() - started > START_TIMEOUT_S:
                raise RuntimeError(f"vLLM servers not up within {START_TIMEOUT_S} s")
            time.sleep(2)
        print(f"\nthree vLLM servers up in {time.monotonic() - started:.0f} s", file=sys.stderr)
        yield running
    finally:
        for s in running.values():
            s.stop()


def _counters(text: str) -> tuple[int, int, list[int]]:
    from dflash_convert.validate.endpoint.counts import parse_metrics

    spec = parse_metrics(text).spec
    return spec.steps, spec.accepted, spec.per_position


def test_per_request_counts_equal_what_metrics_moved_by(servers, cli, monkeypatch, tmp_path):
    """The server's own per-request counts, summed: exactly what its /metrics moved by; the same prompts as chat
    messages (through the server's template) and as token ids give the same counts; the key never shown."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server = servers["spec"]
    chat = tmp_path / "chat.jsonl"
    lines = [line.split() for line in (PAIR / "prompts.txt").read_text().splitlines() if line.strip()]
    chat.write_text("".join(json.dumps({"messages": [{"role": "user", "content": " ".join(f"t{t}" for t in ids)}]})
                            + "\n" for ids in lines))
    runs = {}
    for name, prompts in (("chat", chat), ("ids", PAIR / "prompts.txt")):
        before = _counters(server.metrics())
        r = cli("validate", "--endpoint", server.url, "--prompts", prompts, "--sampling", "greedy",
                "--max-new-tokens", TOKENS, "--json", "--min-acceptance-length", "3")
        assert r.code == 0, r.err
        after = _counters(server.metrics())
        e = runs[name] = r.json()["endpoint"]
        assert e["counted"].startswith("per-request") and e["engine"] == "vllm" and e["prompts"] == 16
        steps, accepted = after[0] - before[0], after[1] - before[1]
        assert (e["counts"]["num_drafts"], e["counts"]["accepted"]) == (steps, accepted)
        assert e["counts"]["per_position_rates"] == [round((a - b) / steps, 4) for a, b in zip(after[2], before[2])]
        assert KEY not in r.out + r.err
    assert {q["path"] for q in runs["chat"]["per_request"]} == {"/v1/chat/completions"}
    assert {q["path"] for q in runs["ids"]["per_request"]} == {"/v1/completions"}
    assert runs["chat"]["counts"] == runs["ids"]["counts"]
    monkeypatch.delenv("OPENAI_API_KEY")
    r = cli("validate", "--endpoint", server.url)
    assert r.code == 1 and "HTTP 401" in r.err and "$OPENAI_API_KEY is not set" in r.err


def test_tensor_parallel_deployment_agrees_with_the_offline_emulation(servers, cli, monkeypatch):
    """The pair served on two tensor-parallel workers gives what the runtime's emulation of vLLM gives offline."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--endpoint", servers["spec"].url,
            "--prompts", PAIR / "prompts.txt", "--sampling", "greedy", "--max-new-tokens", TOKENS,
            "--levels", "static,end_to_end", "--json")
    assert r.code == 0, r.err
    check = next(c for c in r.json()["checks"] if c["name"] == "endpoint_acceptance_agrees")
    assert check["status"] == "pass", check["message"]
    endpoint = r.json()["endpoint"]
    assert endpoint["counts"] == endpoint["offline"]


def test_baseline_endpoint_outputs_equal_and_speedup(servers, cli, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the plain server takes none: sent, and ignored
    r = cli("validate", "--endpoint", servers["spec"].url, "--baseline-endpoint", servers["plain"].url,
            "--prompts", PAIR / "prompts.txt", "--sampling", "greedy", "--max-new-tokens", TOKENS, "--concurrency",
            "4", "--json")
    assert r.code == 0, r.err
    b = r.json()["endpoint"]["baseline_endpoint"]
    assert b["outputs_equal"] == 16 and b["rounds"] == 3 and b["speedup"] > 0 and len(b["speedup_range"]) == 2
    print(f"\nspeedup over the plain server: {b['speedup']:.2f}x ({b['speedup_range']})", file=sys.stderr)


def test_plain_server_does_not_speculate(servers, cli):
    r = cli("validate", "--endpoint", servers["plain"].url, "--prompts", PAIR / "prompts.txt", "--max-new-tokens", 8)
    assert r.code == 1 and "the endpoint does not speculate" in r.err


def test_miswired_deployment_fails_and_offline_says_what_differs(servers, cli):
    """Counters (no per-request statistics); the served draft reads the wrong layers: the threshold fails, and
    the offline run of the draft as trained (vLLM emulated, found from the server) does not agree."""
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--endpoint", servers["miswired"].url,
            "--prompts", PAIR / "prompts.txt", "--sampling", "greedy", "--max-new-tokens", TOKENS,
            "--min-acceptance-length", "8", "--levels", "static,end_to_end", "--json")
    assert r.code == 3, r.err
    report = r.json()
    assert report["endpoint"]["counted"].startswith("the deltas")
    assert report["options"]["engine"] == "vllm"
    failed = r.failed_checks()
    assert "endpoint_acceptance_length" in failed and "endpoint_acceptance_agrees" in failed
    assert "does not serve the draft as it runs offline" in failed["endpoint_acceptance_agrees"]
    assert report["endpoint"]["offline"]["acceptance_length"] > 8 > report["endpoint"]["counts"]["acceptance_length"]


def test_other_traffic_refused_on_the_counter_path(servers, cli, tmp_path):
    """Someone else's requests sent all along on the counter-only server: no figure is claimed as ours."""
    import httpx

    server = servers["miswired"]
    lines = (PAIR / "prompts.txt").read_text().splitlines()
    prompt = [int(t) for t in lines[0].split()]
    prompts = tmp_path / "prompts.txt"  # two of ours are enough to be mixed with the other traffic's steps
    prompts.write_text("\n".join(lines[:2]) + "\n")
    stop = threading.Event()

    def other_traffic():
        with httpx.Client(timeout=300) as client:
            while not stop.is_set():
                client.post(server.url + "/v1/completions", json={"model": "pair", "prompt": prompt, "max_tokens": 48,
                                                                  "ignore_eos": True})

    other = threading.Thread(target=other_traffic)
    other.start()
    try:
        deadline = time.monotonic() + 120
        while _running(server.metrics()) == 0:  # the other traffic has reached the server
            assert time.monotonic() < deadline, "the other requests never ran"
            time.sleep(0.02)
        r = cli("validate", "--endpoint", server.url, "--prompts", prompts, "--max-new-tokens", 8)
    finally:
        stop.set()
        other.join()
    assert r.code == 1 and "cannot measure" in r.err and "--per-request-spec-decode-metrics" in r.err


def _running(text: str) -> float:
    """Requests running or waiting on the server, by its /metrics."""
    from dflash_convert.validate.endpoint.counts import parse_metrics

    return parse_metrics(text).in_flight


def test_context_lengths_cut_by_the_servers_tokenizer(servers, cli, monkeypatch, tmp_path):
    """--context-lengths against the served pair: the text cut with the server's own /tokenize (its word `t<i>` is
    id i, so the windows are known), each length's requests counted on their own; a length past the served
    max_model_len (384) refused before anything is generated."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server = servers["spec"]
    ids = [int(t) for line in (PAIR / "prompts.txt").read_text().splitlines() for t in line.split()][:200]
    doc = tmp_path / "doc.txt"
    doc.write_text(" ".join(f"t{i}" for i in ids))
    r = cli("validate", "--endpoint", server.url, "--prompts", PAIR / "prompts.txt", "--sampling", "greedy",
            "--max-new-tokens", 16, "--context-lengths", "96,192", "--long-context-file", doc, "--json")
    assert r.code == 0, r.err
    e = r.json()["endpoint"]
    assert [(s["context_tokens"], s["prompts"]) for s in e["per_context_length"]] == [(96, 2), (192, 1)]
    assert all(s["num_drafts"] > 0 for s in e["per_context_length"])
    assert "cut with the server's own tokenizer" in e["context_source"]
    r = cli("validate", "--endpoint", server.url, "--prompts", PAIR / "prompts.txt", "--max-new-tokens", 16,
            "--context-lengths", "380", "--long-context-file", doc)
    assert r.code == 2 and "380 + --max-new-tokens 16 = 396 tokens exceeds the max_model_len 384" in r.err
