"""CLI flags that touch the Hub, against the loopback Hub with the real huggingface_hub client:
one flag per meaning of "revision", one validation summary on the card, the client's bars off under --json."""

from __future__ import annotations

import json
import re

from hub_server import local_files


def test_convert_push_revision_is_the_target_branch(cli, hub, draft, tmp_path):
    hub.seed_repo("org/spec", local_files(draft))
    hub.seed_repo("org/spec", {"config.json": b"{}"}, branch="broken")  # --revision picks the source: not this one
    out = tmp_path / "hf"
    r = cli("convert", "org/spec", "--revision", "main", "-o", out, "--push", "org/hf", "--push-revision", "dev",
            "--json")
    assert r.code == 0, r.err
    result = json.loads(r.out)
    assert result["source_revision"] == hub.commit_at("org/spec").sha
    assert result["push"]["revision"] == "dev"
    assert hub.files_at("org/hf", "dev")["model.safetensors"] == (out / "model.safetensors").read_bytes()
    assert "model.safetensors" not in hub.files_at("org/hf", "main")
    # the card carries the same summary as convert --json
    card = hub.files_at("org/hf", "dev")["README.md"].decode()
    summary = result["validation"]
    assert summary["passed"] and summary["levels_run"] == ["static", "numeric"]
    assert "### Validation" in card and ": **passed** (" in card and "levels: static, numeric" in card
    section = card.split("### Validation")[1]
    assert "True" not in section and "None" not in card  # people's words, no Python values


def test_diff_revision_per_side(cli, hub, draft, tmp_path):
    hub.seed_repo("org/d", local_files(draft))
    cfg = json.loads((draft / "config.json").read_text())
    cfg["block_size"] = 4
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 3  # block = anchor + 3 proposals
    hub.seed_repo("org/d", {"config.json": json.dumps(cfg).encode()}, branch="v2")
    r = cli("diff", "org/d", "org/d", "--revision-a", "main", "--revision-b", "v2", "--json")
    assert r.code == 3, r.err
    assert json.loads(r.out)["config_differences"]["block_size"]["b"] == 4
    r = cli("diff", "org/d", "org/d", "--revision", "v2", "--json")  # one revision for both sides
    assert r.code == 0 and json.loads(r.out)["equivalent"], r.err


def test_hub_progress_bars_off_under_json(cli, hub, draft):
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars

    hub.seed_repo("org/d", local_files(draft))
    enable_progress_bars()
    try:
        r = cli("pull", "org/d", "--json")
        assert r.code == 0 and json.loads(r.out)["repo_id"] == "org/d", r.err
        assert are_progress_bars_disabled()
        assert "%|" not in r.err  # no tqdm bar reached stderr
    finally:
        enable_progress_bars()


def test_quiet_silences_hub_info_lines(cli, hub, draft, tmp_path):
    hub.seed_repo("org/d", local_files(draft))
    loud = cli("pull", "org/d", "-o", tmp_path / "a")
    assert loud.code == 0 and "fetching" in loud.err, loud.err
    quiet = cli("pull", "org/d", "-o", tmp_path / "b", "-q")
    assert quiet.code == 0, quiet.err
    assert "fetching" not in quiet.err and quiet.err.strip() == "", quiet.err
    assert (tmp_path / "b" / "config.json").read_bytes() == (draft / "config.json").read_bytes()


def test_hub_info_lines_go_to_the_callers_callback_only(hub, draft, tmp_path, capsys):
    """The library says what it fetches and pushes to the on_info its caller passes (the CLI's stderr, quiet
    under -q), and without one says nothing: no module-level switch decides it."""
    from dflash_convert.hub.client import pull, push

    hub.seed_repo("org/d", local_files(draft))
    said: list[str] = []
    pull("org/d", tmp_path / "a", on_info=said.append)
    assert len(said) == 1 and said[0].startswith("fetching ") and "org/d@main" in said[0], said
    pull("org/d", tmp_path / "b")
    push(tmp_path / "b", "org/e", on_info=said.append)
    assert said[-1] == "pushing " + str(tmp_path / "b") + " to org/e@main", said
    push(tmp_path / "b", "org/e")
    err = capsys.readouterr().err  # the client's own tqdm bars aside
    assert "fetching" not in err and "pushing" not in err and "nothing to commit" not in err, err


def _report_file(cli, draft, path, *, passed: bool = True):
    """A `validate --json` report of `draft` with end-to-end figures (as a GPU job would hand over)."""
    from dflash_convert.validate.report import AcceptanceStats

    r = cli("validate", draft, "--levels", "static", "--json")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    report["target"] = "org/target"
    report["options"].update(min_acceptance_length=3.0, min_position_rates=[0.8, 0.6])
    report["acceptance"] = AcceptanceStats(
        prompts=2, new_tokens=64, block_size=8, max_new_tokens=32, temperature=0.0, acceptance_length=3.25,
        per_position_rates=[0.9, 0.7, 0.5, 0.3, 0.2, 0.1, 0.05], num_drafts=20, accepted=45, outputs_equal=2,
        baseline_prompts=2, speculative_tokens_per_s=100.0, target_tokens_per_s=50.0, speedup=2.0
    ).model_dump(mode="json")
    if not passed:
        report["passed"] = False
        report["checks"].append({"name": "acceptance_length", "status": "fail", "value": 1.1, "threshold": 3.0,
                                 "message": "tau 1.100 below 3.0", "level": "end_to_end"})
    path.write_text(json.dumps(report))
    return path


def test_push_puts_the_end_to_end_results_and_chart_in_the_card(cli, hub, draft, tmp_path):
    report = _report_file(cli, draft, tmp_path / "e2e.json")
    r = cli("push", draft, "org/card", "--validation-report", report)
    assert r.code == 0, r.err
    files = hub.files_at("org/card")
    card = files["README.md"].decode()
    section = card.split("### Validation")[1]
    assert "End to end against `org/target`: 2 prompts, up to 32 new tokens each, block size 8, greedy." in section
    assert "| 3.25 (min 3.0) | 2.00x | 2/2 |" in section
    assert "![acceptance per draft position](acceptance.svg)" in section and "min 0.80 ok" in section
    assert re.search(r"Validated by dflash-convert on \d{4}-\d\d-\d\d \(UTC\): \*\*passed\*\*", section)
    assert files["acceptance.svg"].startswith(b"<svg")
    assert "None" not in card and "True" not in section and "[0." not in section  # no Python values
    # a failed report stops the push; a file that is no report is one line naming it
    failed = _report_file(cli, draft, tmp_path / "failed.json", passed=False)
    r = cli("push", draft, "org/card2", "--validation-report", failed)
    assert r.code == 3 and "acceptance_length" in r.err and "nothing was pushed" in r.err
    # the measured acceptance profile goes beside the weights, and the card cites it
    from dflash_convert.validate.profile import profile

    report = json.loads((tmp_path / "e2e.json").read_text())
    report["speculation_profile"] = profile([2, 3, 5, 0, 0, 0, 0, 10], 7, method="dflash", conditions={"dataset": "d"})
    (tmp_path / "profiled.json").write_text(json.dumps(report))
    r = cli("push", draft, "org/card3", "--validation-report", tmp_path / "profiled.json")
    assert r.code == 0, r.err
    files = hub.files_at("org/card3")
    assert json.loads(files["speculation_profile.json"]) == report["speculation_profile"]
    assert "Measured acceptance profile: [speculation_profile.json](speculation_profile.json)" in \
        files["README.md"].decode()
    (tmp_path / "other.json").write_text('{"passed": true}')
    r = cli("push", draft, "org/card2", "--validation-report", tmp_path / "other.json")
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1 and "other.json" in r.err and \
        "not a validation report" in r.err, r.err


def test_push_without_a_hub_says_it_could_not_connect(cli, draft, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    r = cli("push", draft, "org/offline")
    assert r.code == 1 and "Traceback" not in r.err, r.err
    line = r.err.strip().splitlines()[-1]
    assert line.startswith("Error: could not connect to the Hub at http://127.0.0.1:9 to push to org/offline@main")
    assert "lost" not in line and line.endswith("nothing was pushed")
