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

import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from dflash_convert.hub import card
from dflash_convert.format import catalogue
from dflash_convert.format.configs import is_hub_id
from dflash_convert.io.checkpoint import CONFIG_NAME, is_pickle_weight_file
from dflash_convert.io.reading import announced_by_cache_name, discard, file_digest
from dflash_convert.io.staging import check_destination, staged_directory
from dflash_convert.errors import DFlashError, Interrupted, UsageError
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


def _hub_error(exc: Exception, *, where: str, endpoint: str, action: str, file: str | None = None) -> DFlashError:
    """One line naming the repo and revision (and the file, for a download) for whatever the client raised."""
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
        name = f": {file!r}" if file else ""
        return DFlashError(f"{where}: file not found on the Hub{name} ({_one_line(exc.server_message or '')})")
    if isinstance(exc, e.HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        if status == 401:
            return DFlashError(f"the Hub at {endpoint} rejected the token (401 Unauthorized) while trying to {action} "
                               f"{where}; check --token, HF_TOKEN or the stored token (`hf auth login`)")
        if status == 403 and action == "push to":
            return DFlashError(f"the token has no write access to {repo_id} (403 Forbidden) while trying to "
                               f"{action} {where}")
        if status == 403:
            what = f"{file!r} of {where}" if file else where
            return DFlashError(f"the Hub at {endpoint} refused access (403 Forbidden) while trying to {action} {what}: "
                               f"{_one_line(exc.server_message or 'no reason given')}")
        if status == 412:
            return DFlashError(f"{where} moved while pushing (412: another commit landed first); nothing was "
                               "committed, rerun the push")
        detail = _one_line(exc.server_message or exc.response.reason_phrase or "")
        what = f"{file!r} of {where}" if file else where
        return DFlashError(f"Hub request failed while trying to {action} {what}: HTTP {status} {detail}".rstrip())
    if isinstance(exc, (e.OfflineModeIsEnabled, e.LocalEntryNotFoundError, e.RevisionResolutionError)):
        if is_offline_mode():
            return DFlashError(f"{where} is not (completely) in the local cache {constants.HF_HUB_CACHE} and "
                               "HF_HUB_OFFLINE=1 forbids downloading it")
        what = f"{file!r} of {where}" if file else where
        if isinstance(exc.__cause__, getattr(e, "FileMetadataError", ())):  # an answer, but not the Hub's
            return DFlashError(f"the Hub at {endpoint} answered for {what} without the file's metadata "
                               f"({_one_line(exc.__cause__)[:200]})")
        return DFlashError(f"cannot reach the Hub at {endpoint} to {action} {what}, and it is not in the local "
                           f"cache {constants.HF_HUB_CACHE}")
    if isinstance(exc, http_error):  # the connection failed: refused, reset, timed out
        if action == "push to" and type(exc).__name__ == "ConnectError":  # refused, no route, no DNS: nothing sent
            return DFlashError(f"could not connect to the Hub at {endpoint} to push to {where} ({_one_line(exc)}); "
                               "nothing was pushed")
        if action == "push to":
            return DFlashError(f"connection to the Hub at {endpoint} lost while pushing to {where} "
                               f"({type(exc).__name__}); a Hub commit is all-or-nothing: rerun the push")
        what = f"{file!r} of {where}" if file else where
        return DFlashError(f"cannot reach the Hub at {endpoint} to {action} {what} ({type(exc).__name__}: "
                           f"{_one_line(exc)})")
    if isinstance(exc, OSError):
        return DFlashError(f"local I/O error while trying to {action} {where}: {_one_line(exc)}")
    return DFlashError(f"failed to {action} {where}: {type(exc).__name__}: {_one_line(exc)}")


def _hub_call(fn, *, where: str, endpoint: str, action: str, file: str | None = None, retry: bool = False):
    """Run fn() with every network wait bounded; any client error becomes one DFlashError line (our own
    DFlashErrors pass through). retry: fn's requests are not retried by the client itself (its first
    request, the revision), so retry it here as the client retries the others."""
    _guard_session()
    _watch.start(endpoint)
    try:
        return _retried(fn) if retry else fn()
    except (DFlashError, KeyboardInterrupt):
        raise
    except _GaveUp as exc:
        end_open_line()
        what = f"{file!r} of {where}" if file else where
        raise DFlashError(f"gave up trying to {action} {what}: {exc} ({PATIENCE_VARIABLE}={_watch.patience:g})") \
            from None
    except Exception as exc:  # noqa: BLE001 - the client raises many types; each becomes one line
        end_open_line()  # after an interrupted progress bar of the client
        raise _hub_error(exc, where=where, endpoint=endpoint, action=action, file=file) from exc


# ----------------------------------------------------------------------------- network waits, bounded

# A Hub that stops answering ends the command: every request gets connect/read timeouts (the client's
# HF_HUB_ETAG_TIMEOUT / HF_HUB_DOWNLOAD_TIMEOUT where it sets none itself, as for its API calls), none
# longer than the patience left, and once the Hub has sent nothing (no answer, no byte, no success) for
# the patience, the next request or wait is not started. A Retry-After longer than the cap is shortened
# (and said). These hooks go on the client's own HTTP session, through its public factory.
PATIENCE_VARIABLE = "DFLASH_CONVERT_HUB_PATIENCE"
DEFAULT_PATIENCE = 45.0  # seconds; the longest backoff sleep (8 s) on top stays under a minute
RETRY_AFTER_CAP = 60.0  # seconds
RETRY_STATUSES = (408, 429, 500, 502, 503, 504)  # what the client retries
MAX_RETRIES = 5


class _GaveUp(BaseException):
    """The patience ran out. A BaseException: the client's `except Exception` must not retry it."""


@dataclass
class _Watch:
    patience: float = DEFAULT_PATIENCE
    last: float = field(default_factory=time.monotonic)  # the Hub's last answer or byte
    endpoint: str = ""
    asked: set = field(default_factory=set)  # (method, url) requested so far in this call
    reached: dict = field(default_factory=dict)  # url -> furthest byte of its body received

    def start(self, endpoint: str = "") -> None:
        self.endpoint, self.asked, self.reached = endpoint, set(), {}
        raw = os.environ.get(PATIENCE_VARIABLE, "").strip()
        try:
            patience = float(raw) if raw else DEFAULT_PATIENCE
        except ValueError:
            patience = -1.0
        if not 0 < patience < float("inf"):
            raise UsageError(f"{PATIENCE_VARIABLE} must be a positive number of seconds, got {raw!r}")
        self.patience, self.last = patience, time.monotonic()

    def left(self) -> float:
        return self.last + self.patience - time.monotonic()

    def heard(self) -> None:
        self.last = time.monotonic()


_watch = _Watch()
_guarded: list[bool] = []


def _on_request(request) -> None:
    """Every request: timeouts set (the client leaves its API calls without), none beyond the patience left."""
    from huggingface_hub import constants

    left = _watch.left()
    if left <= 0:
        raise _GaveUp(f"the Hub sent nothing for {_watch.patience:g} s")
    if "authorization" in request.headers and not _token_may_go_to(str(request.url)):
        del request.headers["authorization"]  # 1.x follows a HEAD redirect to another port of the host with it
    given = dict(request.extensions.get("timeout") or {})
    defaults = {"connect": constants.HF_HUB_ETAG_TIMEOUT, "read": constants.HF_HUB_DOWNLOAD_TIMEOUT,
                "write": max(constants.HF_HUB_DOWNLOAD_TIMEOUT, 60), "pool": constants.HF_HUB_ETAG_TIMEOUT}
    request.extensions["timeout"] = {k: min(given.get(k) or v, max(left, 0.05)) for k, v in defaults.items()}


HUB_HOSTS = ("huggingface.co", "hf.co")  # the Hub's own hosts, which a token is for


def _origin(url: str) -> tuple[str, str, int | None]:
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return u.scheme, (u.hostname or "").lower(), u.port or {"http": 80, "https": 443}.get(u.scheme)


def _token_may_go_to(url: str) -> bool:
    """The token goes to the endpoint's origin and the Hub's hosts, never elsewhere (a CDN, another port)."""
    scheme, host, _ = _origin(url)
    if _watch.endpoint and _origin(url) == _origin(_watch.endpoint):
        return True
    return scheme == "https" and any(host == h or host.endswith("." + h) for h in HUB_HOSTS)


def _retry_after(headers) -> float | None:
    raw = headers.get("Retry-After")
    try:
        return max(float(raw), 0.0) if raw is not None else None
    except ValueError:
        return None


# the IETF draft's `RateLimit: "api";r=0;t=55`, as the client matches it
_RATE_LIMIT = re.compile(r"\"\w+\"\s*;\s*r\s*=\s*(?P<r>\d+)\s*;\s*t\s*=\s*(?P<t>\d+)")


def _asked_wait(status: int, headers) -> tuple[float | None, str]:
    """(seconds, the header that asks) the client waits before retrying: on a 429 whose RateLimit says nothing
    is left (r=0), its reset t, before any Retry-After; else the Retry-After."""
    limit = _RATE_LIMIT.search(headers.get("RateLimit", "")) if status == 429 else None
    if limit and int(limit.group("r")) == 0:
        return float(limit.group("t")), "RateLimit reset"
    return _retry_after(headers), "Retry-After"


def _cap_waits(headers) -> None:
    """Rewrite the answer's waits longer than RETRY_AFTER_CAP to the cap, before the client reads them."""
    limit = _RATE_LIMIT.search(headers.get("RateLimit", ""))
    if limit and int(limit.group("t")) > RETRY_AFTER_CAP:
        raw = headers["RateLimit"]
        headers["RateLimit"] = raw[:limit.start("t")] + f"{RETRY_AFTER_CAP:.0f}" + raw[limit.end("t"):]
    if (_retry_after(headers) or 0) > RETRY_AFTER_CAP:
        headers["Retry-After"] = f"{RETRY_AFTER_CAP:.0f}"


def _on_response(response) -> None:
    """Progress is an answer the client does not retry, or a byte of a body; a long wait asked is capped."""
    from huggingface_hub.utils import httpx as http

    status = response.status_code
    key = (response.request.method, str(response.request.url))
    repeated = key in _watch.asked
    _watch.asked.add(key)
    if status not in RETRY_STATUSES:
        if not repeated:  # a retry's answer is progress only by the new bytes it brings
            _watch.heard()
    else:
        wait, asking = _asked_wait(status, response.headers)
        if wait is not None:
            capped = min(wait, RETRY_AFTER_CAP)
            if capped > _watch.left():
                raise _GaveUp(f"the Hub answered HTTP {status} asking to retry in {wait:g} s, after the patience "
                              f"left ({max(_watch.left(), 0):.0f} s)")
            _cap_waits(response.headers)
            _warn(f"the Hub answered HTTP {status} with {asking}: {wait:g} s; retrying in {capped:g} s"
                  + (f" (capped at {RETRY_AFTER_CAP:g} s)" if wait > RETRY_AFTER_CAP else ""))
    m = re.match(r"bytes=(\d+)-", response.request.headers.get("range", "")) if status == 206 else None
    response.stream = _watched_stream(http, response.stream, str(response.request.url), int(m.group(1)) if m else 0)


def _watched_stream(http, stream, url: str, offset: int):
    """The body; a chunk is progress when it reaches further into the file than any answer before (a
    server sending the same first half again and again makes none). A connection reset mid-body
    (ReadError) is raised as the client's RemoteProtocolError, after which the client resumes the file
    from the bytes it has (it resumes after a short body or a timeout, not after a reset)."""

    class Watched(http.SyncByteStream):
        def __iter__(self):
            position = offset
            try:
                for chunk in stream:
                    position += len(chunk)
                    if position > _watch.reached.get(url, 0):
                        _watch.reached[url] = position
                        _watch.heard()
                    yield chunk
            except http.ReadError as exc:
                raise http.RemoteProtocolError(f"connection lost mid-body ({exc}); resuming") from exc

        def close(self) -> None:
            stream.close()

    return Watched() if isinstance(stream, http.SyncByteStream) else stream


def _guard_session() -> None:
    """Put the hooks on the client's HTTP session, and on every session it makes later (it makes a new
    one after a connection error)."""
    if _guarded:
        return
    from huggingface_hub import get_session, set_client_factory

    template = get_session()
    hooks = {k: list(v) for k, v in template.event_hooks.items()}

    def guarded_client():
        return type(template)(event_hooks={"request": [*hooks.get("request", []), _on_request],
                                           "response": [*hooks.get("response", []), _on_response]},
                              follow_redirects=template.follow_redirects, timeout=None)

    set_client_factory(guarded_client)
    _guarded.append(True)


def _retry_delay(exc: BaseException, backoff: float) -> float | None:
    """Seconds to wait before retrying after exc, or None when it is not worth a retry (the client's rules)."""
    from huggingface_hub import errors as e

    http_error = _connection_error_class()
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None) if isinstance(seen, e.HfHubHTTPError) else None
        if response is not None:
            if response.status_code not in RETRY_STATUSES:
                return None
            wait, _ = _asked_wait(response.status_code, response.headers)
            return min(wait, RETRY_AFTER_CAP) + 1 if wait is not None else backoff
        if isinstance(seen, http_error):
            return backoff
        seen = seen.__cause__ or seen.__context__
    return None


def _retried(fn):
    backoff = 1.0
    for attempt in range(MAX_RETRIES + 1):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - re-raised unless the client would retry it
            delay = _retry_delay(exc, backoff)
            if delay is None or attempt == MAX_RETRIES:
                raise
            if delay > _watch.left():
                raise _GaveUp(f"the Hub kept failing for {_watch.patience:g} s (last: {type(exc).__name__}: "
                              f"{_one_line(exc)[:200]})") from exc
            time.sleep(delay)
            backoff = min(backoff * 2, 8.0)


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
        raise UsageError(f"{option} {_one_line(repr(revision))} is not a branch, tag or commit id "
                         "(no `..`, no leading, trailing or doubled `/`, no spaces or control characters)")


def _patterns(*, for_target: bool, allow_pickle: bool, config_only: bool) -> list[str]:
    if config_only:
        return [CONFIG_NAME]
    return DRAFT_PATTERNS + (TARGET_PATTERNS if for_target else []) + (PICKLE_PATTERNS if allow_pickle else [])


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
          need_weights: bool, allow_pickle: bool) -> _Snapshot:
    """Resolve the revision once (recorded in the cache's refs/, which offline runs read back) and
    check the remote file list; nothing is written outside the cache."""
    from huggingface_hub import RepoFile, is_offline_mode
    from huggingface_hub.utils import filter_repo_objects

    check_revision(revision)
    token = hub_token(token)
    api = _api(token, endpoint)
    where = f"{repo_id}@{revision or 'main'}"
    call = dict(where=where, endpoint=api.endpoint, action="download")
    offline = is_offline_mode()
    sha = _hub_call(lambda: api.resolve_revision(repo_id, revision=revision, local_files_only=offline), retry=True,
                    **call).resolved
    if offline:
        return _Snapshot(repo_id, revision or "main", sha, patterns, token, api.endpoint)
    tree = _hub_call(lambda: [f for f in api.list_repo_tree(repo_id, revision=sha, recursive=True)
                              if isinstance(f, RepoFile)], **call)
    listing = [f.path for f in tree]
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
    files = {f.path: (("sha256", f.lfs.sha256) if f.lfs else ("git", f.blob_id)) for f in tree if f.path in wanted}
    _say(f"fetching {len(wanted)} files of {where} ({sha[:12]}) from {api.endpoint}")
    return _Snapshot(repo_id, revision or "main", sha, patterns, token, api.endpoint, files)


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
        folder = Path(_hub_call(lambda: snapshot_download(snap.repo_id, revision=snap.sha, allow_patterns=snap.patterns,
                                                          local_files_only=True), **call))
        names = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*")) if p.is_file()]
    else:
        folder, names = local_dir, list(snap.files)
        for name in names:
            try:
                path = _hub_call(lambda: hf_hub_download(snap.repo_id, name, revision=snap.sha, local_dir=local_dir,
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
                   config_only: bool = False, verify_weights: bool = True) -> Resolved:
    """A local checkpoint directory (or its config.json) as is; a Hub id `org/name` downloaded into the cache.

    for_target also fetches generation_config.json and the tokenizer files; config_only fetches
    config.json alone (enough for --verifier). The resolved commit sha is in `.commit_sha`. Every
    file is checked against the hash the Hub announced for it; verify_weights=False leaves the
    *.safetensors files to the caller, which must hash them against their cache names before using
    them (a conversion does, in the read it makes anyway).
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
                 need_weights=not config_only, allow_pickle=allow_pickle)
    return _fetch(snap, hash_later=() if verify_weights else HASHED_LATER)


def pull(repo_id: str, out_dir: str | Path | None = None, *, revision: str | None = None, token: str | None = None,
         allow_pickle: bool = False, endpoint: str | None = None, overwrite: bool = False) -> Resolved:
    """Download a draft checkpoint into the cache, or materialize it as plain files in out_dir.

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
                 need_weights=True, allow_pickle=allow_pickle)
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
        raise UsageError(f"{option} must name a branch to push to, got {_one_line(repr(revision))}")


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
