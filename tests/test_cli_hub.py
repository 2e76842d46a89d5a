"""CLI flags that touch the Hub, against the loopback Hub with the real huggingface_hub client:
one flag per meaning of "revision", one validation summary on the card, the client's bars off under --json."""

from __future__ import annotations

import json

from test_hub import TOKEN, draft, hub, hub_draft, hub_env, local_files  # noqa: F401 - fixtures


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
