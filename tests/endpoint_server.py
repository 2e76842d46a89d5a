"""A tiny OpenAI-compatible HTTP server for the endpoint tests: loopback only, canned answers per path.

Each path has a queue of `Canned` answers (the last one repeats): a status, headers, and a JSON body, raw
bytes, a body cut short (a Content-Length longer than what is sent, then the connection closed), or a hang
(nothing said for `hang_s`). Requests are recorded (method, path, headers, JSON body) so that tests can check
what the client sent: the Authorization header, the fields of each request.

The response shapes are those of the engines' protocol code: vLLM 0.32's `metrics.speculative_decoding`
(vllm/entrypoints/generate/base/protocol.py) and SGLang 0.5.23's `sglext.spec_tokens_details`
(sglang/srt/entrypoints/openai/protocol.py). No SGLang server ran: SGLang has no CPU build.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Canned:
    status: int = 200
    body: Any = None  # JSON (dict/list), bytes (sent as they are), or a callable(request body) -> JSON
    headers: dict[str, str] = field(default_factory=dict)
    cut: bool = False  # announce the whole body, send half, close
    hang_s: float = 0.0


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class FakeEndpoint:
    """Start with `with FakeEndpoint() as server:`; `server.url`, `server.answer(path, *canned)`, `server.seen`."""

    def __init__(self):
        self.routes: dict[str, list[Canned]] = {}
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, path: str, *canned: Canned) -> None:
        self.routes[path] = list(canned)

    def __enter__(self) -> "FakeEndpoint":
        # a short poll: shutdown() waits up to one poll interval, at each test's teardown
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _next(self, path: str) -> Canned:
        with self._lock:
            queue = self.routes.get(path)
            if not queue:
                return Canned(404, {"error": {"message": f"no route {path}"}})
            return queue.pop(0) if len(queue) > 1 else queue[0]

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                server.seen.append(Seen(method, self.path, dict(self.headers), body))
                canned = server._next(self.path)
                if canned.hang_s:
                    server._stop.wait(canned.hang_s)
                payload = canned.body(body) if callable(canned.body) else canned.body
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(canned.status)
                for k, v in canned.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2] if canned.cut else data)
                if canned.cut:
                    self.wfile.flush()
                    self.close_connection = True

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

        return Handler


def models(*ids: str, owned_by: str = "vllm", max_model_len: int | None = None) -> dict:
    """/v1/models; `max_model_len`: the context each card says it is served with (vLLM's and SGLang's cards)."""
    extra = {} if max_model_len is None else {"max_model_len": max_model_len}
    return {"object": "list", "data": [{"id": i, "object": "model", "owned_by": owned_by, **extra} for i in ids]}


BOS = 1  # the special token char_tokenize adds first


def char_tokenize(text: str, add_special_tokens: bool = True) -> list[int]:
    """The fake server's tokenizer: a BOS where special tokens are added, then one id per character."""
    return [BOS] * add_special_tokens + [2 + ord(c) % 500 for c in text]


def vllm_tokenize(request: dict, max_model_len: int = 4096) -> dict:
    """vLLM 0.33's POST /tokenize answer to a completion-style request (TokenizeResponse: count, max_model_len,
    tokens, token_strs), tokenized by char_tokenize; `add_special_tokens` defaults to true, as vLLM's does."""
    tokens = char_tokenize(request["prompt"], request.get("add_special_tokens", True))
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": None}


def vllm_completion(histogram: list[int], *, tokens: list[int], chat: bool = False, drafted: int | None = None,
                    ttft_ms: float | None = None, per_step: list[int] | None = None) -> dict:
    """A vLLM 0.32 answer with per-request statistics (--per-request-spec-decode-metrics summary; `per_step`: the
    accepted count of each step, in order, as the `detailed` level adds them with the drafted counts)."""
    k = len(histogram) - 1
    steps, accepted = sum(histogram), sum(j * h for j, h in enumerate(histogram))
    spec = {"mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / (steps * k) if steps else 0.0, "acceptance_histogram": histogram,
            "num_spec_steps": steps, "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": steps * k if drafted is None else drafted, "num_spec_tokens": k,
            "per_step_accepted": per_step, "per_step_drafted": None if per_step is None else [k] * len(per_step)}
    choice = {"index": 0, "token_ids": tokens, "finish_reason": "length"}
    choice |= {"message": {"role": "assistant", "content": "x"}} if chat else {"text": "x"}
    return {"id": "c", "object": "chat.completion" if chat else "text_completion", "model": "m", "choices": [choice],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)},
            "metrics": {"time_to_first_token_ms": ttft_ms, "mean_itl_ms": None, "speculative_decoding": spec}}


def plain_completion(tokens: list[int], chat: bool = False) -> dict:
    """An answer without speculative statistics."""
    answer = vllm_completion([1, 0], tokens=tokens, chat=chat)
    del answer["metrics"]
    return answer


def sglang_chat(histogram: list[int], *, tokens: list[int], draft_tokens: int) -> dict:
    """An SGLang 0.5.23 chat answer with `return_spec_tokens_details` (SglExt.spec_tokens_details; the histogram
    as long as the largest count seen, speculative_num_draft_tokens - 1 proposed per verify step)."""
    steps, accepted = sum(histogram), sum(j * h for j, h in enumerate(histogram))
    details = {"spec_accept_rate": accepted / (steps * (draft_tokens - 1)), "spec_accept_length": len(tokens) / steps,
               "spec_cap_length": 0.0, "spec_block_accept_length": 0.0, "spec_num_correct_drafts": accepted,
               "spec_num_proposed_drafts": steps * (draft_tokens - 1), "spec_verify_ct": steps,
               "spec_correct_drafts_histogram": histogram, "spec_cap_lens_histogram": []}
    return {"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)},
            "sglext": {"spec_tokens_details": details, "output_ids": [tokens]}}


def prometheus(drafts: int, drafted: int, accepted: int, per_pos: list[int], done: int, running: int = 0,
               engines: int = 1) -> bytes:
    """vLLM's /metrics text, the counts split over `engines` data-parallel ranks (each its own `engine` label)."""
    lines = ["# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
             "# TYPE vllm:spec_decode_num_drafts_total counter"]
    for e in range(engines):
        share = (lambda n: n // engines + (n % engines if e == 0 else 0))
        label = f'engine="{e}",model_name="m"'
        lines += [f"vllm:spec_decode_num_drafts_total{{{label}}} {share(drafts)}.0",
                  f"vllm:spec_decode_num_drafts_created{{{label}}} 1.7e9",
                  f"vllm:spec_decode_num_draft_tokens_total{{{label}}} {share(drafted)}.0",
                  f"vllm:spec_decode_num_accepted_tokens_total{{{label}}} {share(accepted)}.0",
                  f'vllm:request_success_total{{{label},finished_reason="length"}} {share(done)}.0',
                  f'vllm:request_success_total{{{label},finished_reason="stop"}} 0.0',
                  f"vllm:num_requests_running{{{label}}} {running if e == 0 else 0}.0",
                  f"vllm:num_requests_waiting{{{label}}} 0.0"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="{k}"}} {share(n)}.0'
                  for k, n in enumerate(per_pos)]
    return ("\n".join(lines) + "\n").encode()


def sequence(*bodies: Any) -> Callable[[Any], Any]:
    """A body callable answering the given bodies in turn (the last repeats)."""
    queue = list(bodies)
    lock = threading.Lock()

    def next_body(_request):
        with lock:
            return queue.pop(0) if len(queue) > 1 else queue[0]

    return next_body



class RecordingProxy:
    """An HTTP proxy on loopback that records every byte it receives from the client (`received`, one bytes per
    connection): a CONNECT is tunnelled to its host and port (what it reads after that is the TLS stream); any other
    request is answered 502 and closed (a proxy that would read it). `with RecordingProxy() as proxy:`,
    `proxy.url`."""

    def __init__(self):
        import socket

        self.received: list[bytearray] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()

    def __enter__(self) -> "RecordingProxy":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed.set()
        self._listener.close()

    def heads(self) -> list[str]:
        """The first line of each connection's request (e.g. `CONNECT 127.0.0.1:443 HTTP/1.1`)."""
        return [bytes(r).split(b"\r\n", 1)[0].decode("latin-1") for r in self.received]

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            record = bytearray()
            self.received.append(record)
            threading.Thread(target=self._serve, args=(client, record), daemon=True).start()

    def _serve(self, client, record: bytearray) -> None:
        import socket

        with client:
            while b"\r\n\r\n" not in record:
                chunk = client.recv(65536)
                if not chunk:
                    return
                record += chunk
            method, target = bytes(record).split(b" ", 2)[:2]
            if method != b"CONNECT":
                client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            host, port = target.decode().rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=30) as upstream:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                threading.Thread(target=self._pipe, args=(upstream, client, None), daemon=True).start()
                self._pipe(client, upstream, record)

    @staticmethod
    def _pipe(src, dst, record: bytearray | None) -> None:
        try:
            while chunk := src.recv(65536):
                if record is not None:
                    record += chunk
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(2)
            except OSError:
                pass
