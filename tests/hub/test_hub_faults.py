"""A Hub that misbehaves, against the real CLI in a subprocess and the real huggingface_hub client: every
downloaded byte checked against the hash the Hub announced, every wait bounded, every stop signal
obeyed at once. Each case asserts the exit code, the one `Error:` line, what is left at -o, beside it
and in the cache, that the command ended in bounded time (generous bounds: the timeouts are set
short through the environment), and that the token appears nowhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hub_server import TOKEN, BlobServer, local_files
from processes import stop_signals_at_default

FAST = {"HF_HUB_ETAG_TIMEOUT": "1", "HF_HUB_DOWNLOAD_TIMEOUT": "1", "DFLASH_CONVERT_HUB_PATIENCE": "4"}
BOUND = 30  # seconds: what each faulty case must end within with FAST (about 4-12 s when it works)


class Run:
    def __init__(self, p: subprocess.Popen, started: float):
        try:
            self.out, self.err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
        self.code, self.seconds = p.returncode, time.monotonic() - started
        assert TOKEN not in self.out + self.err

    def error_line(self, *needles: str, code: int = 1) -> str:
        assert self.code == code, (self.code, self.err[-3000:])
        lines = [line for line in self.err.splitlines() if line.startswith("Error:")]
        assert len(lines) == 1 and "Traceback" not in self.err, self.err[-3000:]
        for needle in needles:
            assert needle in lines[0], (needle, lines[0])
        return lines[0]


def start(*args, **env) -> tuple[subprocess.Popen, float]:
    full = {**os.environ, **FAST, **env}
    p = subprocess.Popen([sys.executable, "-m", "dflash_convert", *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=full,
                         preexec_fn=stop_signals_at_default)
    return p, time.monotonic()


def run(*args, **env) -> Run:
    return Run(*start(*args, **env))


def cache_files(home: Path) -> dict[str, bytes]:
    """Every complete file in the Hub cache (blobs by name), and the names of any partial ones."""
    return {p.name: p.read_bytes() for p in (home / "hub").rglob("*") if p.is_file() and not p.is_symlink()
            and p.suffix != ".lock"}


def assert_nothing_at_or_beside(out: Path) -> None:
    assert not out.exists()
    assert not [q.name for q in out.parent.iterdir() if q.name.startswith(f".{out.name}.")] if out.parent.exists() \
        else True


def assert_no_token_on_disk(root: Path, home: Path) -> None:
    for f in root.rglob("*"):
        if f.is_file() and f != home / "token":
            assert TOKEN.encode() not in f.read_bytes(), f


@pytest.fixture
def seeded(hub, draft):
    hub.seed_repo("org/d", local_files(draft))
    return local_files(draft)


# ----------------------------------------------------------------------------- every byte checked

@pytest.mark.parametrize("name, kind", [("model.safetensors", "corrupt"), ("config.json", "corrupt"),
                                        ("model.safetensors", "truncate")])
def test_a_body_unlike_the_announced_hash_is_refused(hub, seeded, tmp_path, hub_env, name, kind):
    """Complete-looking bodies whose bytes are not the file's: one line, nothing at -o, not in the cache."""
    out = tmp_path / "pulls" / "out"
    hub.fault(f"org/d/{name}", kind, n=100)
    for extra in (["-o", out], []):
        r = run("pull", "org/d", *extra)
        r.error_line("org/d@main", name)
        assert r.seconds < BOUND
        assert_nothing_at_or_beside(out)
        good = hashlib.sha256(seeded[name]).hexdigest()
        assert all(data == seeded[n] for n, data in local_files(hub_env / "hub").items() if n.endswith(name)), \
            "a bad body is in the cache"
        assert good not in cache_files(hub_env) or cache_files(hub_env)[good] == seeded[name]
    hub.fault(f"org/d/{name}", kind, n=0)
    hub.state.faults.clear()
    r = run("pull", "org/d", "-o", out)  # the next run downloads it again, whole
    assert r.code == 0, r.err
    assert (out / name).read_bytes() == seeded[name]
    assert_no_token_on_disk(tmp_path, hub_env)


def test_a_blob_damaged_in_the_cache_is_refused_by_every_command(hub, seeded, tmp_path, hub_env):
    """After a good download, one bit of the cached weights flips: convert (in its own read), inspect,
    validate and pull refuse it, remove it, and the next run downloads it again."""
    blob = (hub_env / "hub" / "models--org--d" / "blobs" / hashlib.sha256(seeded["model.safetensors"]).hexdigest())

    def damage():
        assert run("pull", "org/d").code == 0  # the good blob, downloaded again if it was removed
        data = bytearray(seeded["model.safetensors"])
        data[-5] ^= 0x10
        blob.write_bytes(bytes(data))

    out = tmp_path / "out"
    for args in (["convert", "org/d", "-o", out], ["inspect", "org/d"], ["pull", "org/d", "-o", out],
                 ["validate", "org/d", "--levels", "static"]):
        damage()
        r = run(*args, HF_HUB_OFFLINE="1")  # the cache alone: what it holds is what is checked
        r.error_line("model.safetensors", "org/d")
        assert_nothing_at_or_beside(out)
        assert not blob.exists()  # removed: never taken for good again
    r = run("convert", "org/d", "-o", out)
    assert r.code == 0, r.err
    record = json.loads((out / "conversion.json").read_text())
    assert record["input_files"]["model.safetensors"] == hashlib.sha256(seeded["model.safetensors"]).hexdigest()
    assert blob.read_bytes() == seeded["model.safetensors"]


# ----------------------------------------------------------------------------- every wait bounded

def test_a_silent_server_ends_the_command(hub, seeded, tmp_path, hub_env):
    """Accepts the connection and says nothing: on the first request, or half-way through the weights."""
    out = tmp_path / "out"
    hub.fault("/api/models/org/d", "stall_headers", n=1000)
    r = run("pull", "org/d", "-o", out)
    r.error_line("org/d@main", "gave up", "DFLASH_CONVERT_HUB_PATIENCE")
    assert r.seconds < BOUND
    hub.state.faults.clear()
    hub.fault("org/d/model.safetensors", "stall_body", n=1000)
    for args in (["pull", "org/d", "-o", out], ["inspect", "org/d"]):
        r = run(*args)
        r.error_line("org/d@main", "model.safetensors")
        assert r.seconds < BOUND
        assert_nothing_at_or_beside(out)
    assert not [p for p in (hub_env / "hub").rglob("*.incomplete")]
    assert "model.safetensors" not in {p.name for p in (hub_env / "hub").rglob("snapshots/*/*")}


def test_retry_after_is_capped_shown_and_the_first_request_retried(hub, seeded, tmp_path):
    """A 500 and a 429 on the first request are retried like any other; a Retry-After beyond the patience
    ends the command at once, saying what the Hub asked for."""
    hub.fault("/api/models/org/d", "status", n=1, status=500, message="unwell")
    hub.fault("/api/models/org/d", "status", n=1, status=429, message="slow down",
              headers={"Retry-After": "1"})
    r = run("pull", "org/d", "--json")
    assert r.code == 0, r.err
    assert "Retry-After: 1" in r.err
    hub.fault("/api/models/org/d", "status", n=1000, status=429, message="slow down",
              headers={"Retry-After": "100001"})
    r = run("pull", "org/d")
    r.error_line("org/d@main", "gave up", "100001")
    assert r.seconds < BOUND
    hub.state.faults.clear()
    hub.fault("/model.safetensors", "status", n=1000, status=503, message="busy")
    r = run("pull", "org/d", "-o", tmp_path / "out")
    r.error_line("org/d@main", "model.safetensors")
    assert r.seconds < BOUND
    assert_nothing_at_or_beside(tmp_path / "out")


def test_a_reset_mid_file_resumes_from_the_partial_file(hub, draft, tmp_path):
    """A TCP reset half-way through a 24 MB file: the download goes on from what it has (the client writes
    its 10 MB chunks as they come), and the whole file is checked."""
    weights = os.urandom(24 << 20)
    hub.seed_repo("org/big", {"config.json": (draft / "config.json").read_bytes(), "model.safetensors": weights})
    hub.fault("org/big/model.safetensors", "reset", n=1)
    out = tmp_path / "out"
    r = run("pull", "org/big", "-o", out)
    assert r.code == 0, r.err
    assert (out / "model.safetensors").read_bytes() == weights
    assert [rng for f, rng in hub.ranges if f == "model.safetensors" and not rng.startswith("bytes=0-")], hub.ranges


@pytest.mark.parametrize("served", ["good", "corrupt", "same host"])
def test_a_redirect_to_another_port(hub, seeded, tmp_path, served):
    """The Hub sends the weights' download to a CDN on another port (and host name, as a CDN is): the token
    does not follow it, and the bytes from there are checked as any others. Another port of the Hub's
    own host name gets no token either (huggingface_hub 1.x sends it there on a HEAD)."""
    data = bytearray(seeded["model.safetensors"])
    if served == "corrupt":
        data[100] ^= 0x01
    cdn = BlobServer({"model.safetensors": bytes(data)}).start()
    try:
        to = cdn.url if served == "same host" else cdn.url.replace("127.0.0.1", "localhost")
        hub.fault("org/d/model.safetensors", "redirect", n=1000, to=to)
        out = tmp_path / "out"
        r = run("pull", "org/d", "-o", out)
        if served == "same host":  # 2.x does not follow a HEAD off the origin; 1.x does and finds no metadata
            assert r.code == 0 or r.error_line("model.safetensors")
        elif served == "good":
            assert r.code == 0, r.err
            assert (out / "model.safetensors").read_bytes() == seeded["model.safetensors"]
        else:
            r.error_line("org/d@main", "model.safetensors", "sha256")
            assert_nothing_at_or_beside(out)
        assert not any(cdn.authorization)  # never the token
        assert served == "same host" or cdn.authorization  # reached
    finally:
        cdn.stop()


# ----------------------------------------------------------------------------- stop signals

@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_ends_a_stalled_download_at_once(hub, seeded, tmp_path, hub_env, sig):
    hub.fault("org/d/model.safetensors", "stall_body", n=1000)
    out = tmp_path / "out"
    for args in (["pull", "org/d", "-o", out], ["inspect", "org/d"]):
        p, _ = start(*args, DFLASH_CONVERT_HUB_PATIENCE="60", HF_HUB_DOWNLOAD_TIMEOUT="60")
        deadline = time.monotonic() + 60
        while not [m for m, path in list(hub.requests) if m == "GET" and path.endswith("/model.safetensors")]:
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
        time.sleep(0.3)  # half the body is in
        p.send_signal(getattr(signal, sig))
        r = Run(p, time.monotonic())
        line = r.error_line("interrupted", code=128 + getattr(signal, sig))
        if args[0] == "inspect" and sig != "SIGINT":  # into the cache: what is true there (Ctrl-C: the CLI's line)
            assert "while downloading 'model.safetensors' of org/d@main" in line and "partial one was removed" in line
        assert r.seconds < 5  # 2 s asked; generous on a loaded machine
        assert_nothing_at_or_beside(out)
        assert not [q for q in (hub_env / "hub").rglob("*.incomplete")]
        hub.requests.clear()


# ----------------------------------------------------------------------------- names checked before any request

@pytest.mark.parametrize("args", [
    ["pull", "org/d", "--revision", "a/../../b"],
    ["pull", "org/d", "--revision", "/main"],
    ["inspect", "org/d", "--revision", "main\x85"],
    ["push", "DRAFT", "org/d", "--create-pr", "--revision", "dev"],
    ["convert", "DRAFT", "-o", "OUT", "--push", "org/d", "--push-revision", "dev", "--create-pr"],
])
def test_refused_before_any_request(hub, draft, tmp_path, args):
    r = run(*[draft if a == "DRAFT" else tmp_path / "out" if a == "OUT" else a for a in args])
    r.error_line(code=2)
    assert not hub.requests
    assert not (tmp_path / "out").exists()


def test_a_c1_control_character_in_a_remote_name_is_refused(hub, draft, tmp_path):
    hub.seed_repo("org/evil", {"config.json": (draft / "config.json").read_bytes()})
    hub.inject_file("org/evil", "evil\x9b2J.safetensors", b"pwned")
    r = run("pull", "org/evil", "-o", tmp_path / "out")
    r.error_line("escapes")
    assert "\x9b" not in r.err
    assert not [req for req in hub.requests if "/resolve/" in req[1]]


REF_CHARS = st.sampled_from(list("ab0/._-~^:?*[\\@{} \t\x00\x1b\x7f\x85\x9f") + ["..", "refs/pr/1", ".lock"])


@settings(max_examples=400, deadline=None)
@given(st.lists(REF_CHARS, min_size=1, max_size=12).map("".join))
@example("a/")
@example("/a")
@example("a//b")
def test_an_accepted_revision_stays_inside_refs(revision):
    """Whatever a revision holds, one that passes names a path inside the cache's refs/ directory and
    holds nothing a terminal or git would read otherwise."""
    from dflash_convert.errors import UsageError
    from dflash_convert.hub.client import check_revision

    try:
        check_revision(revision)
    except UsageError:
        return
    assert os.path.normpath(os.path.join("/cache/refs", revision)).startswith("/cache/refs/")
    assert not any(ord(c) < 0x21 or 0x7f <= ord(c) <= 0x9f for c in revision)
    assert ".." not in revision and not revision.startswith("/") and not revision.endswith("/")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789abcdef", min_size=40, max_size=40))
def test_a_commit_id_always_passes(sha):
    from dflash_convert.hub.client import check_revision

    check_revision(sha)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=24))
def test_an_accepted_file_name_stays_inside_the_download_directory(name):
    from dflash_convert.hub.client import unsafe_repo_path

    if unsafe_repo_path(name):
        return
    assert os.path.normpath(os.path.join("/dl", name)).startswith("/dl/")
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in name)


@pytest.mark.parametrize("asked, obeyed", [("100001", 60.0), ("61", 60.0), ("60", 60.0), ("5", 5.0)])
def test_a_long_retry_after_is_shortened_to_the_cap(asked, obeyed, monkeypatch, capsys):
    """The Hub's wait is obeyed up to RETRY_AFTER_CAP (60 s) and no longer, both where the client reads
    the header (the answer is rewritten before it does) and where this tool schedules its own retry; the
    shortening is said. A patience of 1000 s: the cap, not the patience, decides."""
    from huggingface_hub import errors
    from huggingface_hub.utils import httpx as http

    from dflash_convert.hub import transport

    monkeypatch.setenv(transport.PATIENCE_VARIABLE, "1000")
    transport._watch.start()
    url = "https://hub.test/api/models/org/d/revision/main"
    response = http.Response(429, headers={"Retry-After": asked}, request=http.Request("GET", url))
    transport._on_response(response)
    assert float(response.headers["Retry-After"]) == obeyed
    err = capsys.readouterr().err
    assert f"retrying in {obeyed:g} s" in err
    assert ("capped at 60 s" in err) == (float(asked) > 60)
    exc = errors.HfHubHTTPError("slow down", response=response)
    response.headers["Retry-After"] = asked  # as sent, before any rewriting
    assert transport._retry_delay(exc, backoff=2.0) == obeyed + 1


@pytest.mark.parametrize("ratelimit, retry_after, obeyed", [
    ('"api";r=0;t=100001', None, 60), ('"api";r=0;t=61', "5", 60), ('"api";r=0;t=55', None, 55),
    ('"api";r=0;t=5', "100001", 5),  # the client sleeps for the reset and reads no Retry-After
    ('"api";r=3;t=100001', "7", 7),  # requests left: the client ignores the reset
])
def test_a_ratelimit_reset_is_the_wait_and_is_capped(ratelimit, retry_after, obeyed, monkeypatch, capsys):
    """On a 429 whose `RateLimit` says no request is left (r=0) the client sleeps for its reset (t), before
    any Retry-After: that is the wait shown, checked against the patience, capped at RETRY_AFTER_CAP in
    the header the client reads, and the delay of this tool's own retry."""
    from huggingface_hub import errors
    from huggingface_hub.utils import httpx as http

    from dflash_convert.hub import transport

    monkeypatch.setenv(transport.PATIENCE_VARIABLE, "1000")
    transport._watch.start()
    url = "https://hub.test/api/models/org/d/revision/main"
    headers = {"RateLimit": ratelimit, **({"Retry-After": retry_after} if retry_after else {})}
    response = http.Response(429, headers=headers, request=http.Request("GET", url))
    transport._on_response(response)
    err = capsys.readouterr().err
    assert f"retrying in {obeyed:g} s" in err
    t = int(ratelimit.rpartition("t=")[2])
    if "r=0" in ratelimit:
        assert response.headers["RateLimit"] == ratelimit.replace(f"t={t}", f"t={min(t, 60)}")
        assert f"RateLimit reset: {t} s" in err and ("capped at 60 s" in err) == (t > 60)
    exc = errors.HfHubHTTPError("slow down", response=response)
    response.headers.update(headers)  # as sent, before any rewriting
    assert transport._retry_delay(exc, backoff=2.0) == obeyed + 1


@pytest.mark.parametrize("revision", ["a/", "main/", "refs/pr/1/", "/a", "a//b", "a/./b", "a/../b", "a.lock",
                                      "a.", ".a", "a b", "a@{1}"])
def test_revisions_git_would_refuse_are_usage_errors(revision):
    """The boundary cases of git's ref rules, stated: a property test finds them only by chance."""
    from dflash_convert.errors import UsageError
    from dflash_convert.hub.client import check_revision

    with pytest.raises(UsageError, match="is not a branch, tag or commit id"):
        check_revision(revision)
