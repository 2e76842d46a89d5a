"""How long each fault of a misbehaving Hub takes to end `dflash-convert pull org/d -o DIR`, with the default
settings (no timeout or patience variable set): the loopback Hub of the tests (tests/hub_server.py) with the
real huggingface_hub client, a 24 MB weight file. Prints the exit code, seconds, the error line and what is
left in the work directory (`home` is the Hub cache; never `out` unless the pull succeeded).

    python benchmarks/hub_faults_bench.py [case substring ...]
"""
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hub_server import HubServer  # noqa: E402

TOKEN = "hf_fakeTokenForTestsOnly0123456789abcdef"
cases = [
    ("stall before headers, first request", "/api/models/org/d", "stall_headers", {}),
    ("stall before headers, file HEAD", "/model.safetensors", "stall_headers", {}),
    ("stall mid-body", "org/d/model.safetensors", "stall_body", {}),
    ("503 forever on the file", "/model.safetensors", "status", {"status": 503}),
    ("500 forever on the first request", "/api/models/org/d", "status", {"status": 500}),
    ("429 Retry-After 100001", "/api/models/org/d", "status", {"status": 429, "headers": {"Retry-After": "100001"}}),
    ("429 Retry-After 30 forever", "/api/models/org/d", "status", {"status": 429, "headers": {"Retry-After": "30"}}),
    ("corrupt body", "org/d/model.safetensors", "corrupt", {}),
    ("truncated body", "org/d/model.safetensors", "truncate", {}),
    ("reset mid-body once", "org/d/model.safetensors", "reset", {"n": 1}),
    ("SIGTERM during stall mid-body", "org/d/model.safetensors", "stall_body", {"signal": True}),
]
only = sys.argv[1:]
for label, part, kind, params in cases:
    if only and not any(o in label for o in only):
        continue
    hub = HubServer(valid_token=TOKEN).start()
    hub.seed_repo("org/d", {"config.json": b'{"a": 1}', "model.safetensors": os.urandom(24 << 20)})
    params = dict(params); sig = params.pop("signal", False)
    hub.fault(part, kind, n=params.pop("n", 100000), **params)
    d = Path(tempfile.mkdtemp())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_HUB_ETAG", "HF_HUB_DOWNLOAD", "DFLASH_CONVERT_HUB"))}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(d / "home"), HF_TOKEN=TOKEN, HF_HUB_DISABLE_XET="1")
    p = subprocess.Popen([sys.executable, "-m", "dflash_convert", "pull", "org/d", "-o", str(d / "out")], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t = time.monotonic()
    if sig:
        while not [r for r in list(hub.requests) if r[0] == "GET" and r[1].endswith("model.safetensors")]:
            time.sleep(0.05)
        time.sleep(0.5); t = time.monotonic(); p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=300)
    el = time.monotonic() - t
    line = [l for l in err.splitlines() if l.startswith("Error:")]
    left = sorted(q.name for q in d.iterdir())
    print(f"{label:<38} exit {p.returncode} {el:6.1f} s  {line[0][:150] if line else '(ok)'}  left: {left}", flush=True)
    hub.stop()
