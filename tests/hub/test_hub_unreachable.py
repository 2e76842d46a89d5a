"""A Hub that cannot be reached: the waits between retries are said as they happen (never half a minute of
silence), and the one error line ends with what to do without the Hub."""

from __future__ import annotations

import time


def test_an_unreachable_hub_says_each_retry_and_the_way_out(cli, monkeypatch, tmp_path):
    from huggingface_hub import constants

    nothing = "http://127.0.0.1:9"  # nothing listens on the discard port
    monkeypatch.setattr(constants, "ENDPOINT", nothing)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", nothing + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setenv("HF_ENDPOINT", nothing)
    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)  # the back-off's length, not its logic
    r = cli("pull", "org/draft", "-o", tmp_path / "d")
    assert r.code == 1, r.err
    lines = r.err.strip().splitlines()
    retries = [line for line in lines if line.startswith(f"the Hub at {nothing} did not answer (")]
    assert len(retries) == len(waits) >= 3, r.err  # one status line per wait, before it
    assert retries[0].endswith(f"retrying in {waits[0]:g} s (retry 1 of 5)"), retries[0]
    assert lines[-1].startswith(f"Error: cannot reach the Hub at {nothing} to download org/draft@main (") and \
        lines[-1].endswith("; to work without it give a local path, or set HF_HUB_OFFLINE=1 to use a copy in the "
                           f"cache {constants.HF_HUB_CACHE}"), lines[-1]
    quiet = cli("pull", "org/draft", "-o", tmp_path / "d", "-q")  # -q: the error line alone
    assert quiet.code == 1 and len(quiet.err.strip().splitlines()) == 1, quiet.err
