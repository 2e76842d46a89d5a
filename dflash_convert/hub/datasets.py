"""Standard benchmark prompt sets, pulled from Hub dataset repos through the same client path as model
files: the revision resolved once to a commit (recorded in the cache, which offline runs read back),
remote names checked before anything is written, each downloaded file checked against the hash the Hub
lists for it (sha256 for LFS files, the git blob id otherwise), the client's errors as one line.

The table is data: which repo, which file(s) of the split, which field holds the prompt and how the
prompt is worded around it (as z-lab's DFlash benchmark words each set; MT-Bench: its first turn, or its
second as a chat whose first answer the target gives, validate/prepare.py). Each
entry pins `main` unless a commit is given (`--dataset NAME@REVISION`): the report records the commit
the revision resolved to, so a run can be repeated exactly.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.hub.client import pin_revision
from dflash_convert.hub.transport import Say, hub_call
from dflash_convert.io.reading import read_bounded

MAX_DATASET_FILE_BYTES = 256 << 20  # benchmark splits are a few MB
REASON = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class PromptDataset:
    repo_id: str
    files: str  # a glob over the repo's paths: the split's file(s), read in sorted order
    field: str  # the column holding the prompt (a list: its first turn)
    template: str = "{prompt}"  # the prompt's wording around the field's text
    revision: str = "main"
    extra: str | None = None  # a second column, appended as "\n\nInput:\n<it>" when not empty (Alpaca's `input`)
    turn: int = 1  # multi-turn sets: the turn measured; the turns before it are answered by the target


DATASETS: dict[str, PromptDataset] = {
    "gsm8k": PromptDataset("openai/gsm8k", "main/test-*.parquet", "question", "{prompt}" + REASON),
    "math500": PromptDataset("HuggingFaceH4/MATH-500", "test.jsonl", "problem", "{prompt}" + REASON),
    "humaneval": PromptDataset("openai/openai_humaneval", "openai_humaneval/test-*.parquet", "prompt",
                               "Write a solution to the following problem and make sure that it passes the "
                               "tests:\n```python\n{prompt}\n```"),
    "mt-bench": PromptDataset("HuggingFaceH4/mt_bench_prompts", "data/train-*.parquet", "prompt"),
    # the second turn after the target's own answer to the first (z-lab's benchmark feeds it back the same way)
    "mt-bench-2": PromptDataset("HuggingFaceH4/mt_bench_prompts", "data/train-*.parquet", "prompt", turn=2),
    # z-lab's benchmark: the sanitized config's test split, its `prompt` as the whole user turn
    "mbpp": PromptDataset("google-research-datasets/mbpp", "sanitized/test-*.parquet", "prompt"),
    "alpaca": PromptDataset("tatsu-lab/alpaca", "data/train-*.parquet", "instruction", extra="input"),
}


@dataclass
class DatasetPrompts:
    name: str
    prompts: list[Any]  # text, or chat messages for a later turn of a multi-turn set
    repo_id: str
    revision: str
    commit_sha: str
    files: list[str]
    total: int  # rows in the split, before --num-prompts

    @property
    def source(self) -> str:
        return (f"{self.repo_id}@{self.commit_sha[:12]} {', '.join(self.files)} ({len(self.prompts)} of "
                f"{self.total} rows)")


def parse_dataset(spec: str) -> tuple[str, str | None]:
    """`NAME` or `NAME@REVISION` -> (name, revision or None); an unknown name is a usage error listing them."""
    name, _, revision = spec.partition("@")
    if name not in DATASETS:
        raise UsageError(f"--dataset {name!r}: choose from {', '.join(DATASETS)} (optionally NAME@REVISION)")
    return name, revision or None


def dataset_prompts(spec: str, *, num_prompts: int | None = None, seed: int = 0, token: str | None = None,
                    endpoint: str | None = None, on_info: Say | None = None) -> DatasetPrompts:
    """The prompts of one table entry: downloaded (or read from the cache), verified, worded, and, with
    num_prompts, a sample of that many drawn with `seed` (the same rows every run); on_info gets the line
    saying what is fetched."""
    from huggingface_hub import snapshot_download

    name, revision = parse_dataset(spec)
    entry = DATASETS[name]
    repo = pin_revision(entry.repo_id, revision=revision or entry.revision, token=token, endpoint=endpoint,
                        repo_type="dataset", option=f"--dataset {name}@REVISION")
    where, sha = repo.where, repo.sha
    listed: dict[str, Any] = {}
    if repo.tree is not None:  # online
        listed = {f.path: f for f in repo.tree if fnmatch.fnmatchcase(f.path, entry.files)}
        repo.refuse_unsafe(listed)
        if not listed:
            raise DFlashError(f"{repo.label} has no file matching {entry.files!r}")
        if on_info is not None:
            on_info(f"fetching {len(listed)} file(s) of dataset {where} ({sha[:12]}) from {repo.api.endpoint}")
    folder = Path(hub_call(lambda: snapshot_download(entry.repo_id, repo_type="dataset", revision=sha,
                                                      allow_patterns=[entry.files], token=repo.token,
                                                      endpoint=repo.api.endpoint, local_files_only=repo.tree is None,
                                                      library_name="dflash-convert"), **repo.call))
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                   if p.is_file() and fnmatch.fnmatchcase(p.relative_to(folder).as_posix(), entry.files))
    if not files:
        raise DFlashError(f"Hub dataset {where} ({sha[:12]}): no file matching {entry.files!r} in the local cache")
    rows: list[Any] = []
    for rel in files:
        data = read_bounded(folder / rel, MAX_DATASET_FILE_BYTES, "a benchmark split")
        if rel in listed:
            _verify(data, listed[rel], f"{where}/{rel}")
        rows += [_worded(entry, row, f"{where}/{rel}", n) for n, row in enumerate(_rows(data, rel, entry), 1)]
    total = len(rows)
    if num_prompts is not None and num_prompts < total:
        rows = random.Random(seed).sample(rows, num_prompts)
    return DatasetPrompts(name=name, prompts=rows, repo_id=entry.repo_id, revision=repo.revision, commit_sha=sha,
                          files=files, total=total)


def _verify(data: bytes, remote, where: str) -> None:
    """The bytes against the hash the Hub listed: sha256 for an LFS file, the git blob id otherwise."""
    if remote.lfs is not None:
        wanted, got = remote.lfs.sha256, hashlib.sha256(data).hexdigest()
    else:
        wanted, got = remote.blob_id, hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    if wanted != got:
        raise DFlashError(f"{where}: the downloaded file does not match the hash the Hub lists ({got[:12]} != "
                          f"{wanted[:12]}); the cache holds a corrupt or altered copy: delete it and rerun")


def _rows(data: bytes, rel: str, entry: PromptDataset) -> list[dict[str, Any]]:
    """The rows of one split file (JSONL or Parquet), with only the columns the entry reads."""
    columns = [c for c in (entry.field, entry.extra) if c]
    if rel.endswith(".jsonl"):
        try:
            return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise DFlashError("not JSON lines", file=rel) from None
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DFlashError(f"reading {rel} needs pyarrow (pip install pyarrow)") from None
    try:
        return pq.read_table(io.BytesIO(data), columns=columns).to_pylist()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises its own error types for a bad file
        raise DFlashError(f"not a Parquet file with column(s) {columns} ({str(exc).splitlines()[0][:120]})",
                          file=rel) from None


def _worded(entry: PromptDataset, row: Any, where: str, n: int) -> Any:
    value = row.get(entry.field) if isinstance(row, dict) else None
    if entry.turn > 1:  # the turns up to the one measured, each earlier one answered by the target
        if not (isinstance(value, list) and len(value) >= entry.turn and all(isinstance(t, str) and t.strip()
                                                                               for t in value[:entry.turn])):
            raise DFlashError(f"row {n}: field `{entry.field}` has no turn {entry.turn} (a list of text turns)",
                              file=where)
        chat: list[dict[str, Any]] = []
        for t in value[:entry.turn - 1]:
            chat += [{"role": "user", "content": t}, {"role": "assistant", "content": None, "generate": True}]
        return chat + [{"role": "user", "content": value[entry.turn - 1]}]
    if isinstance(value, list) and value:  # multi-turn sets: the first user turn
        value = value[0]
    if not isinstance(value, str) or not value.strip():
        raise DFlashError(f"row {n}: field `{entry.field}` is not text", file=where)
    extra = row.get(entry.extra) if entry.extra else None
    if isinstance(extra, str) and extra.strip():
        value = f"{value}\n\nInput:\n{extra}"
    return entry.template.replace("{prompt}", value, 1)
