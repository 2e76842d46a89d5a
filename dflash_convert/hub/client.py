"""Hugging Face Hub: resolve `org/name` sources into the local cache, pull a draft, push one.

Everything goes through the public API of the real `huggingface_hub` client: its settings
(`constants`, `is_offline_mode()`: HF_ENDPOINT, HF_HUB_CACHE / HF_HOME, HF_HUB_OFFLINE, read when
the client is imported, as in every HF library), `resolve_revision`, `snapshot_download`,
`upload_folder`. Its errors become one line each, mapped from its public error classes; a failed
connection is recognised through the HTTP library's base error class, which the client's own
`HfHubHTTPError` derives from, so this module never imports that library (httpx in 1.x, httpx2 in
2.x). Tokens are cleaned, checked and remembered for redaction by `tokens.hub_token`.

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
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from dflash_convert.hub import card
from dflash_convert.format import catalogue
from dflash_convert.format.configs import is_hub_id
from dflash_convert.io.checkpoint import CONFIG_NAME, is_pickle_weight_file
from dflash_convert.io.staging import check_destination, staged_directory
from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.io.safetensors import INDEX_NAME
from dflash_convert.hub.tokens import end_open_line, hub_token, redact

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


# Info lines ("fetching ...", "pushing ...") on stderr; the CLI's -q turns them off. Warnings always print.
say_info = True


def _say(message: str) -> None:
    if say_info:
        print(message, file=sys.stderr, flush=True)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _api(token: str | None, endpoint: str | None):
    from huggingface_hub import HfApi

    from dflash_convert import __version__

    return HfApi(endpoint=endpoint, token=token, library_name="dflash-convert", library_version=__version__)


# ----------------------------------------------------------------------------- errors

def _one_line(text: Any) -> str:
    """Server-supplied text as one printable line: no token, no terminal control sequences."""
    return redact(re.sub(r"[\x00-\x1f\x7f-\x9f]", "?", " ".join(str(text).split())))


def _connection_error_class() -> type | tuple:
    """The HTTP library's base error (httpx.HTTPError or httpx2.HTTPError), found through the client's class."""
    from huggingface_hub.errors import HfHubHTTPError

    return next((c for c in HfHubHTTPError.__mro__[1:] if c.__name__ == "HTTPError"), ())


def _hub_error(exc: Exception, *, where: str, endpoint: str, action: str) -> DFlashError:
    """One line naming the repo and revision for whatever the client raised."""
    from huggingface_hub import constants, is_offline_mode
    from huggingface_hub import errors as e

    repo_id, _, revision = where.partition("@")
    http_error = _connection_error_class()
    # The client wraps some failures (e.g. an LFS upload giving up) in a RuntimeError: use the cause.
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, (http_error, e.OfflineModeIsEnabled)):
            exc = cause
            break
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, e.HFValidationError):
        return UsageError(f"invalid Hub repo id or revision {where!r}: {_one_line(exc)}")
    if isinstance(exc, e.RevisionNotFoundError):
        return DFlashError(f"revision {revision!r} not found in Hub repo {repo_id} ({endpoint})")
    if isinstance(exc, e.GatedRepoError):
        return DFlashError(f"Hub repo {repo_id} is gated: request access on its page, then pass a token with access")
    if isinstance(exc, e.RepositoryNotFoundError):
        return DFlashError(f"Hub repo {repo_id} not found at {endpoint} (or it is private and the token has no access)")
    if isinstance(exc, e.RemoteEntryNotFoundError):
        return DFlashError(f"{where}: file not found on the Hub ({_one_line(exc.server_message or '')})")
    if isinstance(exc, e.HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        if status == 401:
            return DFlashError(f"the Hub at {endpoint} rejected the token (401 Unauthorized) while trying to {action} "
                               f"{where}; check --token, HF_TOKEN or the stored token (`hf auth login`)")
        if status == 403:
            return DFlashError(f"the token has no write access to {repo_id} (403 Forbidden) while trying to {action} {where}")
        if status == 412:
            return DFlashError(f"{where} moved while pushing (412: another commit landed first); nothing was committed, "
                               "rerun the push")
        detail = _one_line(exc.server_message or exc.response.reason_phrase or "")
        return DFlashError(f"Hub request failed while trying to {action} {where}: HTTP {status} {detail}".rstrip())
    if isinstance(exc, (e.OfflineModeIsEnabled, e.LocalEntryNotFoundError, e.RevisionResolutionError)):
        if is_offline_mode():
            return DFlashError(f"{where} is not (completely) in the local cache {constants.HF_HUB_CACHE} and "
                               "HF_HUB_OFFLINE=1 forbids downloading it")
        return DFlashError(f"cannot reach the Hub at {endpoint} to {action} {where}, and it is not in the local "
                           f"cache {constants.HF_HUB_CACHE}")
    if isinstance(exc, http_error):  # the connection failed: refused, reset, timed out
        if action == "push to" and type(exc).__name__ == "ConnectError":  # refused, no route, no DNS: nothing sent
            return DFlashError(f"could not connect to the Hub at {endpoint} to push to {where} ({_one_line(exc)}); "
                               "nothing was pushed")
        if action == "push to":
            return DFlashError(f"connection to the Hub at {endpoint} lost while pushing to {where} "
                               f"({type(exc).__name__}); a Hub commit is all-or-nothing: rerun the push")
        return DFlashError(f"cannot reach the Hub at {endpoint} to {action} {where} ({type(exc).__name__}: "
                           f"{_one_line(exc)})")
    if isinstance(exc, OSError):
        return DFlashError(f"local I/O error while trying to {action} {where}: {_one_line(exc)}")
    return DFlashError(f"failed to {action} {where}: {type(exc).__name__}: {_one_line(exc)}")


def _hub_call(fn, *, where: str, endpoint: str, action: str):
    """Run fn(); any client error becomes one DFlashError line (our own DFlashErrors pass through)."""
    try:
        return fn()
    except (DFlashError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - the client raises many types; each becomes one line
        end_open_line()  # after an interrupted progress bar of the client
        raise _hub_error(exc, where=where, endpoint=endpoint, action=action) from exc


# ----------------------------------------------------------------------------- resolve / pull

def unsafe_repo_path(name: str) -> bool:
    """A remote file name that would land outside the directory it is written into (or carries control
    characters, which no checkpoint file name has and a terminal would interpret)."""
    if not name or "\\" in name or name.startswith("/") or re.match(r"^[A-Za-z]:", name) \
            or re.search(r"[\x00-\x1f\x7f]", name):
        return True
    return any(part in ("", ".", "..") for part in name.split("/"))


def _patterns(*, for_target: bool, allow_pickle: bool, config_only: bool) -> list[str]:
    if config_only:
        return [CONFIG_NAME]
    return DRAFT_PATTERNS + (TARGET_PATTERNS if for_target else []) + (PICKLE_PATTERNS if allow_pickle else [])


@dataclass
class _Snapshot:
    """A revision resolved to one commit, with the files to fetch from it checked."""

    repo_id: str
    revision: str
    sha: str
    patterns: list[str]
    token: str | None
    endpoint: str


def _plan(repo_id: str, *, revision: str | None, token: str | None, endpoint: str | None, patterns: list[str],
          need_weights: bool, allow_pickle: bool) -> _Snapshot:
    """Resolve the revision once (recorded in the cache's refs/, which offline runs read back) and
    check the remote file list; nothing is written outside the cache."""
    from huggingface_hub import RepoFile, is_offline_mode
    from huggingface_hub.utils import filter_repo_objects

    token = hub_token(token)
    api = _api(token, endpoint)
    where = f"{repo_id}@{revision or 'main'}"
    call = dict(where=where, endpoint=api.endpoint, action="download")
    offline = is_offline_mode()
    sha = _hub_call(lambda: api.resolve_revision(repo_id, revision=revision, local_files_only=offline), **call).resolved
    if not offline:
        listing = _hub_call(lambda: [f.path for f in api.list_repo_tree(repo_id, revision=sha, recursive=True)
                                     if isinstance(f, RepoFile)], **call)
        wanted = list(filter_repo_objects(listing, allow_patterns=patterns))
        bad = [name for name in wanted if unsafe_repo_path(name)]
        if bad:
            raise DFlashError(f"Hub repo {where} ({sha[:12]}) lists a file whose name escapes the download "
                              f"directory or holds control characters: {bad[0]!r}; nothing was downloaded")
        if CONFIG_NAME not in wanted:
            raise DFlashError(f"Hub repo {where} ({sha[:12]}) has no {CONFIG_NAME}: not a model checkpoint")
        if need_weights and not any(n.endswith(".safetensors") for n in wanted) and not allow_pickle \
                and any(is_pickle_weight_file(n) for n in listing):
            raise DFlashError(f"Hub repo {where} has only pickle weights (.bin/.pt); they can run code when loaded. "
                              "Pass --allow-pickle to fetch them and load with torch.load(weights_only=True)")
        _say(f"fetching {len(wanted)} files of {where} ({sha[:12]}) from {api.endpoint}")
    return _Snapshot(repo_id, revision or "main", sha, patterns, token, api.endpoint)


def _fetch(snap: _Snapshot, local_dir: Path | None = None) -> Resolved:
    """Download the planned files of that one commit (into the cache, or as plain files into local_dir)."""
    from huggingface_hub import is_offline_mode, snapshot_download

    folder = _hub_call(lambda: snapshot_download(snap.repo_id, revision=snap.sha, local_dir=local_dir,
                                                 allow_patterns=snap.patterns, token=snap.token,
                                                 endpoint=snap.endpoint, local_files_only=is_offline_mode(),
                                                 library_name="dflash-convert"),
                       where=f"{snap.repo_id}@{snap.revision}", endpoint=snap.endpoint, action="download")
    return Resolved(path=Path(folder), repo_id=snap.repo_id, revision=snap.revision, commit_sha=snap.sha)


def resolve_source(source: str | Path, *, revision: str | None = None, token: str | None = None,
                   allow_pickle: bool = False, endpoint: str | None = None, for_target: bool = False,
                   config_only: bool = False) -> Resolved:
    """A local checkpoint directory (or its config.json) as is; a Hub id `org/name` downloaded into the cache.

    for_target also fetches generation_config.json and the tokenizer files; config_only fetches
    config.json alone (enough for --verifier). The resolved commit sha is in `.commit_sha`.
    """
    source = str(source)
    path = Path(source).expanduser()
    if path.exists():
        if revision is not None:
            raise UsageError(f"--revision {revision} applies to Hub repo ids, but {source} is a local path")
        return Resolved(path=path, repo_id=None, revision=None, commit_sha=None)
    if not is_hub_id(source):
        raise DFlashError("does not exist locally and is not a Hub repo id (org/name)", file=source)
    return _fetch(_plan(source, revision=revision, token=token, endpoint=endpoint,
                        patterns=_patterns(for_target=for_target, allow_pickle=allow_pickle, config_only=config_only),
                        need_weights=not config_only, allow_pickle=allow_pickle))


def pull(repo_id: str, out_dir: str | Path | None = None, *, revision: str | None = None, token: str | None = None,
         allow_pickle: bool = False, endpoint: str | None = None, overwrite: bool = False) -> Resolved:
    """Download a draft checkpoint into the cache, or materialize it as plain files in out_dir.

    out_dir is assembled beside it and renamed into place when complete: a pull that fails or is
    interrupted leaves out_dir as it was (absent, or with its old content).
    """
    if not is_hub_id(repo_id):
        raise UsageError(f"not a Hub repo id (org/name): {repo_id!r}")
    dest = Path(out_dir).expanduser() if out_dir is not None else None
    if dest is not None:  # before any download: a symlink or non-empty destination is refused up front
        check_destination(dest, overwrite)
    snap = _plan(repo_id, revision=revision, token=token, endpoint=endpoint,
                 patterns=_patterns(for_target=False, allow_pickle=allow_pickle, config_only=False),
                 need_weights=True, allow_pickle=allow_pickle)
    if dest is None:
        return _fetch(snap)
    from huggingface_hub import is_offline_mode

    with staged_directory(dest, overwrite=overwrite) as tmp:
        if is_offline_mode():  # offline, the client fills a local_dir from nothing: copy the cached snapshot
            resolved = _fetch(snap)
            shutil.copytree(resolved.path, tmp, dirs_exist_ok=True)  # the files the cache's links point to
        else:
            resolved = _fetch(snap, local_dir=tmp)
    return replace(resolved, path=dest)


# ----------------------------------------------------------------------------- push

def push(directory: str | Path, repo_id: str, *, revision: str | None = None, private: bool = False,
         commit_message: str | None = None, commit_description: str | None = None, create_pr: bool = False,
         token: str | None = None, endpoint: str | None = None, model_card: bool = True,
         validation: dict[str, Any] | None = None) -> PushResult:
    """Upload a checkpoint directory to `repo_id` in ONE commit (creating the repo and branch if needed).

    Writes/updates directory/README.md first (model_card=True, when the directory opens as a
    draft). Remote weight files absent locally are deleted in the same commit, so no stale shard
    or index survives beside the new weights. The commit is pinned to the branch head it was
    prepared against: if another commit lands meanwhile, nothing is committed.
    """
    from huggingface_hub import is_offline_mode

    from dflash_convert import __version__

    directory = Path(directory)
    if not directory.is_dir():
        raise DFlashError("not a directory", file=directory)
    if not is_hub_id(repo_id):
        raise UsageError(f"not a Hub repo id (org/name): {repo_id!r}")
    if revision is not None and (SHA40.match(revision) or unsafe_repo_path(revision)):
        raise UsageError(f"--revision must name a branch to push to, got {revision!r}")
    if is_offline_mode():
        raise DFlashError(f"HF_HUB_OFFLINE=1: cannot push {directory} to {repo_id}")
    if not any(p.is_file() for p in directory.rglob("*")):
        raise DFlashError("nothing to push: the directory is empty", file=directory)

    api = _api(hub_token(token), endpoint)
    branch = revision or "main"
    call = dict(where=f"{repo_id}@{branch}", endpoint=api.endpoint, action="push to")
    repo_url = _hub_call(lambda: api.create_repo(repo_id, private=private or None, exist_ok=True), **call)
    if revision is not None and not revision.startswith("refs/pr/"):
        refs = _hub_call(lambda: api.list_repo_refs(repo_id), **call)
        if revision in {t.name for t in refs.tags}:
            raise DFlashError(f"--revision {revision} is a tag of {repo_id}, not a branch; push to a branch")
        if revision not in {b.name for b in refs.branches}:
            _hub_call(lambda: api.create_branch(repo_id, branch=revision, exist_ok=True), **call)
            _say(f"created branch {revision} of {repo_id} (from main)")
    info = _hub_call(lambda: api.repo_info(repo_id, revision=branch), **call)
    if private and not info.private:
        _warn(f"{repo_id} already exists and is public; --private does not change an existing repo")
    if model_card and (directory / CONFIG_NAME).exists():
        remote_readme = None
        remote = {s.rfilename for s in info.siblings or []}
        if not (directory / card.README_NAME).exists() and card.README_NAME in remote:  # keep what users wrote
            path = _hub_call(lambda: api.hf_hub_download(repo_id, card.README_NAME, revision=info.sha), **call)
            remote_readme = Path(path).read_text(encoding="utf-8")
        readme = card.write_model_card(directory, repo_id=repo_id, validation=validation, existing=remote_readme)
        _say(f"model card written: {readme}")
    _say(f"pushing {directory} to {repo_id}@{branch}" + (" as a pull request" if create_pr else ""))
    message = commit_message or f"Upload DFlash draft with dflash-convert {__version__}"
    commit = _hub_call(lambda: api.upload_folder(repo_id=repo_id, folder_path=directory, revision=revision,
                                                 commit_message=message, commit_description=commit_description,
                                                 create_pr=create_pr, parent_commit=info.sha,
                                                 delete_patterns=WEIGHT_PATTERNS), **call)
    changed = commit.oid != info.sha
    if not changed:
        _say(f"{repo_id}@{branch} already has these files: nothing to commit")
    return PushResult(commit_url=commit.commit_url, pr_url=commit.pr_url, commit_sha=commit.oid,
                      repo_url=str(repo_url), repo_id=repo_id, revision=branch, changed=changed)
