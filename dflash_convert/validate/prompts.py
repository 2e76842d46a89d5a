"""Validation prompts: read from a file (bounded, typed) and tokenized with the target's own tokenizer
(never remote code); without prompts, a built-in set (text, or token ids when the target ships no
tokenizer).

Chat: text prompts and OpenAI-style `messages` go through the chat template as vLLM's chat endpoint
applies it: the template rendered by transformers' `apply_chat_template` (a sandboxed Jinja
environment) with `add_generation_prompt=True` and the request's `chat_template_kwargs`, the text then
tokenized with `add_special_tokens=False` (the template writes the special tokens; adding them again
would double the BOS). Without a template, text is tokenized as vLLM's completion endpoint does (with
special tokens); messages need a template."""

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


ROLES = ("system", "user", "assistant")
MAX_TEMPLATE_BYTES = 1 << 20  # real chat templates are a few KB


def _token_list(value: Any) -> bool:
    return isinstance(value, list) and all(type(i) is int for i in value)  # JSON true/false are not ids


def _messages(value: Any) -> bool:
    """OpenAI-style chat turns: a non-empty list of {"role": system|user|assistant, "content": text}."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in ROLES and isinstance(m["content"], str)
        for m in value)


def read_prompts(path: str | Path) -> list[str | list[int]]:
    """Prompts from a file: JSONL with a `prompt` field (text or a list of ids) or a `messages` field
    (OpenAI-style chat turns), or one per line (space-separated ints or a JSON list = token ids, anything
    else = text). Bounded and typed: a file that is not UTF-8 text, too big, or holds an oversized
    prompt is one error naming it."""
    path = Path(path)
    lines = read_text(path, "a prompts file (one prompt per line, as text or token ids)",
                      max_bytes=MAX_PROMPTS_BYTES).splitlines()
    prompts: list[str | list[int] | list[dict[str, str]]] = []
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
                if not isinstance(value, dict) or ("prompt" in value) == ("messages" in value):
                    raise DFlashError(f"line {n}: JSONL prompt lines need a `prompt` field (text or token ids) "
                                      "or a `messages` field (chat turns): one of them", file=path)
                if "messages" in value:
                    value = value["messages"]
                    if not _messages(value):
                        raise DFlashError(f"line {n}: `messages` must be a list of {{\"role\": "
                                          f"{'|'.join(ROLES)}, \"content\": text}} turns", file=path)
                else:
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


def load_tokenizer(target_dir: Path):
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


def chat_template(tokenizer, choice: str, target_dir: Path) -> tuple[str | None, str]:
    """(the Jinja template text prompts are rendered with, or None for raw text; how the report names it).
    choice: auto (the tokenizer's own, when it has one), none, or a template file."""
    if choice == "none":
        return None, "raw text (--chat-template none)"
    if choice != "auto":
        text = read_text(Path(choice), "a Jinja chat template", max_bytes=MAX_TEMPLATE_BYTES)
        return text, f"chat template {choice}"
    own = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if isinstance(own, dict):  # named templates: the default one, as transformers picks without a name
        own = own.get("default")
    if not isinstance(own, str) or not own.strip():
        return None, "raw text (the target tokenizer has no chat template)"
    return own, f"the target tokenizer's chat template ({target_dir})"


def _render(tokenizer, messages: list[dict[str, str]], template: str, kwargs: dict[str, Any], name: str,
            n: int) -> list[int]:
    """Token ids of the chat as vLLM's chat endpoint renders it."""
    try:
        text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a template raises anything (TemplateError, SecurityError, ...)
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise DFlashError(f"prompt {n}: the chat template failed ({type(exc).__name__}: {first})", file=name) from None
    if not isinstance(text, str):
        raise DFlashError(f"prompt {n}: the chat template rendered no text", file=name)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def tokenize_prompts(prompts: Sequence[str | list[int] | list[dict[str, str]]] | None, target_dir: Path,
                     vocab_size: int, avoid: set[int], source: str = "prompts", *, tokenizer: Any = None,
                     template: str | None = None, template_name: str = "chat template",
                     template_kwargs: dict[str, Any] | None = None) -> tuple[list[list[int]], str]:
    """Token-id prompts and a description of where they came from. With `template`, text and chat
    messages are rendered through it (see the module docstring); `tokenizer` defaults to the target's."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(target_dir)
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
            if template is not None:
                ids = _render(tokenizer, [{"role": "user", "content": p}], template, template_kwargs or {},
                              template_name, n)
            else:
                ids = tokenizer(p, add_special_tokens=True)["input_ids"]
        elif isinstance(p, (list, tuple)) and _token_list(list(p)):
            ids = list(p)
        elif isinstance(p, list) and _messages(p):
            if tokenizer is None or template is None:
                raise DFlashError(f"prompt {n} is a chat (messages) but " + ("the target ships no tokenizer" if
                                  tokenizer is None else "no chat template applies (the tokenizer has none, or "
                                  "--chat-template none): give --chat-template FILE"), file=source)
            if sum(len(m["content"]) for m in p) > MAX_PROMPT_CHARS:
                raise DFlashError(f"prompt {n}: more than {MAX_PROMPT_CHARS} characters", file=source)
            ids = _render(tokenizer, p, template, template_kwargs or {}, template_name, n)
        else:
            raise DFlashError(f"prompt {n}: neither text, a list of integer token ids nor chat messages",
                              file=source)
        if len(ids) > MAX_PROMPT_TOKENS:
            raise DFlashError(f"prompt {n}: {len(ids)} tokens (at most {MAX_PROMPT_TOKENS})", file=source)
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad or not ids:
            raise DFlashError(f"prompt {n}: " + (f"token ids {bad[:3]} outside the target vocab ({vocab_size})"
                                                 if bad else "empty"), file=source)
        out.append(ids)
    return out, source
