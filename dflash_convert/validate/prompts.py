"""Validation prompts: read from a file (bounded, typed) and tokenized with the target's own tokenizer
(never remote code); without prompts, a built-in set (text, or token ids when the target ships no
tokenizer)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

from dflash_convert.errors import DFlashError
from dflash_convert.io.reading import read_text
from dflash_convert.validate.options import MAX_PROMPT_TOKENS

BUILTIN_TEXT_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Question: A train travels 60 km in 45 minutes. What is its average speed in km/h?\nAnswer:",
    "Once upon a time, in a small village by the sea,",
)




# Bounds on prompt input, checked before anything is tokenized or allocated (validation prompts are
# short; these are far above any useful one).
MAX_PROMPTS_BYTES = 64 << 20
MAX_PROMPTS = 4096
MAX_PROMPT_CHARS = 256 << 10  # characters of one text prompt
_TOKEN_IDS = re.compile(r"-?[0-9]+(?:\s+-?[0-9]+)*")


def _token_list(value: Any) -> bool:
    return isinstance(value, list) and all(type(i) is int for i in value)  # JSON true/false are not ids


def read_prompts(path: str | Path) -> list[str | list[int]]:
    """Prompts from a file: JSONL with a `prompt` field (text or a list of ids), or one per line
    (space-separated ints or a JSON list = token ids, anything else = text). Bounded and typed:
    a file that is not UTF-8 text, too big, or holds an oversized prompt is one error naming it."""
    path = Path(path)
    lines = read_text(path, "a prompts file (one prompt per line, as text or token ids)",
                      max_bytes=MAX_PROMPTS_BYTES).splitlines()
    prompts: list[str | list[int]] = []
    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped:
            continue
        if len(stripped) > MAX_PROMPT_CHARS:
            raise DFlashError(f"line {n}: a prompt of {len(stripped)} characters (at most {MAX_PROMPT_CHARS})",
                              file=path)
        if len(prompts) == MAX_PROMPTS:
            raise DFlashError(f"more than {MAX_PROMPTS} prompts", file=path)
        if stripped.startswith(("{", "[")):
            try:
                value = json.loads(stripped)
            except (ValueError, RecursionError):  # JSONDecodeError, Python's integer-digit cap, deep nesting
                raise DFlashError(f"line {n}: not valid JSON", file=path) from None
            if stripped.startswith("{"):
                if not isinstance(value, dict) or "prompt" not in value:
                    raise DFlashError(f"line {n}: JSONL prompt lines need a `prompt` field", file=path)
                value = value["prompt"]
                if not (isinstance(value, str) or _token_list(value)):
                    raise DFlashError(f"line {n}: `prompt` must be text or a list of token ids", file=path)
            elif not _token_list(value):
                raise DFlashError(f"line {n}: not a JSON list of token ids", file=path)
            prompts.append(value)
        elif _TOKEN_IDS.fullmatch(stripped):
            tokens = stripped.split()
            if any(len(t) > 12 for t in tokens):  # no vocabulary is that large; int() of it is slow
                raise DFlashError(f"line {n}: token id {next(t for t in tokens if len(t) > 12)[:16]}... is out of "
                                  "any vocabulary's range", file=path)
            prompts.append([int(tok) for tok in tokens])
        else:
            prompts.append(line)
    if not prompts:
        raise DFlashError("no prompts in the file", file=path)
    return prompts


def _load_tokenizer(target_dir: Path):
    """The target's tokenizer, or None when the directory ships none (never runs remote code)."""
    if not any((target_dir / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(target_dir), trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - a corrupt or hostile tokenizer file raises anything (KeyError,
        # RecursionError for deep nesting, the Rust library's own Exception): one line naming it
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise DFlashError(f"cannot load the target tokenizer (corrupt or unsupported tokenizer files: {first})",
                          file=target_dir) from None


def tokenize_prompts(prompts: Sequence[str | list[int]] | None, target_dir: Path, vocab_size: int,
                     avoid: set[int], source: str = "prompts") -> tuple[list[list[int]], str]:
    """Token-id prompts and a description of where they came from."""
    tokenizer = _load_tokenizer(target_dir)
    if prompts is None:
        if tokenizer is not None:
            prompts, source = list(BUILTIN_TEXT_PROMPTS), "built-in text prompts"
        else:  # no tokenizer: deterministic id sequences that avoid the special ids
            import random

            rng = random.Random(0)
            pool = [i for i in range(vocab_size) if i not in avoid]
            prompts = [[rng.choice(pool) for _ in range(24)] for _ in range(4)]
            source = "built-in random token-id prompts (the target has no tokenizer; pass --prompts)"
    out = []
    for n, p in enumerate(prompts, 1):
        if isinstance(p, str):
            if tokenizer is None:
                raise DFlashError(f"prompt {n} is text but the target ships no tokenizer: give token ids "
                                  "(space-separated ints or a JSON list per line)", file=source)
            if len(p) > MAX_PROMPT_CHARS:
                raise DFlashError(f"prompt {n}: {len(p)} characters (at most {MAX_PROMPT_CHARS})", file=source)
            ids = tokenizer(p, add_special_tokens=True)["input_ids"]
        elif isinstance(p, (list, tuple)) and _token_list(list(p)):
            ids = list(p)
        else:
            raise DFlashError(f"prompt {n}: neither text nor a list of integer token ids", file=source)
        if len(ids) > MAX_PROMPT_TOKENS:
            raise DFlashError(f"prompt {n}: {len(ids)} tokens (at most {MAX_PROMPT_TOKENS})", file=source)
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad or not ids:
            raise DFlashError(f"prompt {n}: " + (f"token ids {bad[:3]} outside the target vocab ({vocab_size})"
                                                 if bad else "empty"), file=source)
        out.append(ids)
    return out, source
