"""A checkpoint directory holding special files where regular ones belong (planted by an attacker,
or left by a tool): the run must end with one error line naming the file, never wait forever."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_fifo_config_is_refused_not_waited_on(speculators_drafts, tmp_path, command):
    src = tmp_path / "draft"
    shutil.copytree(speculators_drafts["full"], src)
    (src / "config.json").unlink()
    os.mkfifo(src / "config.json")  # no writer ever comes: a blocking open would hang
    args = [str(src)] + (["-o", str(tmp_path / "out"), "--no-verifier"] if command == "convert" else [])
    r = subprocess.run([sys.executable, "-m", "dflash_convert", command, *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("Error:") and "config.json" in lines[-1] and "not a regular file" in lines[-1]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()
