"""A small Hugging Face Hub-compatible HTTP server for tests: in memory, loopback only.

It implements the endpoints the real `huggingface_hub` client (1.x and 2.x) calls for create_repo,
create_commit (regular + basic-LFS uploads), create_branch / create_tag, list_repo_refs,
list_repo_tree, repo_info and file downloads (HEAD + GET on /resolve/), with the typed errors the
client maps to exceptions (headers X-Error-Code / X-Error-Message).

Not a Hub: no users, orgs, permissions beyond "one valid token", no Xet (tests set
HF_HUB_DISABLE_XET=1). Bodies are bounded (MAX_BODY) and the socket binds 127.0.0.1 only.

Test hooks: `seed_repo`, `inject_file` (commits a path the real Hub would refuse, e.g. "../x"),
`create_tag`, `files_at`, `commits`, `lfs_puts`, `drop_next(kind, n)` which makes the next n
requests of a kind ("lfs_put" or "commit": the request body; "download": the response body of an
LFS file) lose their connection half-way, `fail_next(path_part, status, message)` which answers the next request
whose path contains path_part with that error (and X-Error-Code), `move_branch_after_resolve(repo_id, branch, files)`
which commits files on the branch right after the first repo_info of that branch is answered (a
branch moving between resolving a revision and downloading it), `hold_downloads` /
`release_downloads` (LFS file downloads wait in between, at most a minute), and `echo_auth`: error messages
then quote the Authorization header received, as a hostile or buggy server might.

Fault injection, `fault(path_part, kind, n=1, **params)`: the next n requests whose path contains
path_part misbehave. Kinds: "status" (answer `status` with `headers`, e.g. Retry-After, and X-Error-Message
`message`), "stall_headers" (accept, then say nothing for `seconds`), and for file downloads (GET
/resolve/): "truncate" (a short body, its size announced as the file's by HEAD and GET), "corrupt" (one bit flipped), "stall_body"
(half the body, then silence), "reset" (half the body, then a TCP reset), "redirect" (HEAD and GET
answered 302 to `to` + the file name, with the file's metadata headers, as the Hub redirects to its CDN).
Stalls end early at `stop()`. `BlobServer` is the other end of a redirect: another port, fixed bytes,
and the Authorization headers it received.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "hf_fakeTokenForTestsOnly0123456789abcdef"  # the token the tests' server accepts (tests/conftest.py)
MAX_BODY = 64 * 1024 * 1024
MAX_REPOS = 1000
HEX40 = set("0123456789abcdef")


def local_files(path: Path) -> dict[str, bytes]:
    """A local directory's files as `seed_repo` takes them and `files_at` gives them back."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and ".cache" not in p.parts}


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class Blob:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_oid(self) -> str:
        """What git stores: the content, or for LFS files the pointer text."""
        return git_blob_sha1(lfs_pointer(self.sha256, len(self.data)) if self.lfs else self.data)


@dataclass
class Commit:
    sha: str
    parent: str | None
    files: dict[str, Blob]
    title: str
    description: str


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    prs: dict[int, str] = field(default_factory=dict)  # refs/pr/N -> commit sha

    def resolve(self, rev: str) -> str | None:
        """Commit sha a branch, tag, refs/pr/N or (full) commit sha names; None if unknown."""
        if rev in self.branches:
            return self.branches[rev]
        if rev in self.tags:
            return self.tags[rev]
        if rev.startswith("refs/heads/") and rev[11:] in self.branches:
            return self.branches[rev[11:]]
        if rev.startswith("refs/pr/") and rev[8:].isdigit() and int(rev[8:]) in self.prs:
            return self.prs[int(rev[8:])]
        if len(rev) == 40 and set(rev) <= HEX40 and rev in self.commits:
            return rev
        return None


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


def _bad_path(path: str) -> bool:
    """What the real Hub refuses in a commit: absolute paths, '..', empty parts, backslashes."""
    parts = path.split("/")
    return not path or path.startswith("/") or "\\" in path or "\0" in path or any(p in ("", ".", "..") for p in parts)


class HubState:
    """Everything the server stores, behind one lock."""

    def __init__(self, valid_token: str, lfs_threshold: int):
        self.valid_token = valid_token
        self.lfs_threshold = lfs_threshold
        self.lock = threading.Lock()
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}  # sha256 -> content uploaded through PUT
        self.lfs_puts: list[str] = []  # sha256 of every completed LFS PUT
        self.drops: dict[str, int] = {}
        self.failures: list[tuple[str, int, str, str | None]] = []  # (path part, status, message, code)
        self.moves: dict[tuple[str, str], dict[str, bytes]] = {}  # (repo, branch) -> files to commit
        self.echo_auth = False
        self.downloads_open = threading.Event()  # cleared by hold_downloads: LFS downloads wait
        self.downloads_open.set()
        self.echoed: list[str] = []  # every error message sent with the Authorization header in it
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, for assertions
        self.ranges: list[tuple[str, str]] = []  # (file, Range header) of every ranged download
        self.faults: list[list] = []  # [path part, kind, params, n left]
        self.stopping = threading.Event()  # set by stop(): stalls end
        self._counter = 0

    # -- commits
    def new_commit(self, repo: Repo, parent: str | None, files: dict[str, Blob], title: str, description: str = "") -> str:
        self._counter += 1
        digest = hashlib.sha1(json.dumps([repo.repo_id, parent, sorted((p, b.git_oid) for p, b in files.items()),
                                          title, description, self._counter, time.time_ns()]).encode()).hexdigest()
        repo.commits[digest] = Commit(digest, parent, dict(files), title, description)
        return digest

    def create(self, repo_id: str, private: bool) -> Repo:
        if len(self.repos) >= MAX_REPOS:
            raise HubError(429, "too many repos on this test server")
        repo = Repo(repo_id, private)
        initial = {".gitattributes": Blob(b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n", False)}
        repo.branches["main"] = self.new_commit(repo, None, initial, "initial commit")
        self.repos[repo_id] = repo
        return repo

    # -- test hooks (call from the test thread)
    def seed_repo(self, repo_id: str, files: dict[str, bytes], *, private: bool = False, branch: str = "main") -> str:
        with self.lock:
            repo = self.repos.get(repo_id) or self.create(repo_id, private)
            if branch not in repo.branches:
                repo.branches[branch] = repo.branches["main"]
            head = repo.branches[branch]
            tree = dict(repo.commits[head].files)
            tree.update({p: Blob(d, len(d) >= self.lfs_threshold) for p, d in files.items()})
            repo.branches[branch] = self.new_commit(repo, head, tree, "seed")
            return repo.branches[branch]

    def inject_file(self, repo_id: str, path: str, data: bytes, *, branch: str = "main") -> str:
        """Commit a file under any name, even one the real Hub refuses (a hostile mirror)."""
        return self.seed_repo(repo_id, {path: data}, branch=branch)

    def create_tag(self, repo_id: str, tag: str, rev: str = "main") -> str:
        with self.lock:
            repo = self.repos[repo_id]
            repo.tags[tag] = repo.resolve(rev)
            return repo.tags[tag]

    def files_at(self, repo_id: str, rev: str = "main") -> dict[str, bytes]:
        with self.lock:
            repo = self.repos[repo_id]
            return {p: b.data for p, b in repo.commits[repo.resolve(rev)].files.items()}

    def commit_at(self, repo_id: str, rev: str = "main") -> Commit:
        with self.lock:
            repo = self.repos[repo_id]
            return repo.commits[repo.resolve(rev)]

    def commits(self, repo_id: str) -> int:
        with self.lock:
            return len(self.repos[repo_id].commits)

    def is_lfs(self, repo_id: str, path: str, rev: str = "main") -> bool:
        with self.lock:
            repo = self.repos[repo_id]
            return repo.commits[repo.resolve(rev)].files[path].lfs

    def fail_next(self, path_part: str, status: int, message: str, code: str | None = None) -> None:
        """The next request whose path contains path_part gets this error (code: the X-Error-Code)."""
        with self.lock:
            self.failures.append((path_part, status, message, code))

    def take_failure(self, path: str) -> HubError | None:
        with self.lock:
            for i, (part, status, message, code) in enumerate(self.failures):
                if part in path:
                    del self.failures[i]
                    return HubError(status, message, code)
        return None

    def fault(self, path_part: str, kind: str, n: int = 1, **params) -> None:
        assert kind in ("status", "stall_headers", "truncate", "corrupt", "stall_body", "reset", "redirect"), kind
        with self.lock:
            self.faults.append([path_part, kind, params, n])

    def take_fault(self, path: str, kinds: tuple[str, ...]) -> tuple[str, dict] | None:
        with self.lock:
            for f in self.faults:
                if f[0] in path and f[1] in kinds and f[3] > 0:
                    f[3] -= 1
                    return f[1], f[2]
        return None

    def move_branch_after_resolve(self, repo_id: str, branch: str, files: dict[str, bytes]) -> None:
        with self.lock:
            self.moves[(repo_id, branch)] = files

    def hold_downloads(self) -> None:
        self.downloads_open.clear()

    def release_downloads(self) -> None:
        self.downloads_open.set()

    def drop_next(self, kind: str, n: int = 1) -> None:
        assert kind in ("lfs_put", "commit", "download")
        with self.lock:
            self.drops[kind] = n

    def take_drop(self, kind: str) -> bool:
        with self.lock:
            if self.drops.get(kind, 0) > 0:
                self.drops[kind] -= 1
                return True
            return False


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "HubServer"

    def log_message(self, format, *args):  # noqa: A002 - silence the default stderr access log
        pass

    # -- plumbing
    @property
    def state(self) -> HubState:
        return self.server.state

    @property
    def base(self) -> str:
        return self.server.url

    def _read_body(self, *, drop_kind: str | None = None) -> bytes | None:
        """The request body (Content-Length or chunked), bounded. None if the connection was dropped on purpose."""
        length = self.headers.get("Content-Length")
        chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        drop = drop_kind is not None and self.state.take_drop(drop_kind)
        if length is not None:
            n = int(length)
            if n > MAX_BODY:
                raise HubError(413, "body too large for the test server")
            if drop:
                self.rfile.read(n // 2)
                self._drop()
                return None
            return self.rfile.read(n)
        if chunked:
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                out += self.rfile.read(size)
                self.rfile.readline()
                if len(out) > MAX_BODY:
                    raise HubError(413, "body too large for the test server")
                if drop:
                    self._drop()
                    return None
            return bytes(out)
        return b""

    def _send_half(self, data: bytes, headers: dict) -> None:
        """A 200 announcing the whole body, and only its first half sent."""
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()

    def _drop(self) -> None:
        """Go away mid-request: no response, connection reset."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str = "application/json", head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, status: int, obj, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(self, exc: HubError, head: bool = False) -> None:
        if self.state.echo_auth and self.headers.get("Authorization"):
            exc.message += f" (request sent Authorization: {self.headers['Authorization']})"
            self.state.echoed.append(exc.message)
        headers = {"X-Error-Message": exc.message, **exc.headers}
        if exc.code:
            headers["X-Error-Code"] = exc.code
        self._send(exc.status, json.dumps({"error": exc.message}).encode(), headers, head=head)

    def _auth(self, *, write: bool) -> bool:
        """True if a valid token came; 401 for a wrong one; anonymous reads allowed."""
        header = self.headers.get("Authorization")
        if header is None:
            if write:
                raise HubError(401, "You must be authenticated to perform this action")
            return False
        if header != f"Bearer {self.state.valid_token}":
            raise HubError(401, "Invalid credentials in Authorization header")
        return True

    def _repo(self, repo_id: str, authed: bool) -> Repo:
        repo = self.state.repos.get(repo_id)
        if repo is None or (repo.private and not authed):
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def _rev(self, repo: Repo, rev: str) -> str:
        sha = repo.resolve(rev)
        if sha is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return sha

    # -- dispatch
    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.state.requests.append((method, url.path))
        try:
            fault = self.state.take_fault(url.path, ("status", "stall_headers"))
            if fault is not None and fault[0] == "stall_headers":
                self.state.stopping.wait(fault[1].get("seconds", 60))
                self.close_connection = True
                return
            if fault is not None:
                params = fault[1]
                if method in ("POST", "PUT"):
                    self._body()
                raise HubError(params["status"], params.get("message", "injected"), params.get("code"),
                               params.get("headers"))
            failure = self.state.take_failure(url.path)
            if failure is not None:
                if method in ("POST", "PUT"):
                    self._body()
                raise failure
            self._route(method, parts, query)
        except HubError as exc:
            if method in ("POST", "PUT") and not getattr(self, "_body_read", False):
                self.close_connection = True  # body not consumed: do not reuse the connection
            self._error(exc, head=method == "HEAD")
        except (ConnectionError, BrokenPipeError):
            self.close_connection = True
        except (ValueError, KeyError, TypeError) as exc:  # malformed request: a 400, never a retried 500
            self.close_connection = True
            self._error(HubError(400, f"bad request: {exc}"), head=method == "HEAD")

    def _route(self, method: str, p: list[str], q: dict[str, str]) -> None:
        if p[:1] == ["api"]:
            if method == "POST" and p[1:] == ["repos", "create"]:
                return self._create_repo()
            if method == "POST" and p[1:] == ["validate-yaml"]:
                self._body()
                return self._json(200, {"errors": [], "warnings": []})
            if method == "GET" and p[1:] == ["whoami-v2"]:
                self._auth(write=True)
                return self._json(200, {"type": "user", "name": "tester", "orgs": []})
            if len(p) >= 4 and p[1] in ("models", "datasets"):  # one namespace: a test seeds each repo once
                repo_id, rest = f"{p[2]}/{p[3]}", p[4:]
                if method == "GET" and not rest:
                    return self._repo_info(repo_id, "main")
                if method == "GET" and rest[:1] == ["revision"] and len(rest) == 2:
                    return self._repo_info(repo_id, rest[1])
                if method == "POST" and rest[:1] == ["preupload"] and len(rest) == 2:
                    return self._preupload(repo_id, rest[1])
                if method == "POST" and rest[:1] == ["commit"] and len(rest) == 2:
                    return self._commit(repo_id, rest[1], q.get("create_pr") == "1")
                if method == "GET" and rest[:1] == ["tree"] and len(rest) >= 2:
                    return self._tree(repo_id, rest[1], "/".join(rest[2:]), q.get("recursive", "").lower() in ("true", "1"))
                if method == "GET" and rest == ["refs"]:
                    return self._refs(repo_id, q.get("include_prs") in ("1", "true", "True"))
                if method == "POST" and rest[:1] == ["branch"] and len(rest) == 2:
                    return self._create_branch(repo_id, rest[1])
                if method == "POST" and rest[:1] == ["tag"] and len(rest) == 2:
                    return self._create_tag(repo_id, rest[1])
        if method == "POST" and len(p) == 6 and p[1].endswith(".git") and p[2:] == ["info", "lfs", "objects", "batch"]:
            return self._lfs_batch(f"{p[0]}/{p[1][:-4]}")
        if method == "PUT" and len(p) == 2 and p[0] == "lfs-upload":
            return self._lfs_put(p[1])
        if method in ("GET", "HEAD") and len(p) >= 5 and p[2] == "resolve":
            return self._resolve(f"{p[0]}/{p[1]}", p[3], "/".join(p[4:]), head=method == "HEAD")
        if method in ("GET", "HEAD") and len(p) >= 6 and p[0] == "datasets" and p[3] == "resolve":
            return self._resolve(f"{p[1]}/{p[2]}", p[4], "/".join(p[5:]), head=method == "HEAD")
        raise HubError(404, f"no such endpoint on the test Hub: {method} {'/'.join(p)}")

    def _body(self, drop_kind: str | None = None) -> bytes | None:
        body = self._read_body(drop_kind=drop_kind)
        self._body_read = True
        return body

    # -- endpoints
    def _create_repo(self) -> None:
        body = json.loads(self._body() or b"{}")
        self._auth(write=True)
        if body.get("type", "model") != "model":
            raise HubError(400, "the test Hub only hosts model repos")
        name, org = body.get("name"), body.get("organization")
        if not name or not org or _bad_path(f"{org}/{name}") or len(f"{org}/{name}") > 96:
            raise HubError(400, f"invalid repo name {org}/{name}")
        repo_id = f"{org}/{name}"
        with self.state.lock:
            if repo_id in self.state.repos:
                return self._json(409, {"error": "You already created this model repo", "url": f"{self.base}/{repo_id}"},
                                  {"X-Error-Message": "You already created this model repo"})
            self.state.create(repo_id, body.get("visibility") == "private" or bool(body.get("private")))
        self._json(200, {"url": f"{self.base}/{repo_id}", "name": repo_id, "id": repo_id})

    def _repo_info(self, repo_id: str, rev: str) -> None:
        authed = self._auth(write=False)
        with self.state.lock:
            repo = self._repo(repo_id, authed)
            sha = self._rev(repo, rev)
            files = sorted(repo.commits[sha].files)
            move = self.state.moves.pop((repo_id, rev), None)
        if move is not None:  # answered with the old head; every later request sees the new one
            self.state.seed_repo(repo_id, move, branch=rev)
        self._json(200, {"id": repo_id, "modelId": repo_id, "sha": sha, "private": repo.private, "disabled": False,
                         "gated": False, "tags": [], "siblings": [{"rfilename": f} for f in files],
                         "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z"})

    def _preupload(self, repo_id: str, rev: str) -> None:
        body = json.loads(self._body() or b"{}")
        authed = self._auth(write=True)
        with self.state.lock:
            repo = self._repo(repo_id, authed)
            current = repo.commits[self._rev(repo, rev)].files
        out = []
        for f in body.get("files", []):
            lfs = int(f["size"]) >= self.state.lfs_threshold
            entry = {"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False}
            old = current.get(f["path"])
            if old is not None:
                entry["oid"] = old.sha256 if old.lfs else old.git_oid
            out.append(entry)
        self._json(200, {"files": out, "commitOid": None})

    def _lfs_batch(self, repo_id: str) -> None:
        body = json.loads(self._body() or b"{}")
        authed = self._auth(write=True)
        with self.state.lock:
            self._repo(repo_id, authed)
            stored = set(self.state.lfs)
        objects = []
        for obj in body.get("objects", []):
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in stored:
                entry["actions"] = {"upload": {"href": f"{self.base}/lfs-upload/{obj['oid']}", "expires_in": 3600}}
            objects.append(entry)
        self._json(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
                   {"Content-Type": "application/vnd.git-lfs+json"})

    def _lfs_put(self, oid: str) -> None:
        data = self._body(drop_kind="lfs_put")
        if data is None:
            return
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, "uploaded content does not match its sha256")
        with self.state.lock:
            self.state.lfs[oid] = data
            self.state.lfs_puts.append(oid)
        self._send(200)

    def _commit(self, repo_id: str, rev: str, create_pr: bool) -> None:
        raw = self._body(drop_kind="commit")
        if raw is None:
            return
        authed = self._auth(write=True)
        lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "commit payload must start with a header line")
        header = lines[0]["value"]
        with self.state.lock:
            repo = self._repo(repo_id, authed)
            if rev in repo.tags or (len(rev) == 40 and rev in repo.commits and rev not in repo.branches):
                raise HubError(400, f"cannot commit to {rev}: not a branch")
            head = self._rev(repo, rev)
            parent = header.get("parentCommit")
            if parent and parent != head and not create_pr:
                raise HubError(412, f"A commit has happened since {parent}. Please refresh and try again.")
            files = dict(repo.commits[parent if (parent and create_pr) else head].files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value", {})
                path = value.get("path", "")
                if _bad_path(path):
                    raise HubError(400, f"invalid path in commit: {path!r}")
                if key == "file":
                    files[path] = Blob(base64.b64decode(value["content"]), False)
                elif key == "lfsFile":
                    data = self.state.lfs.get(value["oid"])
                    if data is None:
                        raise HubError(400, f"LFS object {value['oid']} for {path} was never uploaded")
                    files[path] = Blob(data, True)
                elif key == "deletedFile":
                    if path not in files:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                    del files[path]
                elif key == "deletedFolder":
                    for name in [f for f in files if f.startswith(path.rstrip("/") + "/")]:
                        del files[name]
                else:
                    raise HubError(400, f"unsupported commit operation {key!r}")
            sha = self.state.new_commit(repo, head, files, header.get("summary", ""), header.get("description", ""))
            out = {"success": True, "commitOid": sha, "commitUrl": f"{self.base}/{repo_id}/commit/{sha}"}
            if create_pr:
                num = max(repo.prs, default=0) + 1
                repo.prs[num] = sha
                out["pullRequestUrl"] = f"{self.base}/{repo_id}/discussions/{num}"
            elif rev.startswith("refs/pr/"):
                repo.prs[int(rev[8:])] = sha
            else:
                repo.branches[rev.removeprefix("refs/heads/")] = sha
        self._json(200, out)

    def _tree(self, repo_id: str, rev: str, prefix: str, recursive: bool) -> None:
        authed = self._auth(write=False)
        with self.state.lock:
            repo = self._repo(repo_id, authed)
            files = repo.commits[self._rev(repo, rev)].files
        base = prefix.rstrip("/") + "/" if prefix else ""
        if prefix and not any(f.startswith(base) for f in files):
            raise HubError(404, f"{prefix} does not exist", "EntryNotFound")
        entries, dirs = [], set()
        for path in sorted(files):
            if not path.startswith(base):
                continue
            rel = path[len(base):].split("/")
            for i in range(1, len(rel)):
                d = base + "/".join(rel[:i])
                if (recursive or i == 1) and d not in dirs:
                    dirs.add(d)
                    entries.append({"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0})
            if len(rel) > 1 and not recursive:
                continue
            blob = files[path]
            entry = {"type": "file", "path": path, "size": len(blob.data), "oid": blob.git_oid}
            if blob.lfs:
                entry["lfs"] = {"oid": blob.sha256, "size": len(blob.data), "pointerSize": len(lfs_pointer(blob.sha256, len(blob.data)))}
            entries.append(entry)
        self._json(200, entries)

    def _refs(self, repo_id: str, include_prs: bool) -> None:
        authed = self._auth(write=False)
        with self.state.lock:
            repo = self._repo(repo_id, authed)
            out = {"branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": s} for n, s in repo.branches.items()],
                   "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": s} for n, s in repo.tags.items()],
                   "converts": []}
            if include_prs:
                out["pullRequests"] = [{"name": f"refs/pr/{n}", "ref": f"refs/pr/{n}", "targetCommit": s}
                                       for n, s in repo.prs.items()]
        self._json(200, out)

    def _create_branch(self, repo_id: str, branch: str) -> None:
        body = json.loads(self._body() or b"{}")
        authed = self._auth(write=True)
        if _bad_path(branch) or branch.startswith("refs/"):
            raise HubError(400, f"Invalid reference for a branch: {branch}")
        with self.state.lock:
            repo = self._repo(repo_id, authed)
            if branch in repo.branches:
                raise HubError(409, f"Reference already exists: refs/heads/{branch}")
            repo.branches[branch] = self._rev(repo, body.get("startingPoint") or "main")
        self._json(200, {})

    def _create_tag(self, repo_id: str, rev: str) -> None:
        body = json.loads(self._body() or b"{}")
        authed = self._auth(write=True)
        with self.state.lock:
            repo = self._repo(repo_id, authed)
            tag = body.get("tag", "")
            if not tag or _bad_path(tag):
                raise HubError(400, f"invalid tag name {tag!r}")
            if tag in repo.tags:
                raise HubError(409, f"Tag already exists: {tag}")
            repo.tags[tag] = self._rev(repo, rev)
        self._json(200, {})

    def _resolve(self, repo_id: str, rev: str, path: str, *, head: bool) -> None:
        authed = self._auth(write=False)
        with self.state.lock:
            repo = self._repo(repo_id, authed)
            sha = self._rev(repo, rev)
            blob = repo.commits[sha].files.get(path)
        if blob is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if blob.lfs:
            headers.update({"ETag": f'"{blob.git_oid}"', "X-Linked-Etag": f'"{blob.sha256}"',
                            "X-Linked-Size": str(len(blob.data))})
        else:
            headers["ETag"] = f'"{blob.git_oid}"'
        data, status = blob.data, 200
        if head and self.state.take_fault(f"{repo_id}/{path}", ("truncate",)):  # the short size announced too
            headers["X-Linked-Size"] = str(len(data) * 3 // 4)
            data = data[: len(data) * 3 // 4]
        redirect = self.state.take_fault(f"{repo_id}/{path}", ("redirect",))
        if redirect is not None:
            headers["Location"] = redirect[1]["to"] + "/" + path
            return self._send(302, b"", headers, head=head)
        if not head and blob.lfs:
            self.state.downloads_open.wait(timeout=60)
        body_fault = None if head else self.state.take_fault(f"{repo_id}/{path}", ("truncate", "corrupt", "stall_body",
                                                                                   "reset"))
        if body_fault is not None and body_fault[0] in ("truncate", "corrupt"):
            data = bytearray(data)
            if body_fault[0] == "corrupt":
                data[len(data) // 2] ^= 0x01
            else:
                del data[len(data) * 3 // 4:]
            if self.headers.get("Range"):  # answered whole: the server ignores the Range (as some CDNs do)
                return self._send(200, bytes(data), headers, content_type="application/octet-stream")
            data = bytes(data)
        elif body_fault is not None:  # stall_body, reset: half the body, then silence or a TCP reset
            self._send_half(data, headers)
            if body_fault[0] == "stall_body":
                self.state.stopping.wait(body_fault[1].get("seconds", 60))
                self.close_connection = True
                return
            time.sleep(0.2)  # the client has read the half: the reset comes while it waits for the rest
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.connection.close()
            return
        if not head and blob.lfs and self.state.take_drop("download"):
            self._send_half(data, headers)
            return self._drop()
        rng = self.headers.get("Range")
        if rng and not head:
            self.state.ranges.append((path, rng))
        if rng and rng.startswith("bytes="):
            start_s, _, end_s = rng[6:].partition("-")
            start = int(start_s or 0)
            end = int(end_s) if end_s else len(data) - 1
            if start >= len(data) and data:
                raise HubError(416, "range not satisfiable")
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start:end + 1], 206
        self._send(status, data, headers, content_type="application/octet-stream", head=head)


class LoopbackServer(ThreadingHTTPServer):
    """An HTTP server on a free loopback port, served from a daemon thread between start() and stop()."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, handler):
        super().__init__(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)


class HubServer(LoopbackServer):
    request_queue_size = 64

    def __init__(self, *, valid_token: str, lfs_threshold: int = 64 * 1024):
        self.state = HubState(valid_token, lfs_threshold)
        super().__init__(HubHandler)

    def stop(self) -> None:
        self.state.stopping.set()
        super().stop()

    @property
    def echo_auth(self) -> bool:
        return self.state.echo_auth

    @echo_auth.setter
    def echo_auth(self, value: bool) -> None:
        self.state.echo_auth = value

    def __getattr__(self, name):  # test hooks live on the state
        if name in ("seed_repo", "inject_file", "create_tag", "files_at", "commit_at", "commits", "is_lfs",
                    "drop_next", "lfs_puts", "requests", "repos", "fail_next", "move_branch_after_resolve",
                    "echoed", "hold_downloads", "release_downloads", "fault", "ranges"):
            return getattr(self.state, name)
        raise AttributeError(name)


class BlobServer(LoopbackServer):
    """The other end of a redirect (a CDN on another port): serves `files` by name (HEAD, GET, Range) and
    keeps every Authorization header it received."""

    def __init__(self, files: dict[str, bytes]):
        files_, seen = files, []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002
                pass

            def do_HEAD(self):
                self.do_GET(head=True)

            def do_GET(self, head: bool = False):
                seen.append(self.headers.get("Authorization"))
                data = files_.get(urlsplit(self.path).path.lstrip("/"))
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status, rng = 200, self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[6:].partition("-")[0] or 0)
                    data, status = data[start:], 206
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

        super().__init__(Handler)
        self.authorization = seen
