"""The HTTP side of `validate --endpoint URL`: one OpenAI-compatible server (vLLM, SGLang, or a router in
front of either), asked what it serves and sent the prompts.

What the client guarantees, so that a check of a deployment never hangs, leaks or guesses:
- every request has connect and read timeouts, and the whole measurement a deadline (`--endpoint-timeout`);
- the API key comes from an environment variable the user names; it goes only in the Authorization
  header to the endpoint's own origin. Redirects are not followed (a redirect is an error naming where it
  pointed), so the key never reaches another host, and it is in no message and no report;
- TLS is verified against the system CAs and the bundles named by SSL_CERT_FILE / REQUESTS_CA_BUNDLE;
  a certificate that does not verify is an error, never a silent downgrade;
- an https:// endpoint is reached through the proxy $HTTPS_PROXY (else $ALL_PROXY) names, unless $NO_PROXY
  names its host: a CONNECT tunnel, so the proxy learns the host and port and the key travels inside TLS to the
  endpoint only. A plain http:// endpoint is always reached directly: a proxy would read the request, key
  and all. No other proxy setting (HTTP_PROXY, .netrc) is read;
- 429/503 are retried a few times, waiting what Retry-After asks, capped at the Hub client's cap;
- a body that is not JSON, lacks a field, or is cut short is one error naming the path.
"""

from __future__ import annotations

import os
import ssl
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.validate.options import ENDPOINT_KEY_VARIABLE

CONNECT_TIMEOUT_S = 10.0  # at most; less when the deadline is nearer
RETRY_STATUSES = (429, 503)  # the server asks to come back later
MAX_RETRIES = 4
RETRY_AFTER_CAP_S = 60.0  # as the Hub client caps a Retry-After (hub/transport.py)
DEFAULT_BACKOFF_S = 1.0  # a 429/503 without a Retry-After
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")


class EndpointError(DFlashError):
    """The endpoint could not be used: one line naming the URL (never the key)."""


def base_url(url: str) -> str:
    """The server's root: http(s)://host[:port][/prefix], without a trailing /v1 (the paths add it). A URL with
    credentials in it is refused: they would be printed in reports."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--endpoint {url!r}: give an http:// or https:// URL of an OpenAI-compatible server")
    if parts.username or parts.password:
        raise UsageError("--endpoint: the URL carries credentials; give the key through --endpoint-key-env instead")
    path = parts.path.rstrip("/").removesuffix("/v1")
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def tls_context() -> ssl.SSLContext:
    """The system CAs plus every bundle SSL_CERT_FILE / REQUESTS_CA_BUNDLE names; hostnames checked."""
    context = ssl.create_default_context()
    for name in CA_VARIABLES:
        path = os.environ.get(name)
        if path:
            try:
                context.load_verify_locations(cafile=path)
            except (OSError, ssl.SSLError) as exc:
                raise DFlashError(f"${name}: cannot load its CA bundle: {exc}", file=path) from None
    return context


def endpoint_proxy(url: str) -> tuple[str, str] | None:
    """(proxy URL, the variable that named it) through which `url` is reached, or None: directly. Only an https://
    endpoint goes through a proxy (a CONNECT tunnel: the TLS inside carries the key past it), from $HTTPS_PROXY,
    else $ALL_PROXY (either case, lower first, as curl and Python read them); $NO_PROXY (hosts, host:port,
    domain suffixes, or *) sends a host directly."""
    parts = urlsplit(url)
    if parts.scheme != "https":
        return None
    proxies = urllib.request.getproxies_environment()
    scheme = next((s for s in ("https", "all") if proxies.get(s)), None)
    if scheme is None or urllib.request.proxy_bypass_environment(parts.netloc, proxies) or \
            urllib.request.proxy_bypass_environment(parts.hostname, proxies):
        return None
    proxy = proxies[scheme] if "://" in proxies[scheme] else "http://" + proxies[scheme]
    variable = f"${scheme.upper()}_PROXY"
    if urlsplit(proxy).scheme not in ("http", "https") or not urlsplit(proxy).hostname:
        raise UsageError(f"{variable}: give an http:// proxy (host and port) to reach {parts.hostname} through; "
                         f"got a {urlsplit(proxy).scheme}:// one")
    return proxy, variable


def proxy_label(proxy: tuple[str, str]) -> str:
    """The proxy as messages name it: host and port, never its credentials."""
    parts = urlsplit(proxy[0])
    return f"the proxy {parts.hostname}{f':{parts.port}' if parts.port else ''} (from {proxy[1]})"


def read_key(variable: str) -> str | None:
    """The API key from `variable` (None: unset or empty: requests go without one)."""
    return os.environ.get(variable) or None


@dataclass
class Deadline:
    """The whole measurement's time limit: each request gets what is left, never more than `per_request`."""

    total_s: float
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.started + self.total_s - time.monotonic()

    def timeout(self):
        import httpx

        left = self.left()
        if left <= 0:
            raise EndpointError(f"the endpoint did not finish within {self.total_s:g} s (--endpoint-timeout)")
        return httpx.Timeout(left, connect=min(CONNECT_TIMEOUT_S, left))


@dataclass
class Answer:
    """One JSON answer and how long it took (seconds)."""

    body: Any
    seconds: float
    headers: dict[str, str] = field(default_factory=dict)


class Endpoint:
    """One server at `url`: GET and POST of JSON under its root, bounded by `deadline`."""

    def __init__(self, url: str, *, key_variable: str = ENDPOINT_KEY_VARIABLE, deadline: Deadline,
                 concurrency: int = 1, label: str = "--endpoint"):
        import httpx

        self.url, self.label, self.deadline = base_url(url), label, deadline
        self.key_variable = key_variable
        key = read_key(key_variable)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        limits = httpx.Limits(max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1)
        self.proxy = endpoint_proxy(self.url)
        # trust_env off: the environment's proxies for plain HTTP (which would read the key) and .netrc are not
        # used; the one proxy allowed is the tunnel endpoint_proxy decides
        self._client = httpx.Client(headers=headers, verify=tls_context(), follow_redirects=False, limits=limits,
                                    trust_env=False, proxy=self.proxy[0] if self.proxy else None)

    def close(self) -> None:
        self._client.close()

    def get(self, path: str) -> Answer:
        return self._send("GET", path, None, parse_json=path != "/metrics")

    def post(self, path: str, body: dict[str, Any]) -> Answer:
        return self._send("POST", path, body, parse_json=True)

    def _send(self, method: str, path: str, body: dict[str, Any] | None, *, parse_json: bool) -> Answer:
        """The answer to one request, retried on 429/503; any failure is one EndpointError."""
        for attempt in range(MAX_RETRIES + 1):
            started = time.monotonic()
            response = self._exchange(method, path, body)
            if response.status_code in RETRY_STATUSES and attempt < MAX_RETRIES:
                wait = min(retry_after(response.headers), RETRY_AFTER_CAP_S, max(self.deadline.left(), 0))
                time.sleep(wait)
                continue
            break
        self._raise_for_status(response, path)
        seconds = time.monotonic() - started
        headers = dict(response.headers)
        if not parse_json:
            return Answer(response.text, seconds, headers)
        try:
            return Answer(response.json(), seconds, headers)
        except ValueError:
            raise EndpointError(f"{self._where(path)} answered with a body that is not JSON "
                                f"(content-type {response.headers.get('content-type', 'none')})") from None

    def _exchange(self, method: str, path: str, body: dict[str, Any] | None):
        """One HTTP exchange, its body read whole; transport failures as one line."""
        import httpx

        try:
            return self._client.request(method, self.url + path, json=body, timeout=self.deadline.timeout())
        except httpx.TimeoutException as exc:
            kind = "connect" if isinstance(exc, httpx.ConnectTimeout) else "read"
            raise EndpointError(f"{self._where(path)}: no answer ({kind} timeout; --endpoint-timeout "
                                f"{self.deadline.total_s:g} s)") from None
        except httpx.ConnectError as exc:
            reason = "TLS certificate not verified" if "CERTIFICATE_VERIFY_FAILED" in str(exc) else str(exc)
            if "refused" in reason.lower() and not self.proxy:  # the host answered: no server on that port
                parts = urlsplit(self.url)
                port = parts.port or (443 if parts.scheme == "https" else 80)
                reason = (f"connection refused: nothing listens on {parts.hostname}:{port}; check the server is up "
                          f"and the port it serves on, then that {self.url}/v1/models answers")
            via = f" (through {proxy_label(self.proxy)})" if self.proxy else ""
            raise EndpointError(f"{self._where(path)}: cannot connect{via}: {reason}") from None
        except httpx.ProxyError as exc:
            raise EndpointError(f"{self._where(path)}: {proxy_label(self.proxy)} refused the tunnel: "
                                f"{str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise EndpointError(f"{self._where(path)}: the answer was cut short ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else 'connection closed'})") from None
        except httpx.HTTPError as exc:
            raise EndpointError(f"{self._where(path)}: {type(exc).__name__}: {exc}") from None

    def _raise_for_status(self, response, path: str) -> None:
        status = response.status_code
        if status < 300:
            return
        where = self._where(path)
        if 300 <= status < 400:
            target = urlsplit(response.headers.get("location", ""))
            raise EndpointError(f"{where} redirected (HTTP {status}) to {target.scheme}://{target.netloc}"
                                f"{target.path}: not followed (the key goes to the endpoint only); give the final "
                                "URL")
        if status in (401, 403):
            have = "was refused" if read_key(self.key_variable) else "is not set"
            raise EndpointError(f"{where}: HTTP {status}: the API key from ${self.key_variable} {have} "
                                "(--endpoint-key-env names the variable)")
        detail = _error_detail(response)
        if status == 404:
            raise EndpointError(f"{where}: HTTP 404 (not found{': ' + detail if detail else ''}): is it an "
                                "OpenAI-compatible server, and the model one it serves?")
        raise EndpointError(f"{where}: HTTP {status}" + (f": {detail}" if detail else ""))

    def _where(self, path: str) -> str:
        return f"{self.label} {self.url}{path}"


def retry_after(headers) -> float:
    """Seconds a 429/503 asks to wait (Retry-After in seconds; a date or nothing: the default backoff)."""
    raw = headers.get("retry-after")
    try:
        return max(float(raw), 0.0) if raw is not None else DEFAULT_BACKOFF_S
    except ValueError:
        return DEFAULT_BACKOFF_S


def _error_detail(response) -> str:
    """The server's own error message, one line, short (OpenAI's {"error": {"message"}} or {"message"})."""
    try:
        body = response.json()
    except ValueError:
        return ""
    error = body.get("error", body) if isinstance(body, dict) else body
    message = error.get("message") if isinstance(error, dict) else error
    return str(message or "").splitlines()[0][:300] if message else ""


def field_of(body: Any, path: str, where: str) -> Any:
    """body[a][b]... for path "a.b" (integers index lists), or one error naming the missing field."""
    node = body
    for part in path.split("."):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, TypeError, ValueError):
            raise EndpointError(f"{where}: the answer lacks the field `{path}`") from None
    return node


def model_cards(endpoint: Endpoint) -> dict[str, dict[str, Any]]:
    """The model cards /v1/models lists, by id."""
    listed = field_of(endpoint.get("/v1/models").body, "data", endpoint._where("/v1/models"))
    return {m["id"]: m for m in listed if isinstance(m, dict) and m.get("id")} if isinstance(listed, list) else {}


def served_max_model_len(endpoint: Endpoint, model: str) -> int | None:
    """The context `model` is served with: its /v1/models card's max_model_len (vLLM's and SGLang's cards carry
    it, a positive integer; None: the card does not say). Any other value is an error: the length check it bounds
    is never skipped silently."""
    card = model_cards(endpoint).get(model, {})
    if card.get("max_model_len") is None:
        return None
    value = card["max_model_len"]
    if type(value) is not int or value <= 0:
        raise EndpointError(f"{endpoint._where('/v1/models')}: the card of {model!r} gives max_model_len {value!r}, "
                            "not a positive number of tokens: the served context is unknown")
    return value


def served_model(endpoint: Endpoint, wanted: str | None) -> tuple[str, str]:
    """(the model to ask for, the engine serving it: vllm, sglang or unknown, from its `owned_by`): `wanted`
    (checked against /v1/models), else the only one listed."""
    where = endpoint._where("/v1/models")
    cards = model_cards(endpoint)
    if wanted is not None and wanted not in cards:
        raise EndpointError(f"{where} does not serve {wanted!r} (it lists {', '.join(cards) or 'nothing'})")
    if wanted is None and len(cards) != 1:
        raise UsageError(f"{endpoint.label} {endpoint.url} serves " + (f"{len(cards)} models ({', '.join(cards)}): "
                         "choose one with --endpoint-model" if cards else "no model (/v1/models lists none)"))
    model = wanted or next(iter(cards))
    owner = str(cards[model].get("owned_by") or "").lower()
    return model, owner if owner in ("vllm", "sglang") else "unknown"
