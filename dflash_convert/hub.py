"""Hugging Face Hub: resolve `org/name` sources into the local cache, pull, write the model card, push.

Everything goes through the real `huggingface_hub` client. Settings users expect from the `hf` CLI
are read at call time (not at import, as the client does): HF_ENDPOINT, HF_HUB_CACHE / HF_HOME,
HF_HUB_OFFLINE. Token precedence is --token > HF_TOKEN > the stored token: we pass `token=None`
unless the user gave one and the client does the rest. Tokens never appear in our messages.

Downloads fetch only what a draft (or a target) needs; pickle weights only when asked. Remote
file names are checked before anything is written, so a hostile endpoint cannot place a file
outside the snapshot or output directory. A push is ONE commit (create_commit), so a failed
upload leaves the repo as it was.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .checkpoint import CONFIG_NAME, open_checkpoint, read_json
from .configs import ConversionRecord, DraftSpec
from .errors import DFlashError, UsageError
from .safetensors_io import INDEX_NAME

README_NAME = "README.md"
RECORD_NAME = "conversion.json"
DRAFT_PATTERNS = [CONFIG_NAME, "*.safetensors", INDEX_NAME, README_NAME, RECORD_NAME]
TARGET_PATTERNS = ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja"]
PICKLE_PATTERNS = ["*.bin", "pytorch_model.bin.index.json", "*.pt", "*.pth"]
# Remote files a push replaces as a set: a stale shard or index left beside new weights would be loaded.
WEIGHT_PATTERNS = ["*.safetensors", INDEX_NAME, *PICKLE_PATTERNS, RECORD_NAME]
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
SHA40 = re.compile(r"^[0-9a-f]{40}$")
CARD_BEGIN = "<!-- dflash-convert:begin (generated; replaced on every push, edit outside this section) -->"
CARD_END = "<!-- dflash-convert:end -->"


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


# ----------------------------------------------------------------------------- settings read at call time

def _endpoint(endpoint: str | None) -> str:
    from huggingface_hub import constants

    return (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _cache_dir() -> str:
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return constants.HF_HUB_CACHE


def _offline() -> bool:
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE")
    if value is not None:
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(constants.HF_HUB_OFFLINE)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _api(endpoint: str, token: str | None):
    from huggingface_hub import HfApi

    from . import __version__

    return HfApi(endpoint=endpoint, token=token, library_name="dflash-convert", library_version=__version__)


# ----------------------------------------------------------------------------- errors

def _one_line(text: str, token: str | None) -> str:
    text = " ".join(str(text).split())
    for secret in filter(None, (token, os.environ.get("HF_TOKEN"))):
        text = text.replace(secret, "***")
    return text


def _hub_error(exc: Exception, *, repo_id: str, revision: str | None, endpoint: str, token: str | None,
               action: str) -> DFlashError:
    """One line naming the repo and revision for whatever the client raised."""
    import httpx2
    from huggingface_hub import errors as e
    from huggingface_hub.utils import OfflineModeIsEnabled

    where = f"{repo_id}@{revision or 'main'}"
    # The client wraps some failures (e.g. an LFS upload giving up) in a RuntimeError: use the cause.
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, (e.HfHubHTTPError, httpx2.TransportError, OfflineModeIsEnabled)):
            exc = cause
            break
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, e.HFValidationError):
        return UsageError(f"invalid Hub repo id or revision {where!r}: {_one_line(exc, token)}")
    if isinstance(exc, e.RevisionNotFoundError):
        return DFlashError(f"revision {revision or 'main'!r} not found in Hub repo {repo_id} ({endpoint})")
    if isinstance(exc, e.GatedRepoError):
        return DFlashError(f"Hub repo {repo_id} is gated: request access on its page, then pass a token with access")
    if isinstance(exc, e.RepositoryNotFoundError):
        return DFlashError(f"Hub repo {repo_id} not found at {endpoint} (or it is private and the token has no access)")
    if isinstance(exc, e.RemoteEntryNotFoundError):
        return DFlashError(f"{where}: file not found on the Hub ({_one_line(getattr(exc, 'server_message', '') or '', token)})")
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
        detail = _one_line(getattr(exc, "server_message", None) or exc.response.reason_phrase or "", token)
        return DFlashError(f"Hub request failed while trying to {action} {where}: HTTP {status} {detail}".rstrip())
    if isinstance(exc, (OfflineModeIsEnabled, e.LocalEntryNotFoundError, e.RevisionResolutionError,
                        e.IncompleteSnapshotError)):
        if _offline():
            return DFlashError(f"{where} is not (completely) in the local cache {_cache_dir()} and HF_HUB_OFFLINE=1 "
                               "forbids downloading it")
        return DFlashError(f"cannot reach the Hub at {endpoint} to {action} {where}, and it is not in the local "
                           f"cache {_cache_dir()}")
    if isinstance(exc, httpx2.TransportError):
        if action == "push to":
            return DFlashError(f"connection to the Hub at {endpoint} lost while pushing to {where} "
                               f"({type(exc).__name__}); a Hub commit is all-or-nothing: rerun the push")
        return DFlashError(f"cannot reach the Hub at {endpoint} to {action} {where} ({type(exc).__name__})")
    if isinstance(exc, OSError):
        return DFlashError(f"local I/O error while trying to {action} {where}: {_one_line(exc, token)}")
    return DFlashError(f"failed to {action} {where}: {type(exc).__name__}: {_one_line(exc, token)}")


def _close_progress_bars() -> None:
    """End the client's interrupted tqdm bars, so the error line starts on a line of its own."""
    try:
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()
    except Exception:  # noqa: BLE001 - cosmetic only
        pass


def _hub_call(fn, *, repo_id: str, revision: str | None, endpoint: str, token: str | None, action: str):
    """Run fn(); any client error becomes one DFlashError line (our own DFlashErrors pass through)."""
    try:
        return fn()
    except DFlashError:
        raise
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - the client raises many types; each becomes one line
        _close_progress_bars()
        raise _hub_error(exc, repo_id=repo_id, revision=revision, endpoint=endpoint, token=token,
                         action=action) from None


# ----------------------------------------------------------------------------- resolve / pull

def is_hub_id(source: str) -> bool:
    """`org/name` as the Hub spells repo ids (no local-path look: no leading ./, /, ~, no '..')."""
    return bool(HUB_ID.match(source)) and ".." not in source and "--" not in source and not source.endswith(".git")


def unsafe_repo_path(name: str) -> bool:
    """A remote file name that would land outside the directory it is written into."""
    if not name or "\\" in name or "\0" in name or name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return True
    return any(part in ("", ".", "..") for part in name.split("/"))


def _patterns(*, for_target: bool, allow_pickle: bool, config_only: bool) -> list[str]:
    if config_only:
        return [CONFIG_NAME]
    patterns = list(DRAFT_PATTERNS)
    if for_target:
        patterns += TARGET_PATTERNS
    if allow_pickle:
        patterns += PICKLE_PATTERNS
    return patterns


def _download(repo_id: str, *, revision: str | None, token: str | None, endpoint: str | None, patterns: list[str],
              local_dir: Path | None, need_weights: bool, allow_pickle: bool) -> Resolved:
    from huggingface_hub import RepoFile, snapshot_download
    from huggingface_hub.utils import filter_repo_objects

    endpoint = _endpoint(endpoint)
    cache_dir, offline = _cache_dir(), _offline()
    api = _api(endpoint, token)
    where = f"{repo_id}@{revision or 'main'}"
    call = dict(repo_id=repo_id, revision=revision, endpoint=endpoint, token=token, action="download")

    # Resolve the revision once (and record it in the cache's refs/, which offline runs read back).
    resolved = _hub_call(lambda: api.resolve_revision(repo_id, revision=revision, cache_dir=cache_dir,
                                                      local_files_only=offline), **call)
    sha = resolved.resolved
    if not offline:
        listing = _hub_call(lambda: [f.path for f in api.list_repo_tree(repo_id, revision=sha, recursive=True)
                                     if isinstance(f, RepoFile)], **call)
        wanted = list(filter_repo_objects(listing, allow_patterns=patterns))
        bad = [name for name in wanted if unsafe_repo_path(name)]
        if bad:
            raise DFlashError(f"Hub repo {where} ({sha[:12]}) lists a file whose name escapes the download "
                              f"directory: {bad[0]!r}; nothing was downloaded")
        if CONFIG_NAME not in wanted:
            raise DFlashError(f"Hub repo {where} ({sha[:12]}) has no {CONFIG_NAME}: not a model checkpoint")
        if need_weights and not any(n.endswith(".safetensors") for n in wanted) and not allow_pickle \
                and any(n.endswith((".bin", ".pt", ".pth")) for n in listing):
            raise DFlashError(f"Hub repo {where} has only pickle weights (.bin/.pt); they can run code when loaded. "
                              "Pass --allow-pickle to fetch them and load with torch.load(weights_only=True)")
        _say(f"fetching {len(wanted)} files of {where} ({sha[:12]}) from {endpoint}")
    folder = _hub_call(lambda: snapshot_download(repo_id, revision=resolved, cache_dir=cache_dir, local_dir=local_dir,
                                                 allow_patterns=patterns, token=token, endpoint=endpoint,
                                                 local_files_only=offline, library_name="dflash-convert"), **call)
    return Resolved(path=Path(folder), repo_id=repo_id, revision=revision or "main", commit_sha=sha)


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
    return _download(source, revision=revision, token=token, endpoint=endpoint,
                     patterns=_patterns(for_target=for_target, allow_pickle=allow_pickle, config_only=config_only),
                     local_dir=None, need_weights=not config_only, allow_pickle=allow_pickle)


def pull(repo_id: str, out_dir: str | Path | None = None, *, revision: str | None = None, token: str | None = None,
         allow_pickle: bool = False, endpoint: str | None = None) -> Resolved:
    """Download a draft checkpoint into the cache, or materialize it as plain files in out_dir."""
    if not is_hub_id(repo_id):
        raise UsageError(f"not a Hub repo id (org/name): {repo_id!r}")
    local_dir = None
    if out_dir is not None:
        local_dir = Path(out_dir).expanduser()
        if local_dir.exists() and not local_dir.is_dir():
            raise DFlashError("output exists and is not a directory", file=local_dir)
    return _download(repo_id, revision=revision, token=token, endpoint=endpoint,
                     patterns=_patterns(for_target=False, allow_pickle=allow_pickle, config_only=False),
                     local_dir=local_dir, need_weights=True, allow_pickle=allow_pickle)


# ----------------------------------------------------------------------------- model card

def _causality(spec: DraftSpec) -> str:
    if all(spec.layer_causal):
        return "causal within the block (every layer)"
    if not any(spec.layer_causal):
        return "non-causal within the block (every layer attends to the whole block)"
    kinds = ", ".join(f"{i}: {'causal' if c else 'non-causal'}" for i, c in enumerate(spec.layer_causal))
    return f"mixed per layer ({kinds})"


def _verifier_id(spec: DraftSpec) -> str | None:
    name = spec.verifier.name_or_path if spec.verifier else None
    return name if name and is_hub_id(name) and not Path(name).exists() else None


def _render_validation(validation: dict[str, Any]) -> list[str]:
    lines = ["### Validation", ""]
    checks = validation.get("checks")
    scalars = {k: v for k, v in validation.items() if k != "checks" and not isinstance(v, (dict, list))}
    for key, value in scalars.items():
        lines.append(f"- {key.replace('_', ' ')}: {value}")
    if isinstance(checks, list) and checks:
        counts: dict[str, int] = {}
        for c in checks:
            counts[str(c.get("status"))] = counts.get(str(c.get("status")), 0) + 1
        lines.append("- checks: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        notable = [c for c in checks if c.get("status") not in ("pass", "skip")]
        if notable:
            lines += ["", "| check | status | message |", "|---|---|---|"]
            for c in notable:
                message = str(c.get("message", "")).replace("|", "\\|")
                lines.append(f"| {c.get('name')} | {c.get('status')} | {message} |")
    return lines + [""]


def _generated_section(spec: DraftSpec, repo_id: str, validation: dict[str, Any] | None,
                       record: ConversionRecord | None) -> str:
    target = _verifier_id(spec) or "<TARGET_MODEL>"
    block = spec.block_size
    fmt = {"speculators": "speculators (vLLM speculators library layout)",
           "hf": "Hugging Face / z-lab (flat Qwen3 config with DFlash keys)"}[spec.source_format]
    vocab = (f"pruned: the draft predicts {spec.draft_vocab_size} of the target's {spec.vocab_size} tokens "
             "(mapped back through d2t)" if spec.is_pruned_vocab else f"full target vocabulary ({spec.vocab_size} tokens)")
    rows = [
        ("format", fmt),
        ("variant", spec.variant),
        ("target model", f"`{target}`" if _verifier_id(spec) else "not recorded in config.json"),
        ("block size", f"{block} (up to {block - 1} speculative tokens per step)" if block else "not recorded"),
        ("target layer ids", f"{spec.target_layer_ids} (0-based target layers whose outputs feed the draft)"
         if spec.target_layer_ids is not None else "not recorded"),
        ("mask token id", str(spec.mask_token_id) if spec.mask_token_id is not None else "not recorded"),
        ("attention", _causality(spec)),
        ("draft layers", f"{spec.num_layers} x (hidden {spec.hidden_size}, {spec.num_heads} heads, "
                         f"{spec.num_kv_heads} KV heads, head dim {spec.head_dim})"),
        ("vocabulary", vocab),
        ("dtype", spec.dtype or "not recorded"),
    ]
    lines = [CARD_BEGIN, "", "## DFlash draft", "",
             f"A [DFlash](https://github.com/z-lab/dflash) block-diffusion draft model for speculative decoding "
             f"of `{target}`: it proposes a block of tokens in one forward pass from the target's hidden states, "
             "and the target verifies them.", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines.append("")
    if spec.variant != "dflash":
        lines += [f"This is a `{spec.variant}` draft: the commands below are those for DFlash drafts; check that "
                  f"your engine version supports `{spec.variant}`.", ""]
    num_spec = f"{block - 1}" if block else "<BLOCK_SIZE - 1>"
    draft_tokens = f"{block}" if block else "<BLOCK_SIZE>"
    non_causal = not all(spec.layer_causal)
    lines += ["### Serve with vLLM", "", "```bash", f"vllm serve {target} \\",
              f"  --speculative-config '{{\"method\": \"dflash\", \"model\": \"{repo_id}\", "
              f"\"num_speculative_tokens\": {num_spec}}}'" + (" \\" if non_causal else ""),
              *(["  --attention-backend FLASH_ATTN"] if non_causal else []), "```", ""]
    if non_causal:
        lines += ["The draft attends non-causally inside a block: vLLM needs an attention backend with non-causal "
                  "support, e.g. `FLASH_ATTN` or `FLEX_ATTENTION` (`--attention-backend`); backends without it are "
                  "refused or give wrong drafts.", ""]
    lines += ["### Serve with SGLang", "", "```bash", "python -m sglang.launch_server \\",
              f"  --model-path {target} \\", "  --speculative-algorithm DFLASH \\",
              f"  --speculative-draft-model-path {repo_id} \\", f"  --speculative-num-draft-tokens {draft_tokens}",
              "```", "",
              f"`--speculative-num-draft-tokens` is the block size ({draft_tokens}) for DFlash in SGLang; "
              f"vLLM's `num_speculative_tokens` is the block size minus one ({num_spec}).", ""]
    if validation:
        lines += _render_validation(validation)
    if record is not None:
        rev = f" at `{record.source_revision}`" if record.source_revision else ""
        lines += ["### Provenance", "",
                  f"Converted from the {record.source_format} format{rev} to {record.destination_format} by "
                  f"{record.tool} {record.tool_version}; `conversion.json` lists every input file's sha256 and "
                  "every tensor kept, renamed, dropped or added.", ""]
    lines.append(CARD_END)
    return "\n".join(lines) + "\n"


def _split_front_matter(text: str, file: str) -> tuple[dict[str, Any], str]:
    import yaml

    if not text.startswith("---"):
        return {}, text
    m = re.match(r"^---[ \t]*\r?\n(.*?)^---[ \t]*(?:\r?\n|$)", text, re.S | re.M)
    if not m:
        raise DFlashError("YAML front matter opened with --- is never closed", file=file)
    try:
        meta = yaml.safe_load(m.group(1)) or {}
    except yaml.YAMLError as exc:
        raise DFlashError(f"YAML front matter does not parse: {' '.join(str(exc).split())}", file=file) from None
    if not isinstance(meta, dict):
        raise DFlashError("YAML front matter is not a mapping", file=file)
    return meta, text[m.end():]


def model_card(spec: DraftSpec, *, repo_id: str, validation: dict[str, Any] | None = None,
               existing: str | None = None, record: ConversionRecord | None = None) -> str:
    """README.md text: front matter (library_name, base_model, tags) + a generated section.

    With `existing` (the current README), user text outside the generated section and user front
    matter keys are kept; only the section between the markers is replaced.
    """
    import yaml

    meta, body = _split_front_matter(existing or "", README_NAME)
    meta.setdefault("library_name", "speculators" if spec.source_format == "speculators" else "transformers")
    if _verifier_id(spec):
        meta.setdefault("base_model", _verifier_id(spec))
    tags = meta.get("tags") or []
    tags = [tags] if isinstance(tags, str) else list(tags)
    for tag in ("dflash", "speculative-decoding"):
        if tag not in tags:
            tags.append(tag)
    meta["tags"] = tags
    section = _generated_section(spec, repo_id, validation, record)
    if CARD_BEGIN.split(" (")[0] in body and CARD_END in body:
        start = body.index(CARD_BEGIN.split(" (")[0])
        end = body.index(CARD_END) + len(CARD_END)
        body = body[:start] + section.rstrip("\n") + body[end:]
    elif body.strip():
        body = body.rstrip("\n") + "\n\n" + section
    else:
        body = f"\n# {repo_id.split('/')[-1]}\n\n" + section
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    return f"---\n{front}---\n{body if body.startswith(chr(10)) else chr(10) + body}"


def write_model_card(directory: str | Path, spec: DraftSpec | None = None, *, repo_id: str,
                     validation: dict[str, Any] | None = None, existing: str | None = None) -> Path:
    """Write or update directory/README.md (atomically; a symlinked README is replaced, not written through).

    The README updated is the local one, else `existing` (e.g. the README already on the Hub).
    """
    directory = Path(directory)
    if spec is None:
        spec = open_checkpoint(directory).spec
    readme = directory / README_NAME
    if readme.exists():
        existing = readme.read_text(encoding="utf-8")
    record = None
    if (directory / RECORD_NAME).exists():
        try:
            record = ConversionRecord.model_validate(read_json(directory / RECORD_NAME))
        except Exception:  # noqa: BLE001 - a foreign conversion.json only loses the provenance paragraph
            record = None
    text = model_card(spec, repo_id=repo_id, validation=validation, existing=existing, record=record)
    tmp = directory / f".{README_NAME}.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, readme)
    return readme


# ----------------------------------------------------------------------------- push

def _local_files(directory: Path) -> list[str]:
    from huggingface_hub.utils import filter_repo_objects
    from huggingface_hub.utils._paths import DEFAULT_IGNORE_PATTERNS

    names = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    return [n for n in filter_repo_objects(names, ignore_patterns=DEFAULT_IGNORE_PATTERNS)
            if not n.startswith(f".{README_NAME}")]


def push(directory: str | Path, repo_id: str, *, revision: str | None = None, private: bool = False,
         commit_message: str | None = None, commit_description: str | None = None, create_pr: bool = False,
         token: str | None = None, endpoint: str | None = None, model_card: bool = True,
         validation: dict[str, Any] | None = None) -> PushResult:
    """Upload a checkpoint directory to `repo_id` in ONE commit (creating the repo and branch if needed).

    Writes/updates directory/README.md first (model_card=True, when the directory opens as a
    draft). Remote weight files absent locally are deleted in the same commit, so no stale shard
    or index survives beside the new weights.
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete
    from huggingface_hub.utils import filter_repo_objects

    from . import __version__

    directory = Path(directory)
    if not directory.is_dir():
        raise DFlashError("not a directory", file=directory)
    if not is_hub_id(repo_id):
        raise UsageError(f"not a Hub repo id (org/name): {repo_id!r}")
    if revision is not None and (SHA40.match(revision) or unsafe_repo_path(revision)):
        raise UsageError(f"--revision must name a branch to push to, got {revision!r}")
    endpoint = _endpoint(endpoint)
    if _offline():
        raise DFlashError(f"HF_HUB_OFFLINE=1: cannot push {directory} to {repo_id}")
    if not _local_files(directory):
        raise DFlashError("nothing to push: the directory is empty", file=directory)

    api = _api(endpoint, token)
    branch = revision or "main"
    call = dict(repo_id=repo_id, revision=branch, endpoint=endpoint, token=token, action="push to")
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
        _say(f"warning: {repo_id} already exists and is public; --private does not change an existing repo")
    remote = [s.rfilename for s in info.siblings or []]
    if model_card and (directory / CONFIG_NAME).exists():
        remote_readme = None
        if not (directory / README_NAME).exists() and README_NAME in remote:  # keep what users wrote on the Hub
            readme_path = _hub_call(lambda: api.hf_hub_download(repo_id, README_NAME, revision=info.sha,
                                                                cache_dir=_cache_dir()), **call)
            remote_readme = Path(readme_path).read_text(encoding="utf-8")
        readme = write_model_card(directory, repo_id=repo_id, validation=validation, existing=remote_readme)
        _say(f"model card written: {readme}")
    files = _local_files(directory)
    local = set(files)
    stale = [n for n in filter_repo_objects(remote, allow_patterns=WEIGHT_PATTERNS) if n not in local]
    operations = [CommitOperationDelete(path_in_repo=n) for n in stale]
    operations += [CommitOperationAdd(path_in_repo=n, path_or_fileobj=str(directory / n)) for n in files]
    size = sum((directory / n).stat().st_size for n in files)
    _say(f"pushing {len(files)} files ({size / 1e6:.1f} MB) from {directory} to {repo_id}@{branch}"
         + (" as a pull request" if create_pr else "") + (f", deleting {len(stale)} stale files" if stale else ""))
    message = commit_message or f"Upload DFlash draft with dflash-convert {__version__}"
    commit = _hub_call(lambda: api.create_commit(repo_id, operations=operations, commit_message=message,
                                                 commit_description=commit_description, revision=revision,
                                                 create_pr=create_pr, parent_commit=info.sha), **call)
    changed = commit.oid != info.sha
    if not changed:
        _say(f"{repo_id}@{branch} already has these files: nothing to commit")
    return PushResult(commit_url=commit.commit_url, pr_url=commit.pr_url, commit_sha=commit.oid,
                      repo_url=str(repo_url), repo_id=repo_id, revision=branch, changed=changed)
