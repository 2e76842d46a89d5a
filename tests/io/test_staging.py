"""Nothing half-written at or beside the destination: signals, killed runs, full disks, odd destinations.

Signal tests run the real CLI in a subprocess that pauses inside the tensor copy (a wrapped
copy_range), so every signal lands while the staging directory is half full, on any machine speed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_convert.io.staging import staging_leftovers
from processes import STOP_SIGNALS, stop_signals_at_default

CHILD = r'''
import os, signal, sys, time
from pathlib import Path

src, out, sig, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
go = Path(out).parent / "go"
if mode == "ignored":  # as under nohup (the test starts every stop signal at its default otherwise)
    signal.signal(sig, signal.SIG_IGN)

import dflash_convert.convert.conversion as convert

real_copy = convert.copy_range
calls = [0]


def paused_copy(*args, **kwargs):
    real_copy(*args, **kwargs)
    calls[0] += 1
    if calls[0] == 3 and mode not in ("commit", "mkdir"):
        if mode == "stuck":  # inside one long C call, as a long-context prefill is: the main thread cannot run
            # a Python handler until it returns (the stop signals are blocked for it alone, so no EINTR cuts the
            # call short; another thread takes them, as a compute thread of the real case would)
            import ctypes
            c_sleep = ctypes.CDLL(None).sleep  # releases the GIL, as torch's kernels do
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})
            print("WRITING", flush=True)
            c_sleep(60)
        print("WRITING", flush=True)
        deadline = time.time() + 60
        while not go.exists() and time.time() < deadline:
            time.sleep(0.02)


convert.copy_range = paused_copy
if mode == "commit":  # the signal arrives while the finished directory is being renamed into place
    real_rename = Path.rename

    def signalled_rename(self, target):
        if ".dflash-staging-" in self.name:
            os.kill(os.getpid(), sig)
        return real_rename(self, target)

    Path.rename = signalled_rename
if mode == "mkdir":  # the signal arrives the instant the staging directory exists
    real_mkdir = Path.mkdir

    def signalled_mkdir(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if ".dflash-staging-" in self.name:
            os.kill(os.getpid(), sig)

    Path.mkdir = signalled_mkdir

import dflash_convert.cli._entry as entry
from dflash_convert.cli import main

if mode == "twice":  # a second signal while the first one's error line is being printed
    real_fail = entry._fail

    def fail_signalled_again(*args, **kwargs):
        os.kill(os.getpid(), sig)
        time.sleep(0.05)
        real_fail(*args, **kwargs)

    entry._fail = fail_signalled_again

if mode == "teardown":  # a second signal once the interpreter has put its signal handlers back to the default
    class SignalAtTeardown:  # __main__'s globals are cleared after that, while the process ends
        def __del__(self, kill=os.kill, pid=os.getpid(), sleep=time.sleep, sig=sig):  # globals may be gone
            kill(pid, sig)
            sleep(0.1)

    teardown = SignalAtTeardown()

sys.argv = ["dflash-convert", "convert", src, "-o", out, *sys.argv[5:]]
main()
'''

def start_child(tmp_path: Path, src: Path, out: Path, sig: int, mode: str = "", *extra: str) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.Popen([sys.executable, str(script), str(src), str(out), str(int(sig)), mode, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=stop_signals_at_default)


def wait_writing(p: subprocess.Popen) -> None:
    line = p.stdout.readline()
    assert line.strip() == "WRITING", (line, p.stderr.read() if p.poll() is not None else "")


def leftovers(out: Path) -> list[str]:
    return sorted(q.name for q in out.parent.iterdir() if q.name.startswith(f".{out.name}."))


@pytest.fixture
def src(speculators_drafts):
    return speculators_drafts["full"]


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_signal_mid_write_leaves_nothing(tmp_path, src, sig):
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    p = start_child(tmp_path, src, out, sig)
    wait_writing(p)
    staging = staging_leftovers(out)
    assert len(staging) == 1 and any(staging[0].iterdir())  # the signal lands mid-write
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, (p.returncode, err)  # the shells' code: 130 for Ctrl-C, 143 for SIGTERM
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "interrupted" in lines[0], err
    assert not out.exists()
    assert leftovers(out) == []


def test_sigterm_inside_a_long_c_call_ends_the_run_within_seconds(tmp_path, src):
    """SIGTERM while the main thread is inside one C call of a minute (no Python handler can run until it
    returns): the watchdog ends the run after its grace period with the one line, exit 143, the staging
    directory removed and the destination untouched."""
    from dflash_convert.io.watchdog import GRACE_S

    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    p = start_child(tmp_path, src, out, signal.SIGTERM, "stuck")
    wait_writing(p)
    assert len(staging_leftovers(out)) == 1
    time.sleep(0.5)  # the child is inside the C call by now (a signal a bytecode before it is answered at once)
    sent = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    took = time.monotonic() - sent
    assert p.returncode == 143, (p.returncode, err)
    assert GRACE_S <= took < GRACE_S + 5, took
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["Error: interrupted by SIGTERM; nothing was written"], err
    assert not out.exists() and leftovers(out) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_while_the_process_ends_cannot_kill_it(tmp_path, src, sig):
    """The interpreter puts its signal handlers back to the default as it shuts down: a second signal
    then (a few ms after the first, on a loaded machine) killed the process by the signal after its line."""
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    p = start_child(tmp_path, src, out, sig, "teardown")
    wait_writing(p)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, (p.returncode, err)
    assert f"interrupted by {signal.Signals(sig).name}" in err and not out.exists() and leftovers(out) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("mode", ["mkdir", "twice", "gap"])
def test_signals_at_unlucky_moments(tmp_path, src, sig, mode):
    """The instant the staging directory exists; a second signal while the first one's line prints, or
    2 ms after the first: exit 128 + the signal with one true line, no traceback, never death by the signal, nothing
    at or beside DST."""
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    p = start_child(tmp_path, src, out, sig, mode if mode != "gap" else "")
    if mode != "mkdir":
        wait_writing(p)
        p.send_signal(sig)
    if mode == "gap":
        time.sleep(0.002)
        p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, (p.returncode, err)  # never -sig: death by the signal
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in err, err
    assert f"interrupted by {signal.Signals(sig).name}" in lines[0] and "nothing was written" in lines[0], err
    assert not out.exists() and leftovers(out) == []


def test_signal_ignored_at_start_stays_ignored(tmp_path, src):
    """nohup: SIGHUP is ignored on purpose, and the conversion runs to the end."""
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    p = start_child(tmp_path, src, out, signal.SIGHUP, "ignored")
    wait_writing(p)
    p.send_signal(signal.SIGHUP)
    time.sleep(0.2)
    (out.parent / "go").touch()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert (out / "conversion.json").exists() and leftovers(out) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_commit_never_loses_the_destination(cli, tmp_path, src, sig):
    """A signal while renaming into place (here: replacing an old output) is held until DST is whole."""
    from dflash_convert.convert.diff import diff_checkpoints

    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    assert cli("convert", src, "-o", out).code == 0
    p = start_child(tmp_path, src, out, sig, "commit", "--overwrite", "--to", "speculators")
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0, err  # the held signal is delivered once the commit is done
    assert diff_checkpoints(src, out).equivalent
    assert json.loads((out / "conversion.json").read_text())["destination_format"] == "speculators"
    assert leftovers(out) == []


def test_stale_staging_from_a_killed_run_is_removed(cli, tmp_path, src):
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    p = start_child(tmp_path, src, out, 0)
    wait_writing(p)
    p.kill()
    p.wait()
    stale = staging_leftovers(out)
    assert len(stale) == 1 and str(p.pid) in stale[0].name  # what SIGKILL leaves: ours, and its owner's pid
    # a run still going on the same destination (this test's own pid is alive) is left alone
    live = out.parent / stale[0].name.replace(f"-{p.pid}-", f"-{os.getpid()}-")
    live.mkdir()
    r = cli("convert", src, "-o", out, "--json")
    assert r.code == 0, r.err
    assert not stale[0].exists() and live.exists()
    warnings = json.loads((out / "conversion.json").read_text())["warnings"]
    assert any(str(stale[0]) in w and "removed" in w for w in warnings), warnings
    assert any(str(live) in w and "left as is" in w for w in warnings), warnings
    live.rmdir()
    assert leftovers(out) == []


def test_symlink_destination_is_refused(cli, tmp_path, src):
    target = tmp_path / "real"
    target.mkdir()
    for name, flags in [("link", []), ("link2", ["--overwrite"])]:
        link = tmp_path / name
        link.symlink_to(target)
        r = cli("convert", src, "-o", link, *flags)
        assert r.code == 1 and "symbolic link" in r.err and str(link) in r.err, r.err
        assert link.is_symlink() and list(target.iterdir()) == []
        assert leftovers(link) == []
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    r = cli("convert", src, "-o", dangling)
    assert r.code == 1 and "symbolic link" in r.err
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists()


def test_refused_conversion_creates_no_parent_directories(cli, tmp_path, src):
    import torch
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    t = load_file(bad / "model.safetensors")
    t["norm.weight"][0] = float("nan")  # refused only while writing, after the staging has begun
    save_file(t, bad / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "a" / "b" / "out"
    r = cli("convert", bad, "-o", out)
    assert r.code == 1 and "NaN" in r.err, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]
    r = cli("convert", src, "-o", out)  # and a conversion that succeeds makes them
    assert r.code == 0 and (out / "config.json").exists(), r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "bad"]
    (tmp_path / "file").write_text("x")
    r = cli("convert", src, "-o", tmp_path / "file" / "out")
    assert r.code == 1 and "not a directory" in r.err and "Traceback" not in r.err, r.err


@pytest.mark.parametrize("length", [250, 255])
def test_longest_legal_destination_names(cli, tmp_path, src, length):
    out = tmp_path / ("d" * length)
    r = cli("convert", src, "-o", out)
    assert r.code == 0, r.err
    assert (out / "conversion.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
def test_out_of_space_names_the_destination(cli, tmp_path, src, monkeypatch, code):
    import dflash_convert.convert.conversion as convert

    calls = []

    def full_disk(*args):
        calls.append(1)
        if len(calls) == 4:  # some tensors are written, then the disk is full
            raise OSError(code, os.strerror(code))
        return real(*args)

    real = convert.copy_range
    monkeypatch.setattr(convert, "copy_range", full_disk)
    out = tmp_path / "out"
    r = cli("convert", src, "-o", out)
    assert r.code == 1, r.err
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.err, r.err
    assert str(out) in lines[0] and "out of disk space" in lines[0] and "nothing was written" in lines[0]
    assert not out.exists() and leftovers(out) == []


def test_out_of_space_while_writing_a_header(cli, tmp_path, src, monkeypatch):
    """The same through the plain write path: the disk fills while a shard's header is written."""
    import builtins

    real_open = builtins.open

    class FullFile:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    def opener(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return FullFile(f) if "w" in mode and ".dflash-staging-" in str(file) else f

    monkeypatch.setattr(builtins, "open", opener)
    out = tmp_path / "out"
    r = cli("convert", src, "-o", out)
    monkeypatch.undo()
    assert r.code == 1 and "out of disk space" in r.err and str(out) in r.err, r.err
    assert not out.exists() and leftovers(out) == []


def test_destination_given_as_dot_or_root(cli, tmp_path, src, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    r = cli("convert", src, "-o", ".")  # the (empty) current directory, by its name
    assert r.code == 0, r.err
    assert (here / "conversion.json").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["here"]
    r = cli("convert", src, "-o", "/", "--overwrite")
    assert r.code == 1 and "must name a directory" in r.err, r.err


def test_failed_overwrite_puts_the_old_output_back(cli, tmp_path, src, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    real_rename = Path.rename

    def rename(self, target):
        if ".dflash-staging-" in self.name:
            raise OSError(errno.EIO, "Input/output error")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    r = cli("convert", src, "-o", out, "--overwrite")
    monkeypatch.undo()
    assert r.code == 1 and "nothing was written" in r.err and str(out) in r.err, r.err
    assert [p.name for p in out.iterdir()] == ["old.txt"] and leftovers(out) == []
