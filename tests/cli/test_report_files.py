"""validate's report files (--junit, --report-md): a path that cannot be written is refused before any work, a write
that fails at the end loses none of the other reports, and CI that asked for JUnit always gets a file that says how
the run ended (an interrupted run or one that could not start is an error, never green)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "examples" / "pair"


def _no_run(*args, **kwargs):  # noqa: ARG001
    raise AssertionError("the run started although a report path cannot be written")


@pytest.mark.parametrize("where", ["under a file", "kernel file system", "a directory"])
def test_an_unwritable_report_path_is_refused_before_any_work(cli, tmp_path, monkeypatch, where):
    """Root ignores permission bits, so the paths are ones that fail for root too: a regular file where a directory
    must be, /proc, and a directory given as the file."""
    monkeypatch.setattr("dflash_convert.validate.run.validate", _no_run)
    (tmp_path / "afile").write_text("")
    bad = {"under a file": tmp_path / "afile" / "v.xml", "kernel file system": Path("/proc/dflash-v.xml"),
           "a directory": tmp_path}[where]
    md = tmp_path / "r" / "v.md"
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--report-md", md, "--junit", bad, "--json")
    assert r.code == 2, (r.code, r.err)
    line = f"Error: --junit {bad}: cannot write it: "
    assert r.err.strip().splitlines() == [r.err.strip()] and r.err.startswith(line), r.err  # one line, naming it
    assert json.loads(r.out)["error"]["exit_code"] == 2
    assert not (tmp_path / "r").exists() and not list(tmp_path.glob(".*.probe"))  # nothing written, no probe left
    assert (tmp_path / "afile").read_text() == ""


def test_a_report_that_fails_at_the_end_leaves_the_others_and_the_verdict(cli, tmp_path, monkeypatch):
    """A write that still fails at the end (the path passed the check; the disk filled, the directory went): every
    other report is written, the JSON carries the verdict and the error, and the exit code is 1."""
    monkeypatch.setattr("dflash_convert.cli.validate.unwritable", lambda path: None)  # the check passed
    (tmp_path / "afile").write_text("")
    md, bad = tmp_path / "v.md", tmp_path / "afile" / "v.xml"
    r = cli("validate", PAIR / "draft", "--levels", "static", "--report-md", md, "--junit", bad, "--json")
    assert r.code == 1, (r.code, r.err)
    report = json.loads(r.out)
    assert report["passed"] is True and report["levels_run"] == ["static"]  # the verdict is still there
    assert f"--junit {bad}" in report["error"]["message"] and report["error"]["exit_code"] == 1
    assert "the other reports were written" in report["error"]["message"]
    assert md.read_text().startswith("## dflash-convert validate: PASSED")
    last = r.err.strip().splitlines()[-1]
    assert last.startswith(f"Error: could not write --junit {bad} (") and last.endswith("verdict: PASSED"), r.err
    assert not list(tmp_path.glob(".*.tmp"))


def _junit(path: Path) -> ET.Element:
    return ET.parse(path).getroot()


def test_an_interrupted_run_is_a_junit_error(cli, tmp_path, monkeypatch):
    """Ctrl-C during a level: the report says what was measured, and its JUnit has an error (CI shows it red)."""
    def interrupted(prep, found):  # noqa: ARG001
        raise KeyboardInterrupt

    monkeypatch.setattr("dflash_convert.validate.run._end_to_end_level", interrupted)
    junit = tmp_path / "v.xml"
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--levels", "static,end_to_end", "--junit", junit)
    assert r.code == 130, (r.code, r.err)
    root = _junit(junit)
    assert int(root.get("errors")) >= 1 and root.get("failures") == "0", ET.tostring(root, encoding="unicode")
    error = root.find(".//testcase[@name='run_completed']/error")
    assert error is not None and error.get("message").startswith("interrupted (Ctrl-C)")
    assert root.find(".//testsuite[@name='validate.static']") is not None  # what was measured is still there


def test_a_run_that_cannot_start_writes_a_junit_error(cli, tmp_path):
    """Nothing listening at --endpoint: the run ends at its first request, and the JUnit file says so (a job with
    no test at all reads as nothing wrong)."""
    junit = tmp_path / "ci" / "v.xml"
    r = cli("validate", "--endpoint", "http://127.0.0.1:9", "--junit", junit, "--endpoint-timeout", "5")
    assert r.code == 1, (r.code, r.err)
    root = _junit(junit)
    assert root.get("errors") == "1" and root.get("tests") == "1"
    error = root.find(".//testcase/error")
    assert "cannot connect" in error.get("message") and error.get("type") == "exit 1"
    # the one line names what was tried and what to check
    assert r.err.strip() == ("Error: --endpoint http://127.0.0.1:9/v1/models: cannot connect: connection refused: "
                             "nothing listens on 127.0.0.1:9; check the server is up and the port it serves on, "
                             "then that http://127.0.0.1:9/v1/models answers"), r.err


def test_a_usage_error_still_writes_the_junit_error(cli, tmp_path):
    """Whatever ends the run, a good --junit path gets its file: another report path that cannot be written (exit 2)
    is an error testcase in it, naming that path."""
    (tmp_path / "afile").write_text("")
    junit, bad = tmp_path / "v.xml", tmp_path / "afile" / "v.md"
    r = cli("validate", PAIR / "draft", "--junit", junit, "--report-md", bad)
    assert r.code == 2, r.err
    error = _junit(junit).find(".//testcase/error")
    assert error.get("type") == "exit 2" and f"--report-md {bad}: cannot write it" in error.get("message")



@pytest.fixture
def no_device_replaced(monkeypatch):
    """Should the refusal regress, the rename over a device fails the test instead of replacing /dev/null for
    every process on the machine (what the bug did)."""
    import os
    import stat

    real = os.replace

    def replace(src, dst, *args, **kwargs):
        assert not os.path.exists(dst) or stat.S_ISREG(os.stat(dst).st_mode), f"renamed over {dst}"
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/null"])
@pytest.mark.parametrize("flag", ["--profile-out", "--report-md", "--junit"])
def test_a_report_path_that_is_no_regular_file_is_refused_unopened(cli, tmp_path, monkeypatch, no_device_replaced,
                                                                   flag, kind):
    """A device, a FIFO, or a link to one given as a report path: exit 2 before any work, one line saying what it is.
    Never opened (a FIFO blocks the open until a reader comes) nor renamed over (that replaced the real /dev/null)."""
    import os
    import stat
    import threading

    monkeypatch.setattr("dflash_convert.validate.run.validate", _no_run)
    bad = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(bad)
        what = "a FIFO (named pipe), not a file"
    else:
        bad.symlink_to("/dev/null")
        what = "a symbolic link to /dev/null, a character device, not a file"
    # should the refusal regress, a writer blocked opening the FIFO is let go (a failure, not a hang)
    unblock = threading.Timer(10, lambda: os.close(os.open(bad, os.O_RDONLY | os.O_NONBLOCK)))
    unblock.start()
    try:
        r = cli("validate", PAIR / "draft", "--target", PAIR / "target", flag, bad)
    finally:
        unblock.cancel()
    assert r.code == 2, (r.code, r.err)
    assert r.err.strip() == f"Error: {flag} {bad}: cannot write it: {what}; nothing was run", r.err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)  # the real /dev/null is still the device
    assert (stat.S_ISFIFO(os.lstat(bad).st_mode) if kind == "fifo" else os.readlink(bad) == "/dev/null")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing beside it: no probe, no temporary


def test_write_text_never_replaces_a_device(tmp_path, no_device_replaced):
    """The write itself refuses too (a path that became a device after the check): the link and the device stay."""
    import os
    import stat

    from dflash_convert.io.outputs import write_text

    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    with pytest.raises(OSError, match="a character device, not a file"):
        write_text(link, "x")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.readlink(link) == "/dev/null"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


@pytest.mark.parametrize("case", ["--prompts", "--baseline", "--long-context-file", "link to --prompts",
                                  "CHECKPOINT file"])
@pytest.mark.parametrize("flag", ["--profile-out", "--report-md", "--junit"])
def test_a_report_over_an_input_is_refused(cli, tmp_path, monkeypatch, flag, case):
    """A report path that is a file the run reads (after links), or a file inside the checkpoint or target directory:
    exit 2 naming both, before any work; the input is left as it was (--profile-out X.txt --prompts X.txt replaced
    the prompts)."""
    import shutil

    monkeypatch.setattr("dflash_convert.validate.run.validate", _no_run)
    draft = tmp_path / "draft"
    shutil.copytree(PAIR / "draft", draft)
    read = tmp_path / "in.txt"
    read.write_text("the input\n")
    args = ["--context-lengths", "64"]
    if case == "CHECKPOINT file":
        read, out, named = draft / "config.json", draft / "config.json", f"a file of the CHECKPOINT directory {draft}"
    else:
        input_flag = case.split()[-1]
        args += [input_flag, read]
        out = read
        if case.startswith("link"):
            out = tmp_path / "link.txt"
            out.symlink_to(read)
        named = f"the {input_flag} file"
    before = read.read_bytes()
    r = cli("validate", draft, "--target", PAIR / "target", *args, flag, out)
    assert r.code == 2, (r.code, r.err)
    assert r.err.strip() == (f"Error: {flag} {out}: that is {named}, which the run reads; give the report another "
                             "path; nothing was run"), r.err
    assert read.read_bytes() == before


def test_a_report_inside_the_target_directory_is_refused_and_a_new_file_there_is_not(cli, tmp_path, monkeypatch):
    """An existing file of --target's directory is refused; a new file there, or an earlier run's report in the
    checkpoint's directory, is a report like any."""
    import shutil

    monkeypatch.setattr("dflash_convert.validate.run.validate", _no_run)
    target = tmp_path / "target"
    shutil.copytree(PAIR / "target", target)
    before = (target / "config.json").read_bytes()
    r = cli("validate", PAIR / "draft", "--target", target, "--junit", target / "config.json")
    assert r.code == 2 and r.err.strip().startswith(
        f"Error: --junit {target / 'config.json'}: that is a file of the --target directory {target}, "), r.err
    assert (target / "config.json").read_bytes() == before
    r = cli("validate", PAIR / "draft", "--target", target, "--junit", target / "new.xml")
    assert r.code != 2 and "run started although" in r.err, r.err  # past the checks, into the (refused) run
    # a rerun rewriting its own reports in the draft's directory: no loader reads them, not an input
    draft = tmp_path / "draft"
    shutil.copytree(PAIR / "draft", draft)
    for name in ("r.md", "r.svg", "speculation_profile.json"):
        (draft / name).write_text("an earlier run's\n")
    r = cli("validate", draft, "--report-md", draft / "r.md", "--profile-out", draft / "speculation_profile.json")
    assert r.code != 2 and "run started although" in r.err, r.err
