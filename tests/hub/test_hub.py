"""Hub integration against the REAL huggingface_hub client and a Hub-compatible server on 127.0.0.1.

The server (tests/hub_server.py) keeps everything in memory; each test gets its own server,
cache (HF_HOME / HF_HUB_CACHE) and token. Commands run in-process through the real entry point
(conftest.run_cli), or as subprocesses where every byte written (logs included) must be seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hub_server import TOKEN, local_files
from processes import stop_signals_at_default

BAD_TOKEN = "hf_fakeWrongToken9876543210"


# ----------------------------------------------------------------------------- helpers

def one_error_line(r, *needles: str, code: int = 1) -> str:
    """Exit `code`, and stderr holds exactly one `Error:` line (no traceback) containing every needle."""
    assert r.code == code, (r.code, r.out, r.err)
    errors = [line for line in r.err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, r.err
    assert "Traceback" not in r.err
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


# ----------------------------------------------------------------------------- push

def test_push_creates_repo_in_one_commit_with_lfs_and_card(cli, hub, draft):
    r = cli("push", draft, "org/draft")
    assert r.code == 0, r.err
    head = hub.commit_at("org/draft").sha
    assert r.out.strip() == f"{hub.url}/org/draft/commit/{head}"
    assert hub.commits("org/draft") == 2  # the repo's initial commit + ONE upload commit
    remote = hub.files_at("org/draft")
    assert {k: v for k, v in remote.items() if k != ".gitattributes"} == local_files(draft)
    # the weights went through the LFS batch + PUT path, the config as a regular file
    assert hub.is_lfs("org/draft", "model.safetensors") and not hub.is_lfs("org/draft", "config.json")
    import hashlib

    assert hashlib.sha256(remote["model.safetensors"]).hexdigest() in hub.lfs_puts
    card = remote["README.md"].decode()
    meta = yaml.safe_load(card.split("---")[1])
    verifier = json.loads((draft / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
    assert meta["library_name"] == "speculators" and meta["base_model"] == verifier == "test-org/tiny-qwen3"
    assert {"dflash", "speculative-decoding"} <= set(meta["tags"])
    assert '"method": "dflash", "model": "org/draft", "num_speculative_tokens": 7' in card
    assert "--speculative-algorithm DFLASH" in card and "--speculative-num-draft-tokens 8" in card
    assert "| dtype | warn |" in card  # the static validation summary: F32 weights are flagged


def test_push_json_and_existing_repo_keeps_user_readme_and_drops_stale_shards(cli, hub, draft):
    user_readme = ("---\nlicense: apache-2.0\ntags:\n- mine\n---\n\n# My draft\n\nTrained on my data.\n")
    hub.seed_repo("org/draft", {"README.md": user_readme.encode(), "model-00001-of-00002.safetensors": b"x" * 10,
                                "model-00002-of-00002.safetensors": b"y" * 10,
                                "model.safetensors.index.json": b'{"weight_map": {}}', "notes.txt": b"keep me"})
    before = hub.commits("org/draft")
    r = cli("push", draft, "org/draft", "--commit-message", "new weights", "--commit-description", "why", "--json")
    assert r.code == 0, r.err
    out = r.json()
    commit = hub.commit_at("org/draft")
    assert out["commit_sha"] == commit.sha and out["pr_url"] is None and out["changed"] is True
    assert (commit.title, commit.description) == ("new weights", "why")
    assert hub.commits("org/draft") == before + 1
    remote = hub.files_at("org/draft")
    assert not any(n.startswith("model-0000") or n.endswith(".index.json") for n in remote)  # stale set removed
    assert remote["notes.txt"] == b"keep me"  # files that are not weights are left alone
    card = remote["README.md"].decode()
    assert "# My draft\n\nTrained on my data." in card and "## DFlash draft" in card
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["license"] == "apache-2.0" and meta["tags"][:1] == ["mine"] and "dflash" in meta["tags"]


def test_push_to_new_branch_then_pull_by_branch_tag_and_commit(cli, hub, draft, tmp_path):
    r = cli("push", draft, "org/draft", "--revision", "dev")
    assert r.code == 0, r.err
    dev = hub.commit_at("org/draft", "dev").sha
    assert "model.safetensors" not in hub.files_at("org/draft", "main")  # main untouched
    hub.create_tag("org/draft", "v1", "dev")
    cfg = json.loads((draft / "config.json").read_text())
    cfg["block_size"] = 4
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 3  # block = anchor + 3
    (draft / "config.json").write_text(json.dumps(cfg))
    assert cli("push", draft, "org/draft").code == 0  # main now differs from dev
    main = hub.commit_at("org/draft", "main").sha
    assert main != dev
    for rev, sha in (("dev", dev), ("v1", dev), (dev, dev), ("main", main)):
        r = cli("pull", "org/draft", "--revision", rev, "--json")
        assert r.code == 0, r.err
        got = r.json()
        assert got["commit_sha"] == sha, rev
        assert Path(got["path"]).name == sha  # the standard cache layout: snapshots/<sha>
        assert json.loads((Path(got["path"]) / "config.json").read_text())["block_size"] == (4 if sha == main else 8)
    # -o DIR: plain files, the same bytes as the branch
    r = cli("pull", "org/draft", "--revision", "dev", "-o", tmp_path / "out")
    assert r.code == 0 and r.out.strip() == str(tmp_path / "out")
    remote = hub.files_at("org/draft", "dev")
    assert local_files(tmp_path / "out") == {k: remote[k] for k in ("config.json", "model.safetensors", "README.md")}


def test_push_refuses_a_tag_as_branch(cli, hub, draft):
    hub.seed_repo("org/draft", {"a.txt": b"a"})
    hub.create_tag("org/draft", "v1")
    r = cli("push", draft, "org/draft", "--revision", "v1")
    one_error_line(r, "v1", "tag")


def test_create_pr(cli, hub, draft):
    hub.seed_repo("org/draft", {"a.txt": b"a"})
    main_before = hub.commit_at("org/draft").sha
    r = cli("push", draft, "org/draft", "--create-pr")
    assert r.code == 0, r.err
    assert r.out.strip() == f"{hub.url}/org/draft/discussions/1"
    assert hub.commit_at("org/draft").sha == main_before  # the branch itself is unchanged
    pr = hub.files_at("org/draft", "refs/pr/1")
    assert pr["model.safetensors"] == (draft / "model.safetensors").read_bytes() and pr["a.txt"] == b"a"


def test_push_refuses_a_draft_failing_static_validation(cli, hub, draft):
    cfg = json.loads((draft / "config.json").read_text())
    cfg["aux_hidden_state_layer_ids"] = [6, 4, 1]  # valid ids, listed out of the order engines capture them
    (draft / "config.json").write_text(json.dumps(cfg))
    r = cli("push", draft, "org/draft")
    assert r.code == 3 and "target_layer_ids" in r.err and "nothing was pushed" in r.err, r.err
    assert "org/draft" not in hub.repos and not (draft / "README.md").exists()
    r = cli("push", draft, "org/draft", "--no-validate")
    assert r.code == 0, r.err
    assert json.loads(hub.files_at("org/draft")["config.json"])["aux_hidden_state_layer_ids"] == [6, 4, 1]


# ----------------------------------------------------------------------------- cache and offline

def test_offline_uses_the_cache(cli, hub, draft, monkeypatch, hub_env):
    from huggingface_hub import constants

    assert cli("push", draft, "org/draft").code == 0
    sha = hub.commit_at("org/draft").sha
    first = cli("pull", "org/draft", "--json").json()
    hub.stop()  # nothing answers any more
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    for rev in (None, sha):
        r = cli("pull", "org/draft", *(["--revision", rev] if rev else []), "--json")
        assert r.code == 0, r.err
        got = r.json()
        assert (got["path"], got["commit_sha"], got["revision"]) == (first["path"], sha, rev or "main")
    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_convert.hub.client import resolve_source

    resolved = resolve_source("org/draft")
    assert resolved.commit_sha == sha and open_checkpoint(resolved.path).spec.block_size == 8
    one_error_line(cli("pull", "org/draft", "--revision", "dev"), "org/draft@dev", "HF_HUB_OFFLINE=1")
    r = cli("pull", "org/draft", "-o", hub_env.parent / "offline-out")  # plain files, from the cache alone
    assert r.code == 0, r.err
    assert local_files(hub_env.parent / "offline-out") == {k: v for k, v in local_files(draft).items()
                                                           if k in ("config.json", "model.safetensors", "README.md")}


# ----------------------------------------------------------------------------- errors: one line, exit 1

def test_repo_not_found(cli):
    one_error_line(cli("pull", "org/missing"), "org/missing", "not found")


def test_revision_not_found(cli, hub, draft):
    assert cli("push", draft, "org/draft").code == 0
    one_error_line(cli("pull", "org/draft", "--revision", "nope"), "'nope'", "org/draft")
    one_error_line(cli("pull", "org/draft", "--revision", "0" * 40), "org/draft")


def test_bad_token_is_401_and_token_precedence(cli, hub, draft, monkeypatch, hub_env):
    one_error_line(cli("push", draft, "org/draft", "--token", BAD_TOKEN), "401", "org/draft@main")
    one_error_line(cli("pull", "org/draft", "--token", BAD_TOKEN), "401", "org/draft@main")
    # --token beats HF_TOKEN ...
    monkeypatch.setenv("HF_TOKEN", BAD_TOKEN)
    assert cli("push", draft, "org/draft", "--token", TOKEN).code == 0
    one_error_line(cli("pull", "org/draft"), "401")
    # ... and HF_TOKEN beats the stored token, which is used when nothing else is given
    (hub_env / "token").parent.mkdir(parents=True, exist_ok=True)
    (hub_env / "token").write_text(TOKEN)
    one_error_line(cli("pull", "org/draft"), "401")
    monkeypatch.delenv("HF_TOKEN")
    assert cli("push", draft, "org/other").code == 0  # writes need a token: the stored one was sent


@pytest.mark.parametrize("failure, args, needles", [
    (("/api/models/org/draft", 403, "Access to this model is restricted", "GatedRepo"), ["pull", "org/draft"],
     ["org/draft", "gated"]),
    (("/model.safetensors", 404, "Entry not found", "EntryNotFound"), ["pull", "org/draft"],  # the Hub's usual text
     ["org/draft@main", "file not found on the Hub", "'model.safetensors'"]),
    (("/model.safetensors", 403, "Forbidden", None), ["pull", "org/draft"],
     ["403", "'model.safetensors' of org/draft@main", "refused access"]),
    (("/commit/", 403, "You don't have the rights", None), ["push", "DRAFT", "org/draft"],
     ["no write access", "org/draft", "403"]),
    (("/preupload/", 500, "the Hub is unwell", None), ["push", "DRAFT", "org/draft"],
     ["HTTP 500", "unwell", "org/draft@main"]),
])
def test_hub_errors_name_the_repo_in_one_line(cli, hub, draft, monkeypatch, failure, args, needles):
    """Each kind of answer the client maps to its own public error class, under 1.x and 2.x alike."""
    import time

    monkeypatch.setattr(time, "sleep", lambda s: None)  # the client retries a 500 a few times
    hub.seed_repo("org/draft", local_files(draft))
    for _ in range(10 if failure[1] >= 500 else 1):
        hub.fail_next(*failure)
    line = one_error_line(cli(*[str(draft) if a == "DRAFT" else a for a in args]), *needles)
    assert args[0] == "push" or "write access" not in line  # a download needs none


def test_server_going_away_during_commit_leaves_no_commit(cli, hub, draft):
    hub.seed_repo("org/draft", {"a.txt": b"a"})
    before = (hub.commits("org/draft"), hub.files_at("org/draft"))
    hub.drop_next("commit")
    one_error_line(cli("push", draft, "org/draft"), "connection to the Hub", "org/draft@main")
    assert (hub.commits("org/draft"), hub.files_at("org/draft")) == before
    r = cli("push", draft, "org/draft")  # a rerun completes it
    assert r.code == 0 and hub.commits("org/draft") == before[0] + 1


def test_server_going_away_during_lfs_upload_leaves_no_commit(cli, hub, draft, monkeypatch):
    import time

    monkeypatch.setattr(time, "sleep", lambda s: None)  # the client's retry back-off, not its logic
    hub.seed_repo("org/draft", {"a.txt": b"a"})
    before = (hub.commits("org/draft"), hub.files_at("org/draft"))
    hub.drop_next("lfs_put", 100)  # every attempt of the weights upload loses its connection
    one_error_line(cli("push", draft, "org/draft"), "connection to the Hub", "org/draft@main")
    assert (hub.commits("org/draft"), hub.files_at("org/draft")) == before
    assert not hub.lfs_puts


@pytest.mark.parametrize("name", ["../../evil.safetensors", "/abs/evil.safetensors", "sub/../../evil.safetensors",
                                  "evil\\..\\x.safetensors", "evil\x1b[2J.safetensors", "evil\n.safetensors"])
def test_remote_file_name_escaping_the_directory(cli, hub, draft, tmp_path, hub_env, name):
    hub.seed_repo("org/evil", {"config.json": (draft / "config.json").read_bytes()})
    hub.inject_file("org/evil", name, b"pwned")
    for extra in ([], ["-o", str(tmp_path / "out" / "inner")]):
        line = one_error_line(cli("pull", "org/evil", *extra), "escapes", repr(name))
        assert "\x1b" not in line
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.read_bytes() == b"pwned"]
    assert not [req for req in hub.requests if "/resolve/" in req[1]]  # refused before any download


def test_not_a_hub_id_or_local_path(cli, tmp_path):
    from dflash_convert.errors import DFlashError, UsageError
    from dflash_convert.format.configs import is_hub_id
    from dflash_convert.hub.client import resolve_source

    assert is_hub_id("org/name") and is_hub_id("z-lab/Qwen3-8B-DFlash-b16")
    assert not any(map(is_hub_id, ["./x", "/abs/x", "a/b/c", "org/..", "~/x", "org/name.git", "name"]))
    assert resolve_source(tmp_path).path == tmp_path and resolve_source(tmp_path).commit_sha is None
    with pytest.raises(UsageError):
        resolve_source(tmp_path, revision="main")
    with pytest.raises(DFlashError, match="not a Hub repo id"):
        resolve_source("a/b/c")
    assert cli("pull", "./not-an-id").code == 2


# ----------------------------------------------------------------------------- model card

def test_model_card_update_is_idempotent_and_keeps_user_text(hub_draft):
    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_convert.hub.card import CARD_BEGIN, CARD_END, model_card

    spec = open_checkpoint(hub_draft).spec
    user = "---\nlicense: mit\n---\n\nIntro by the author.\n\n"
    first = model_card(spec, repo_id="org/d", validation=None, existing=user + "\n\nFooter.\n")
    assert first.count(CARD_BEGIN) == 1 and first.count(CARD_END) == 1
    assert first.index("Intro by the author.") < first.index(CARD_BEGIN) and "Footer." in first
    edited = first.replace("Intro by the author.", "Intro, edited.")
    second = model_card(spec.model_copy(update={"block_size": 16}), repo_id="org/d", validation=None, existing=edited)
    assert "Intro, edited." in second and "Footer." in second and second.count(CARD_BEGIN) == 1
    assert '"num_speculative_tokens": 15' in second and '"num_speculative_tokens": 7' not in second
    assert model_card(spec, repo_id="org/d", validation=None, existing=first) == first


def test_model_card_non_causal_and_pruned_notes(hub_draft):
    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_convert.hub.card import model_card

    spec = open_checkpoint(hub_draft).spec
    causal = model_card(spec, repo_id="org/d", validation=None)
    assert "--attention-backend" not in causal and "full target vocabulary (512 tokens)" in causal
    nc = spec.model_copy(update={"layer_causal": [False] * spec.num_layers, "draft_vocab_size": 128})
    card = model_card(nc, repo_id="org/d", validation={"checks": [{"name": "x", "status": "warn", "message": "m"}]})
    assert "--attention-backend FLASH_ATTN" in card and "FLEX_ATTENTION" in card and "non-causal" in card
    assert "predicts 128 of the target's 512 tokens" in card and "| x | warn | m |" in card
    unknown = spec.model_copy(update={"verifier": None})
    text = model_card(unknown, repo_id="org/d", validation=None)
    assert "base_model" not in text.split("---")[1] and "vllm serve <TARGET_MODEL>" in text


# ----------------------------------------------------------------------------- convert straight from the Hub

def test_convert_from_hub_id_and_push(cli, hub, draft, tmp_path):
    pytest.importorskip("dflash_convert.validate.run")
    hub.seed_repo("org/spec-draft", local_files(draft))
    src_sha = hub.commit_at("org/spec-draft").sha
    out = tmp_path / "hf"
    r = cli("convert", "org/spec-draft", "--revision", "main", "-o", out, "--push", "org/hf-draft", "--json")
    assert r.code == 0, r.err
    result = r.json()
    assert result["source_revision"] == src_sha
    assert json.loads((out / "conversion.json").read_text())["source_revision"] == src_sha
    remote = hub.files_at("org/hf-draft")
    assert remote["model.safetensors"] == (out / "model.safetensors").read_bytes()
    assert remote["conversion.json"] == (out / "conversion.json").read_bytes()
    assert "## DFlash draft" in remote["README.md"].decode()


# ----------------------------------------------------------------------------- what gets downloaded

def test_download_fetches_only_what_is_needed(hub, draft):
    from dflash_convert.errors import DFlashError
    from dflash_convert.hub.client import resolve_source

    config = (draft / "config.json").read_bytes()
    hub.seed_repo("org/target", {"config.json": config, "model.safetensors": b"w" * 100, "tokenizer.json": b"{}",
                                 "generation_config.json": b"{}", "pytorch_model.bin": b"pickle", "big.onnx": b"o"})
    names = lambda r: sorted(p.name for p in r.path.iterdir())  # noqa: E731
    assert names(resolve_source("org/target", config_only=True)) == ["config.json"]
    assert names(resolve_source("org/target")) == ["config.json", "model.safetensors"]
    assert names(resolve_source("org/target", for_target=True)) == ["config.json", "generation_config.json",
                                                                    "model.safetensors", "tokenizer.json"]
    hub.seed_repo("org/pickled", {"config.json": config, "pytorch_model.bin": b"pickle"})
    with pytest.raises(DFlashError, match="--allow-pickle"):
        resolve_source("org/pickled")
    assert names(resolve_source("org/pickled", allow_pickle=True)) == ["config.json", "pytorch_model.bin"]
    hub.seed_repo("org/empty", {"notes.txt": b"n"})
    with pytest.raises(DFlashError, match="no config.json"):
        resolve_source("org/empty")


def test_private_repo(cli, hub, draft, monkeypatch):
    assert cli("push", draft, "org/secret", "--private").code == 0
    assert hub.repos["org/secret"].private
    assert cli("pull", "org/secret").code == 0
    monkeypatch.delenv("HF_TOKEN")  # anonymous: the private repo is invisible
    one_error_line(cli("pull", "org/secret"), "org/secret", "not found")


# ----------------------------------------------------------------------------- pinned, staged, sharded

def test_pull_gets_the_commit_it_resolved_while_the_branch_moves(cli, hub, draft, tmp_path):
    files = local_files(draft)
    cfg = json.loads(files["config.json"])
    moved = {"config.json": json.dumps({**cfg, "block_size": 4}).encode(), "model.safetensors": b"other weights"}
    for extra in ([], ["-o", tmp_path / "out"]):
        sha = hub.seed_repo("org/draft", files)
        hub.move_branch_after_resolve("org/draft", "main", moved)
        r = cli("pull", "org/draft", "--json", *extra)
        assert r.code == 0, r.err
        assert hub.commit_at("org/draft").sha != sha  # main did move between resolving and downloading
        got = r.json()
        assert got["commit_sha"] == sha
        pulled = local_files(Path(got["path"]))
        assert pulled["config.json"] == files["config.json"], extra
        assert pulled["model.safetensors"] == files["model.safetensors"], extra


def test_pull_to_dir_that_fails_half_way_leaves_nothing(cli, hub, draft, tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(time, "sleep", lambda s: None)  # the client's retry back-off, not its logic
    hub.seed_repo("org/draft", local_files(draft))
    out = tmp_path / "pulls" / "out"
    hub.drop_next("download", 100)  # config.json arrives, the weights never do
    one_error_line(cli("pull", "org/draft", "-o", out), "org/draft@main")
    assert not out.parent.exists()  # not even the missing parent: it is made only when the pull is complete
    out.mkdir(parents=True)
    (out / "old.txt").write_text("old")
    one_error_line(cli("pull", "org/draft", "-o", out), "not empty", "--overwrite")
    hub.drop_next("download", 100)
    one_error_line(cli("pull", "org/draft", "-o", out, "--overwrite"), "org/draft@main")
    assert local_files(out) == {"old.txt": b"old"} and [p.name for p in out.parent.iterdir()] == ["out"]
    hub.drop_next("download", 0)
    r = cli("pull", "org/draft", "-o", out, "--overwrite")  # complete: replaces the old content
    assert r.code == 0, r.err
    assert local_files(out) == {k: v for k, v in local_files(draft).items() if k in ("config.json", "model.safetensors")}


def test_pull_to_a_symlink_is_refused_before_any_download(cli, hub, draft, tmp_path):
    """The same destination rules as convert, checked before the weights are fetched (not at commit)."""
    hub.seed_repo("org/draft", local_files(draft))
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    one_error_line(cli("pull", "org/draft", "-o", link), "symbolic link")
    assert not any(m == "GET" and path.endswith("/model.safetensors") for m, path in hub.requests)
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_pull_to_dir_stopped_by_a_signal_leaves_nothing(hub, draft, tmp_path, sig):
    import signal
    import time

    hub.seed_repo("org/draft", local_files(draft))
    hub.hold_downloads()  # the weights are on their way when the signal comes
    out = tmp_path / "pulls" / "out"
    p = subprocess.Popen([sys.executable, "-m", "dflash_convert", "pull", "org/draft", "-o", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=stop_signals_at_default)
    try:
        deadline = time.monotonic() + 90
        while not any(m == "GET" and path.endswith("/model.safetensors") for m, path in list(hub.requests)):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
        time.sleep(0.3)  # config.json is in the staging directory by now
        p.send_signal(getattr(signal, sig))
        time.sleep(0.3)
        hub.release_downloads()
        _, err = p.communicate(timeout=90)
    finally:
        hub.release_downloads()
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0 and "interrupted" in err.lower(), err
    assert "Traceback" not in err, err
    assert sorted(q.name for q in tmp_path.iterdir()) == ["draft", "hf_home"]  # no DIR, no staging left


def test_sharded_draft_by_hub_id_opens_for_convert_and_inspect(cli, hub, draft, tmp_path, monkeypatch):
    """Files in the Hub cache are symlinks into ../../blobs/: shards reached that way are the checkpoint's own."""
    from huggingface_hub import constants

    sharded = tmp_path / "sharded"
    assert cli("convert", draft, "-o", sharded, "--max-shard-size", "100KB").code == 0
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    hub.seed_repo("org/sharded", local_files(sharded))
    local = cli("convert", sharded, "-o", tmp_path / "from-local")
    assert local.code == 0, local.err
    r = cli("convert", "org/sharded", "-o", tmp_path / "from-hub")
    assert r.code == 0, r.err
    assert local_files(tmp_path / "from-hub")["model.safetensors"] == \
        local_files(tmp_path / "from-local")["model.safetensors"]
    r = cli("inspect", "org/sharded", "--json")
    assert r.code == 0, r.err
    hub.stop()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # and from the cache alone
    r = cli("inspect", "org/sharded", "--json")
    assert r.code == 0, r.err


# ----------------------------------------------------------------------------- tokens: cleaned, checked, scrubbed

def test_token_never_appears_in_any_output_or_file(hub, draft, tmp_path, hub_env):
    """Tokens ending in \\r\\n (--token, HF_TOKEN, the stored token, as Windows files and `echo` leave
    them) work; a server quoting the Authorization header in its errors gets it scrubbed from the
    error line and the --debug traceback; nothing written holds a token. Subprocesses: every byte."""
    hub.echo_auth = True
    raw = TOKEN + "\r\n"
    base = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    base["HF_HUB_VERBOSITY"] = "debug"
    (hub_env / "token").parent.mkdir(parents=True, exist_ok=True)
    (hub_env / "token").write_bytes(raw.encode())  # the stored token, written on Windows
    legacy_cache = tmp_path / "legacy-cache"
    refused = ("/tree/", 400, "listing refused")
    runs = [  # (args, extra environment (None: unset), failure to inject, expected exit code)
        (["push", str(draft), "org/draft", "--json"], {"HF_TOKEN": raw}, None, 0),
        (["push", str(draft), "org/draft2", "--token", raw, "--create-pr"], {}, None, 0),
        (["pull", "org/draft", "--token", raw, "-o", str(tmp_path / "out")], {}, None, 0),
        (["pull", "org/draft", "--json"], {"HF_HUB_CACHE": None, "HUGGINGFACE_HUB_CACHE": str(legacy_cache)},
         None, 0),  # the stored token; and the client's own settings, its legacy cache variable included
        (["pull", "org/draft", "--token", raw], {}, refused, 1),
        (["--debug", "pull", "org/draft"], {"HF_TOKEN": raw}, refused, 1),
        (["--debug", "pull", "org/draft", "--token", BAD_TOKEN], {}, None, 1),  # a 401
    ]
    seen, stdout = [], []
    for args, extra, failure, code in runs:
        if failure:
            hub.fail_next(*failure)
        env = {k: v for k, v in {**base, **extra}.items() if v is not None}
        p = subprocess.run([sys.executable, "-m", "dflash_convert", *args], capture_output=True, text=True, env=env,
                           timeout=120)
        seen.append(p.stdout + p.stderr)
        stdout.append(p.stdout)
        assert p.returncode == code, (args, p.stderr[-2000:])
        assert TOKEN not in p.stdout + p.stderr and BAD_TOKEN not in p.stdout + p.stderr, args
    assert json.loads(stdout[0])["commit_url"].startswith(f"{hub.url}/org/draft/commit/")
    assert stdout[1].strip() == f"{hub.url}/org/draft2/discussions/1"
    assert local_files(tmp_path / "out")["config.json"] == (draft / "config.json").read_bytes()
    assert json.loads(stdout[3])["path"].startswith(str(legacy_cache))
    assert "HTTP 400 listing refused (request sent Authorization: Bearer ***)" in seen[4]
    assert "Traceback" in seen[5] and "Bearer ***" in seen[5]
    assert "Traceback" in seen[6] and "401" in seen[6] and "Bearer ***" in seen[6]
    assert len(hub.echoed) >= 3 and all(f"Bearer {TOKEN}" in m or f"Bearer {BAD_TOKEN}" in m for m in hub.echoed)
    for f in tmp_path.rglob("*"):
        if f.is_file() and f != hub_env / "token":
            assert TOKEN.encode() not in f.read_bytes() and BAD_TOKEN.encode() not in f.read_bytes(), f
    for repo in ("org/draft", "org/draft2"):
        for content in hub.files_at(repo, "main" if repo == "org/draft" else "refs/pr/1").values():
            assert TOKEN.encode() not in content


@pytest.mark.parametrize("bad", ["hf_abc\x01defghijklmnop", "hf_abcdéfghijklmnop", "hf_abc defghijklmnop",
                                 "\ufeffhf_abcdefghijklmnop", "hf_abc\r\ndefghijklmnop", " \r\n"])
def test_token_a_header_cannot_carry_is_refused_unprinted(cli, hub, bad, monkeypatch):
    r = cli("pull", "org/draft", "--token", bad)
    one_error_line(r, "--token", code=2)
    assert "hf_abc" not in r.err + r.out and "defghijklmnop" not in r.err + r.out, r.err
    if "\r\n" not in bad:  # the client itself deletes CR/LF anywhere in HF_TOKEN and the stored token
        monkeypatch.setenv("HF_TOKEN", bad)
        r = cli("pull", "org/draft")
        one_error_line(r, "$HF_TOKEN", "not sent")
        assert "hf_abc" not in r.err + r.out and "defghijklmnop" not in r.err + r.out, r.err
    assert not hub.requests  # nothing reached the server


def test_warnings_logs_and_tracebacks_are_scrubbed():
    """What the client or its HTTP library might log or warn, after the CLI's redaction is installed
    (the client's log handler was bound to stderr before, as when it is imported first)."""
    code = f"""
import logging, sys, warnings
import huggingface_hub
from huggingface_hub.utils import logging as hf_logging
hf_logging.set_verbosity_info()
from dflash_convert.hub.tokens import redact_output
redact_output()
warnings.warn("Illegal header value b'Bearer {TOKEN}\\\\r\\\\n'")
logging.getLogger("huggingface_hub.file_download").warning("hf says {TOKEN}")
logging.getLogger("httpx").warning("httpx says %s", {TOKEN!r})
print({"stdout " + json.dumps(TOKEN)!r})
raise RuntimeError("boom Authorization: Bearer {TOKEN}")
"""
    p = subprocess.run([sys.executable, "-c", code, "--token", TOKEN + "\r\n"], capture_output=True, text=True,
                       timeout=120, env={k: v for k, v in os.environ.items() if k != "HF_TOKEN"})
    out = p.stdout + p.stderr
    assert TOKEN not in out, out
    for what in ("Bearer ***", "hf says ***", "httpx says ***", 'stdout "***"', "Traceback"):
        assert what in out, (what, out)


def test_no_http_library_or_private_client_imports():
    """Through the client's public API only: its HTTP library differs between 1.x and 2.x."""
    import ast

    root = Path(__file__).resolve().parents[1] / "dflash_convert"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                assert parts[0] not in ("httpx", "httpx2", "httpcore", "requests", "urllib3"), (path.name, name)
                if parts[0] in ("huggingface_hub", "tqdm"):
                    assert not any(p.startswith("_") for p in parts[1:]), (path.name, name)


def test_pushing_the_same_files_again_makes_no_commit(cli, hub, draft):
    assert cli("push", draft, "org/draft").code == 0
    before = (hub.commits("org/draft"), hub.commit_at("org/draft").sha)
    r = cli("push", draft, "org/draft", "--json")
    assert r.code == 0, r.err
    assert r.json()["changed"] is False and r.json()["commit_sha"] == before[1]
    assert (hub.commits("org/draft"), hub.commit_at("org/draft").sha) == before


def test_server_error_text_is_one_printable_line(cli, hub, draft):
    hub.seed_repo("org/draft", local_files(draft))
    hub.fail_next("/tree/", 400, "listing \x1b[2Jrefused\x07 by\tthe server")
    line = one_error_line(cli("pull", "org/draft"), "HTTP 400", "refused")
    assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in line), repr(line)


def test_push_is_pinned_to_the_head_it_was_prepared_against(cli, hub, draft):
    """Another commit landing between reading the branch and committing: nothing is committed."""
    hub.seed_repo("org/draft", {"a.txt": b"a"})
    hub.move_branch_after_resolve("org/draft", "main", {"b.txt": b"someone else's commit"})
    one_error_line(cli("push", draft, "org/draft"), "moved while pushing", "nothing was committed")
    remote = hub.files_at("org/draft")
    assert remote["b.txt"] == b"someone else's commit" and "model.safetensors" not in remote


# ----------------------------------------------------------------------------- tokens: the classes, generated

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

TOKEN_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="*")


@settings(max_examples=300, deadline=None)
@given(core=st.text(TOKEN_CHARS, min_size=8, max_size=48), pad=st.sampled_from(["", "\r\n", "\n", " ", "\r", "\t "]),
       quote=st.sampled_from(["{t}", "Bearer {t}", "{r}", "{j}", "{b}", "{rp}"]), before=st.text(max_size=20),
       after=st.text(max_size=20))
def test_redact_removes_a_remembered_token_in_every_quoted_form(core, pad, quote, before, after):
    """However a message quotes it (raw, with its CR/LF, as repr / JSON / bytes repr, after `Bearer `)."""
    from dflash_convert.hub.tokens import redact, remember

    from dflash_convert.hub import tokens

    token = core + pad
    saved = set(tokens._forms)
    remember(token)
    forms = {"t": token, "r": repr(token), "j": json.dumps(token), "b": repr(f"Bearer {token}".encode()),
             "rp": repr(f"Bearer {core}")}
    message = before + quote.format(**forms) + after
    out = redact(message)
    tokens._forms.clear()
    tokens._forms.update(saved)
    for leaked in {core, repr(core)[1:-1], json.dumps(core)[1:-1], repr(core.encode())[2:-1]}:
        assert leaked not in out, (leaked, out)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_a_token_is_cleaned_or_refused_without_being_quoted(text):
    from dflash_convert.errors import UsageError
    from dflash_convert.hub.tokens import clean_token

    from dflash_convert.hub import tokens

    saved = set(tokens._forms)
    try:
        cleaned = clean_token(text, source="--token")
    except UsageError as exc:
        stripped = text.strip(" \t\r\n")
        assert not stripped or any(not "\x21" <= c <= "\x7e" for c in stripped)
        assert len(stripped) < 8 or stripped not in str(exc)  # short text may be in any sentence
        return
    finally:
        tokens._forms.clear()
        tokens._forms.update(saved)
    assert cleaned == text.strip(" \t\r\n") and all("\x21" <= c <= "\x7e" for c in cleaned)


def test_convert_from_hub_id_carries_the_mask_embedding(cli, hub, draft, tmp_path):
    """mask_embedding.pt is fetched with a Hub draft (as bytes: nothing unpickles it) and carried by convert."""
    from dflash_convert.format.catalogue import MASK_EMBEDDING_FILE

    (draft / MASK_EMBEDDING_FILE).write_bytes(b"a torch.save of the trained mask embedding")
    hub.seed_repo("org/draft-me", local_files(draft))
    out = tmp_path / "hf"
    r = cli("convert", "org/draft-me", "-o", out)
    assert r.code == 0, r.err
    assert (out / MASK_EMBEDDING_FILE).read_bytes() == (draft / MASK_EMBEDDING_FILE).read_bytes()


def test_model_card_breakdowns_are_tables_with_what_a_prompt_file_named_made_inert(hub_draft):
    """Per thinking mode and per category (names from the user's prompt file): tables whose cells carry no HTML
    and break no row."""
    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_convert.hub.card import model_card

    def row(label, tau, steps, equal=None):
        return {"label": label, "acceptance_length": tau, "num_drafts": steps, "accepted": 0, "prompts": 2,
                "new_tokens": 8, "per_position_rates": [], "outputs_equal": equal}

    acceptance = {"prompts": 4, "max_new_tokens": 8, "block_size": 4, "acceptance_length": 2.5, "speedup": 1.5,
                  "per_position_rates": [0.5, 0.5, 0.5], "outputs_equal": 4, "temperature": 0,
                  "per_category": [row("code", 3.25, 10, 2), row("x|y<img src=x onerror=alert(1)>\n| z", 1.5, 8)]}
    card = model_card(open_checkpoint(hub_draft).spec, repo_id="org/d",
                      validation={"acceptance": acceptance, "per_thinking_mode": [row("thinking on", 2.0, 6)]})
    assert "| thinking on | 2.00 | 6 | n/a |" in card and "| code | 3.25 | 10 | 2/2 |" in card
    assert "| x\\|y&lt;img src=x onerror=alert(1)&gt; \\| z | 1.50 | 8 | n/a |" in card and "<img" not in card
