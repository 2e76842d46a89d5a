"""Hugging Face Hub: resolve `org/name` sources into the local cache, pull a draft, push one.

Everything goes through the public API of the real `huggingface_hub` client: its settings
(`constants`, `is_offline_mode()`: HF_ENDPOINT, HF_HUB_CACHE / HF_HOME, HF_HUB_OFFLINE, read when
the client is imported, as in every HF library), `resolve_revision`, `snapshot_download`,
`upload_folder`, each request made through `transport.hub_call` (waits bounded, the client's errors as
one line each). Tokens are cleaned, checked and remembered for redaction by `tokens.hub_token`.

Downloads fetch only what a draft (or a target) needs, pickle weights only when asked, and are
pinned to the commit the revision resolved to once, so a branch that moves meanwhile cannot mix two
commits. Remote file names are checked before anything is written. `pull -o DIR` assembles DIR
beside it and renames it into place. A push is one `upload_folder` commit (the client's Xet
pipeline also commits a draft's few files at once) that deletes the remote weight files it does not
replace, pinned to the commit it was prepared against.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from dflash_convert.hub import card
from dflash_convert.format import catalogue, mapping
from dflash_convert.format.configs import is_hub_id
from dflash_convert.io.checkpoint import CONFIG_NAME, is_pickle_weight_file
from dflash_convert.io.reading import announced_by_cache_name, discard, file_digest, read_json
from dflash_convert.io.staging import check_destination, staged_directory
from dflash_convert.errors import DFlashError, Interrupted, UsageError
from dflash_convert.io.safetensors import INDEX_NAME
from dflash_convert.hub.tokens import hub_token
from dflash_convert.hub.transport import Say, hub_api, hub_call, one_line, unsaid, warn

# companion files (mask_embedding.pt) are fetched as bytes for convert to carry: nothing here unpickles them
DRAFT_PATTERNS = [CONFIG_NAME, "*.safetensors", INDEX_NAME, card.README_NAME, card.RECORD_NAME,
                  *catalogue.COMPANION_FILES]
TARGET_PATTERNS = ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja"]
PICKLE_PATTERNS = ["*.bin", "pytorch_model.bin.index.json", "*.pt", "*.pth"]
# Remote files a push replaces as a set: a stale shard or index left beside new weights would be loaded.
WEIGHT_PATTERNS = ["*.safetensors", INDEX_NAME, *PICKLE_PATTERNS, card.RECORD_NAME]
SHA40 = re.compile(r"^[0-9a-f]{40}$")


@dataclass
class Resolved:
    path: Path
    repo_id: str | None
    revision: str | None
    commit_sha: str | None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}


@dataclass
class PushResult:
    commit_url: str
    pr_url: str | None
    commit_sha: str
    repo_url: str
    repo_id: str
    revision: str
    changed: bool  # False when every file was already on the Hub (the client then makes no commit)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- resolve / pull

def unsafe_repo_path(name: str) -> bool:
    """A remote file name that would land outside the directory it is written into (or carries control
    characters, C0, DEL or C1, which no checkpoint file name has and a terminal would interpret)."""
    if not name or "\\" in name or name.startswith("/") or re.match(r"^[A-Za-z]:", name) \
            or re.search(r"[\x00-\x1f\x7f-\x9f]", name):
        return True
    return any(part in ("", ".", "..") for part in name.split("/"))


# git's ref rules (check-ref-format) and the Hub's: no `..`, no empty or dot-led component, no leading,
# trailing or doubled `/`, no control character, space or `~^:?*[\`, no `@{`, no `.lock` component end.
_BAD_REVISION = re.compile(r"\.\.|//|^/|/$|^\.|/\.|\.$|\.lock(/|$)|@\{|[\x00-\x20\x7f-\x9f~^:?*\[\\]|\s")


def check_revision(revision: str | None, option: str = "--revision") -> None:
    """Refuse, before any request, a revision no branch, tag or commit can be named (exit 2): the client
    would write it under the cache's refs/ directory, so `a/../../b` must never reach it."""
    if revision is None:
        return
    if not revision or revision == "@" or len(revision) > 256 or _BAD_REVISION.search(revision):
        raise UsageError(f"{option} {one_line(repr(revision))} is not a branch, tag or commit id "
                         "(no `..`, no leading, trailing or doubled `/`, no spaces or control characters)")


def _patterns(*, for_target: bool, allow_pickle: bool, config_only: bool) -> list[str]:
    if config_only:
        return [CONFIG_NAME]
    return DRAFT_PATTERNS + (TARGET_PATTERNS if for_target else []) + (PICKLE_PATTERNS if allow_pickle else [])


@dataclass
class Pinned:
    """A Hub repo's revision resolved once to a commit (recorded in the cache's refs/, which offline runs
    read back) and, online, the files at that commit: what a pull, a target or a prompt set fetches from."""

    repo_id: str
    revision: str  # as asked ("main" when none)
    sha: str
    kind: str  # "repo" or "dataset", as messages name it
    api: Any
    token: str | None
    tree: list | None = None  # the RepoFile entries at sha; None offline

    @property
    def where(self) -> str:
        return f"{self.repo_id}@{self.revision}"

    @property
    def call(self) -> dict[str, str]:
        """hub_call's keywords for a download from it."""
        return dict(where=self.where, endpoint=self.api.endpoint, action="download")

    @property
    def label(self) -> str:
        return f"Hub {self.kind} {self.where} ({self.sha[:12]})"

    def refuse_unsafe(self, names) -> None:
        bad = [name for name in names if unsafe_repo_path(name)]
        if bad:
            raise DFlashError(f"{self.label} lists a file whose name escapes the download directory or holds "
                              f"control characters: {bad[0]!r}; nothing was downloaded")


def pin_revision(repo_id: str, *, revision: str | None, token: str | None, endpoint: str | None,
                 repo_type: str | None = None, option: str = "--revision") -> Pinned:
    """Check the revision (option: how the user gave it), resolve it once to a commit and, online, list
    that commit's files; nothing is written outside the cache."""
    from huggingface_hub import RepoFile, is_offline_mode

    check_revision(revision, option)
    token = hub_token(token)
    api = hub_api(token, endpoint)
    kind = "dataset" if repo_type == "dataset" else "repo"
    pinned = Pinned(repo_id, revision or "main", "", kind, api, token)
    offline = is_offline_mode()
    pinned.sha = hub_call(lambda: api.resolve_revision(repo_id, repo_type=repo_type, revision=revision,
                                                        local_files_only=offline), retry=True, **pinned.call).resolved
    if not offline:
        pinned.tree = hub_call(lambda: [f for f in api.list_repo_tree(repo_id, repo_type=repo_type, revision=pinned.sha,
                                                                      recursive=True) if isinstance(f, RepoFile)],
                               **pinned.call)
    return pinned


@dataclass
class _Snapshot:
    """A revision resolved to one commit, with the files to fetch from it checked, and the hash the Hub
    announced for each (("sha256", oid) for LFS files, ("git", blob sha1) for the others); files is None
    offline, where the cache's blob names are the hashes announced when they were downloaded."""

    repo_id: str
    revision: str
    sha: str
    patterns: list[str]
    token: str | None
    endpoint: str
    files: dict[str, tuple[str, str]] | None = None

    @property
    def where(self) -> str:
        return f"{self.repo_id}@{self.revision}"


def _plan(repo_id: str, *, revision: str | None, token: str | None, endpoint: str | None, patterns: list[str],
          need_weights: bool, allow_pickle: bool, say: Say) -> _Snapshot:
    """The revision pinned, and the files matching patterns at that commit checked."""
    from huggingface_hub.utils import filter_repo_objects

    repo = pin_revision(repo_id, revision=revision, token=token, endpoint=endpoint)
    snap = _Snapshot(repo_id, repo.revision, repo.sha, patterns, repo.token, repo.api.endpoint)
    if repo.tree is None:  # offline
        return snap
    listing = [f.path for f in repo.tree]
    wanted = list(filter_repo_objects(listing, allow_patterns=patterns))
    repo.refuse_unsafe(wanted)
    if CONFIG_NAME not in wanted:
        raise DFlashError(f"{repo.label} has no {CONFIG_NAME}: not a model checkpoint")
    if need_weights and not any(n.endswith(".safetensors") for n in wanted) and not allow_pickle \
            and any(is_pickle_weight_file(n) for n in listing):
        raise DFlashError(f"Hub repo {repo.where} has only pickle weights (.bin/.pt); they can run code when "
                          "loaded. Pass --allow-pickle to fetch them and load with torch.load(weights_only=True)")
    snap.files = {f.path: (("sha256", f.lfs.sha256) if f.lfs else ("git", f.blob_id)) for f in repo.tree
                  if f.path in wanted}
    say(f"fetching {len(wanted)} files of {repo.where} ({repo.sha[:12]}) from {snap.endpoint}")
    return snap


# ----------------------------------------------------------------------------- verification

HASHED_LATER = ("*.safetensors",)  # what a conversion hashes itself, in the read it makes anyway


def _verify(snap: _Snapshot, name: str, path: Path) -> None:
    expected = snap.files.get(name) if snap.files is not None else None
    expected = expected or announced_by_cache_name(path)
    if expected is None:
        return  # a plain copy made offline from the cache: its blob was checked on the way
    kind, want = expected
    got = file_digest(path, kind)
    if got != want:
        discard(path)
        label = "sha256" if kind == "sha256" else "git blob id"
        raise DFlashError(f"{snap.where} ({snap.sha[:12]}): {name}: the bytes received do not match the {label} the "
                          f"Hub announced ({want[:16]}..., got {got[:16]}...); the file was discarded and nothing "
                          "used it (rerun to download it again)")


def _fetch(snap: _Snapshot, local_dir: Path | None = None, *, hash_later: tuple[str, ...] = ()) -> Resolved:
    """Download the planned files of that one commit (into the cache, or as plain files into local_dir),
    one after the other in this thread (a stop signal ends a wait at once), each checked against the
    hash the Hub announced for it; files matching hash_later are left to the caller's own read."""
    from fnmatch import fnmatch

    from huggingface_hub import hf_hub_download, snapshot_download

    call = dict(where=snap.where, endpoint=snap.endpoint, action="download")
    if snap.files is None:  # offline: the cache alone
        folder = Path(hub_call(lambda: snapshot_download(snap.repo_id, revision=snap.sha, allow_patterns=snap.patterns,
                                                          local_files_only=True), **call))
        names = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*")) if p.is_file()]
    else:
        folder, names = local_dir, list(snap.files)
        for name in names:
            try:
                path = hub_call(lambda: hf_hub_download(snap.repo_id, name, revision=snap.sha, local_dir=local_dir,
                                                         token=snap.token, endpoint=snap.endpoint,
                                                         library_name="dflash-convert"), file=name, **call)
            except Interrupted as exc:  # the client removes the partial file on the way out
                if local_dir is not None:
                    raise  # the staging directory goes, and says so
                raise Interrupted(f"{str(exc).split(';')[0]} while downloading {name!r} of {snap.where}; the files "
                                  "completed before stay in the Hub cache, the partial one was removed",
                                  signum=exc.signum) from None
            if folder is None:
                folder = Path(path).parents[len(Path(name).parts) - 1]
    for name in names:
        if not any(fnmatch(name, pattern) for pattern in hash_later):
            _verify(snap, name, Path(folder) / name)
    return Resolved(path=Path(folder), repo_id=snap.repo_id, revision=snap.revision, commit_sha=snap.sha)


def resolve_source(source: str | Path, *, revision: str | None = None, token: str | None = None,
                   allow_pickle: bool = False, endpoint: str | None = None, for_target: bool = False,
                   config_only: bool = False, verify_weights: bool = True, on_info: Say | None = None) -> Resolved:
    """A local checkpoint directory (or its config.json) as is; a Hub id `org/name` downloaded into the cache.

    for_target also fetches generation_config.json and the tokenizer files; config_only fetches
    config.json alone (enough for --verifier). The resolved commit sha is in `.commit_sha`. Every
    file is checked against the hash the Hub announced for it; verify_weights=False leaves the
    *.safetensors files to the caller, which must hash them against their cache names before using
    them (a conversion does, in the read it makes anyway). on_info gets the line saying what is fetched.
    """
    source = str(source)
    path = Path(source).expanduser()
    if path.exists():
        if revision is not None:
            raise UsageError(f"--revision {revision} applies to Hub repo ids, but {source} is a local path")
        return Resolved(path=path, repo_id=None, revision=None, commit_sha=None)
    if not is_hub_id(source):
        raise DFlashError("does not exist locally and is not a Hub repo id (org/name)", file=source)
    snap = _plan(source, revision=revision, token=token, endpoint=endpoint,
                 patterns=_patterns(for_target=for_target, allow_pickle=allow_pickle, config_only=config_only),
                 need_weights=not config_only, allow_pickle=allow_pickle, say=on_info or unsaid)
    if not (for_target or config_only):
        _identify_draft_first(snap)
    return _fetch(snap, hash_later=() if verify_weights else HASHED_LATER)


def _identify_draft_first(snap: _Snapshot) -> None:
    """A draft's config.json is fetched and identified before its weights: what is no draft is refused before
    any weight is downloaded (a DeepSeek target carrying its DSpark draft as mtp.* tensors is hundreds of GB)."""
    if snap.files is None or CONFIG_NAME not in snap.files:
        return  # offline: the cache holds what there is, nothing is downloaded
    folder = _fetch(replace(snap, files={CONFIG_NAME: snap.files[CONFIG_NAME]})).path
    mapping.detect_format(read_json(folder / CONFIG_NAME), file=str(folder / CONFIG_NAME))


def pull(repo_id: str, out_dir: str | Path | None = None, *, revision: str | None = None, token: str | None = None,
         allow_pickle: bool = False, endpoint: str | None = None, overwrite: bool = False,
         on_info: Say | None = None) -> Resolved:
    """Download a draft checkpoint into the cache, or materialize it as plain files in out_dir (on_info gets
    the line saying what is fetched).

    out_dir is assembled beside it and renamed into place when complete and checked: a pull that
    fails or is interrupted leaves out_dir as it was (absent, or with its old content).
    """
    if not is_hub_id(repo_id):
        raise UsageError(f"not a Hub repo id (org/name): {repo_id!r}")
    check_revision(revision)
    dest = Path(out_dir).expanduser() if out_dir is not None else None
    if dest is not None:  # before any download: a symlink or non-empty destination is refused up front
        check_destination(dest, overwrite)
    snap = _plan(repo_id, revision=revision, token=token, endpoint=endpoint,
                 patterns=_patterns(for_target=False, allow_pickle=allow_pickle, config_only=False),
                 need_weights=True, allow_pickle=allow_pickle, say=on_info or unsaid)
    if dest is None:
        return _fetch(snap)
    with staged_directory(dest, overwrite=overwrite) as tmp:
        if snap.files is None:  # offline, the client fills a local_dir from nothing: copy the cached snapshot
            resolved = _fetch(snap)
            shutil.copytree(resolved.path, tmp, dirs_exist_ok=True)  # the files the cache's links point to
        else:
            resolved = _fetch(snap, local_dir=tmp)
    return replace(resolved, path=dest)


# ----------------------------------------------------------------------------- push

def check_push_options(revision: str | None, create_pr: bool, option: str = "--revision") -> None:
    """Before any request: a branch name to push to, and not together with --create-pr (the Hub opens a
    pull request against main; pushing to a branch and opening one are two different requests)."""
    check_revision(revision, option)
    if revision is not None and create_pr:
        raise UsageError(f"give {option} (push to a branch) or --create-pr (open a pull request), not both")
    if revision is not None and (SHA40.match(revision) or unsafe_repo_path(revision)):
        raise UsageError(f"{option} must name a branch to push to, got {one_line(repr(revision))}")


def push(directory: str | Path, repo_id: str, *, revision: str | None = None, private: bool = False,
         commit_message: str | None = None, commit_description: str | None = None, create_pr: bool = False,
         token: str | None = None, endpoint: str | None = None, model_card: bool = True,
         validation: dict[str, Any] | None = None, on_info: Say | None = None) -> PushResult:
    """Upload a checkpoint directory to `repo_id` in ONE commit (creating the repo and branch if needed).

    Writes/updates directory/README.md first (model_card=True, when the directory opens as a
    draft). Remote weight files absent locally are deleted in the same commit, so no stale shard
    or index survives beside the new weights. The commit is pinned to the branch head it was
    prepared against: if another commit lands meanwhile, nothing is committed. on_info gets a line per step
    (branch created, card written, pushing, nothing to commit).
    """
    from huggingface_hub import is_offline_mode

    from dflash_convert import __version__

    check_push_options(revision, create_pr)
    directory = Path(directory)
    if not directory.is_dir():
        raise DFlashError("not a directory", file=directory)
    if not is_hub_id(repo_id):
        raise UsageError(f"not a Hub repo id (org/name): {repo_id!r}")
    if is_offline_mode():
        raise DFlashError(f"HF_HUB_OFFLINE=1: cannot push {directory} to {repo_id}")
    if not any(p.is_file() for p in directory.rglob("*")):
        raise DFlashError("nothing to push: the directory is empty", file=directory)

    api, say = hub_api(hub_token(token), endpoint), on_info or unsaid
    branch = revision or "main"
    call = dict(where=f"{repo_id}@{branch}", endpoint=api.endpoint, action="push to")
    repo_url = hub_call(lambda: api.create_repo(repo_id, private=private or None, exist_ok=True), **call)
    if revision is not None and not revision.startswith("refs/pr/"):
        refs = hub_call(lambda: api.list_repo_refs(repo_id), **call)
        if revision in {t.name for t in refs.tags}:
            raise DFlashError(f"--revision {revision} is a tag of {repo_id}, not a branch; push to a branch")
        if revision not in {b.name for b in refs.branches}:
            hub_call(lambda: api.create_branch(repo_id, branch=revision, exist_ok=True), **call)
            say(f"created branch {revision} of {repo_id} (from main)")
    info = hub_call(lambda: api.repo_info(repo_id, revision=branch), **call)
    if private and not info.private:
        warn(f"{repo_id} already exists and is public; --private does not change an existing repo")
    if model_card and (directory / CONFIG_NAME).exists():
        remote_readme = None
        remote = {s.rfilename for s in info.siblings or []}
        if not (directory / card.README_NAME).exists() and card.README_NAME in remote:  # keep what users wrote
            path = hub_call(lambda: api.hf_hub_download(repo_id, card.README_NAME, revision=info.sha), **call)
            remote_readme = Path(path).read_text(encoding="utf-8")
        readme = card.write_model_card(directory, repo_id=repo_id, validation=validation, existing=remote_readme)
        say(f"model card written: {readme}")
    say(f"pushing {directory} to {repo_id}@{branch}" + (" as a pull request" if create_pr else ""))
    message = commit_message or f"Upload DFlash draft with dflash-convert {__version__}"
    commit = hub_call(lambda: api.upload_folder(repo_id=repo_id, folder_path=directory, revision=revision,
                                                 commit_message=message, commit_description=commit_description,
                                                 create_pr=create_pr, parent_commit=info.sha,
                                                 delete_patterns=WEIGHT_PATTERNS), **call)
    changed = commit.oid != info.sha
    if not changed:
        say(f"{repo_id}@{branch} already has these files: nothing to commit")
    return PushResult(commit_url=commit.commit_url, pr_url=commit.pr_url, commit_sha=commit.oid,
                      repo_url=str(repo_url), repo_id=repo_id, revision=branch, changed=changed)
