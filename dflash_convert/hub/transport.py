"""Hugging Face Hub transport: every request of the real `huggingface_hub` client bounded in time, its
errors as one line each, and the token sent only where it belongs. hub/client.py (pull, push, resolve) and
hub/datasets.py make their requests through `hub_call`.

The client's errors are mapped from its public error classes (HUB_ERRORS, a table checked in order); a
failed connection is recognised through the HTTP library's base error class, which the client's own
`HfHubHTTPError` derives from, so this module never imports that library (httpx in 1.x, httpx2 in 2.x).
The hooks that bound the waits (timeouts, the patience, Retry-After) go on the client's own HTTP session
through its public factory; the client's settings (`constants`) are read where they are used.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.hub.tokens import end_open_line, redact

# Where a Hub call's info lines ("fetching ...", "pushing ...") go: the caller's `on_info` (the CLI's stderr,
# quiet under -q), nowhere when it passes none. Warnings always print.
Say = Callable[[str], None]


def unsaid(message: str) -> None:
    """The info lines of a caller that asked for none."""


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def hub_api(token: str | None, endpoint: str | None):
    from huggingface_hub import HfApi

    from dflash_convert import __version__

    return HfApi(endpoint=endpoint, token=token, library_name="dflash-convert", library_version=__version__)


# ----------------------------------------------------------------------------- errors

def one_line(text: Any) -> str:
    """Server-supplied text as one printable line: no token, no terminal control sequences."""
    return redact(re.sub(r"[\x00-\x1f\x7f-\x9f]", "?", " ".join(str(text).split())))


def _connection_error_class() -> type | tuple:
    """The HTTP library's base error (httpx.HTTPError or httpx2.HTTPError), found through the client's class."""
    from huggingface_hub.errors import HfHubHTTPError

    return next((c for c in HfHubHTTPError.__mro__[1:] if c.__name__ == "HTTPError"), ())


# What the client raised -> the one line a user reads: the first row that holds gives the message.
# when: error classes of huggingface_hub.errors (by name), "connection" (the HTTP library's base error: a
# connection refused, reset or timed out), "OSError", "Exception", or the status of the Hub's HTTP answer
# ("any status": one no row above names). only: a further condition (`conditions` in _hub_error). The
# message's fields: where (repo@revision), repo_id, revision, endpoint, action, what (the file of where, or
# where), name (": 'file'" or nothing), kind (the error's class), text (its message), said and reason (the
# Hub's error message, or nothing / "no reason given"), http ("HTTP 500 <what the Hub said>"), cause (the
# error behind it), cache (the Hub cache's folder).
class HubFault(NamedTuple):
    when: str | int
    message: str
    only: str = ""
    error: type[DFlashError] = DFlashError


OFFLINE = "OfflineModeIsEnabled LocalEntryNotFoundError RevisionResolutionError"
HUB_ERRORS = (
    HubFault("HFValidationError", "invalid Hub repo id or revision {where!r}: {text}", error=UsageError),
    HubFault("RevisionNotFoundError", "revision {revision!r} not found in Hub repo {repo_id} ({endpoint})"),
    HubFault("GatedRepoError",
             "Hub repo {repo_id} is gated: request access on its page, then pass a token with access"),
    HubFault("RepositoryNotFoundError",
             "Hub repo {repo_id} not found at {endpoint} (or it is private and the token has no access)"),
    HubFault("RemoteEntryNotFoundError", "{where}: file not found on the Hub{name} ({said})"),
    HubFault(401, "the Hub at {endpoint} rejected the token (401 Unauthorized) while trying to {action} {where}; "
                  "check --token, HF_TOKEN or the stored token (`hf auth login`)"),
    HubFault(403, "the token has no write access to {repo_id} (403 Forbidden) while trying to {action} {where}",
             "pushing"),
    HubFault(403, "the Hub at {endpoint} refused access (403 Forbidden) while trying to {action} {what}: {reason}"),
    HubFault(412, "{where} moved while pushing (412: another commit landed first); nothing was committed, rerun "
                  "the push"),
    HubFault("any status", "Hub request failed while trying to {action} {what}: {http}"),
    HubFault(OFFLINE, "{where} is not (completely) in the local cache {cache} and HF_HUB_OFFLINE=1 forbids "
                      "downloading it", "offline"),
    HubFault(OFFLINE, "the Hub at {endpoint} answered for {what} without the file's metadata ({cause})",
             "no metadata"),  # an answer, but not the Hub's
    HubFault(OFFLINE, "cannot reach the Hub at {endpoint} to {action} {what}, and it is not in the local cache "
                      "{cache}; to work without the Hub give a local path"),
    HubFault("connection", "could not connect to the Hub at {endpoint} to push to {where} ({text}); nothing was "
                           "pushed", "pushing, refused"),  # refused, no route, no DNS: nothing was sent
    HubFault("connection", "connection to the Hub at {endpoint} lost while pushing to {where} ({kind}); a Hub "
                           "commit is all-or-nothing: rerun the push", "pushing"),
    HubFault("connection", "cannot reach the Hub at {endpoint} to {action} {what} ({kind}: {text}); to work "
                           "without it give a local path, or set HF_HUB_OFFLINE=1 to use a copy in the cache {cache}"),
    HubFault("OSError", "local I/O error while trying to {action} {where}: {text}"),
    HubFault("Exception", "failed to {action} {where}: {kind}: {text}"),
)


def _hub_error(exc: Exception, *, where: str, endpoint: str, action: str, file: str | None = None) -> DFlashError:
    """One line naming the repo and revision (and the file, for a download) for whatever the client raised:
    HUB_ERRORS' first row that holds."""
    from huggingface_hub import constants, is_offline_mode
    from huggingface_hub import errors as e

    exc = _underlying(exc, e)
    response = exc.response if isinstance(exc, e.HfHubHTTPError) else None
    status, said = getattr(response, "status_code", None), getattr(exc, "server_message", None)
    repo_id, _, revision = where.partition("@")
    fields = dict(where=where, repo_id=repo_id, revision=revision, endpoint=endpoint, action=action,
                  what=f"{file!r} of {where}" if file else where, name=f": {file!r}" if file else "",
                  kind=type(exc).__name__, text=one_line(exc), said=one_line(said or ""),
                  reason=one_line(said or "no reason given"), cause=one_line(exc.__cause__)[:200],
                  http=f"HTTP {status} {one_line(said or getattr(response, 'reason_phrase', '') or '')}".rstrip(),
                  cache=constants.HF_HUB_CACHE)
    conditions = {"": True, "pushing": action == "push to", "offline": is_offline_mode(),
                  "pushing, refused": action == "push to" and type(exc).__name__ == "ConnectError",
                  "no metadata": isinstance(exc.__cause__, getattr(e, "FileMetadataError", ()))}
    named = {"connection": _connection_error_class(), "OSError": OSError, "Exception": Exception}

    def matches(when: str | int) -> bool:
        if isinstance(when, int) or when == "any status":
            return status is not None and when in (status, "any status")
        return isinstance(exc, tuple(named[n] if n in named else getattr(e, n) for n in when.split()))

    fault = next(f for f in HUB_ERRORS if matches(f.when) and conditions[f.only])  # the last row takes any
    return fault.error(fault.message.format(**fields))


def _underlying(exc: Exception, e) -> Exception:
    """The client wraps some failures (e.g. an LFS upload giving up) in a RuntimeError: the failed connection
    (or the offline refusal) in its causes, else exc."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, (_connection_error_class(), e.OfflineModeIsEnabled)):
            return cause
        cause = cause.__cause__ or cause.__context__
    return exc


def hub_call(fn, *, where: str, endpoint: str, action: str, file: str | None = None, retry: bool = False):
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
            warn(f"the Hub answered HTTP {status} with {asking}: {wait:g} s; retrying in {capped:g} s"
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


def say_retries(say: Say) -> None:
    """Where the status line of each retry goes (the CLI's status lines: stderr, none under -q)."""
    _retry_status[0] = say


_retry_status: list[Say] = [lambda message: print(message, file=sys.stderr, flush=True)]


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
                              f"{one_line(exc)[:200]})") from exc
            # a wait of up to a minute in all: said as it happens, never silence
            from huggingface_hub import errors as e

            why = _underlying(exc, e)
            _retry_status[0](f"the Hub at {_watch.endpoint or 'its endpoint'} did not answer ({type(why).__name__}: "
                             f"{one_line(why)[:120]}): retrying in {delay:g} s (retry {attempt + 1} of {MAX_RETRIES})")
            time.sleep(delay)
            backoff = min(backoff * 2, 8.0)
