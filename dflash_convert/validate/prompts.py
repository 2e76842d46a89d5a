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
from dflash_convert.user_text import category_problem

BUILTIN_TEXT_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Question: A train travels 60 km in 45 minutes. What is its average speed in km/h?\nAnswer:",
    "Once upon a time, in a small village by the sea,",
)
# What a report says of its prompts when they are neither the user's (--prompts) nor a named set (--dataset):
# a figure measured on them is not the figure of the user's traffic, and random ids understate it most.
BUILTIN_RANDOM_NOTE = ("built-in random token ids (the target ships no tokenizer; tau on random ids understates a "
                       "trained draft: give --prompts or --dataset)")
BUILTIN_TEXT_NOTE = (f"built-in text prompts ({len(BUILTIN_TEXT_PROMPTS)} generic ones, not your traffic: give "
                     "--prompts or --dataset)")




# Bounds on prompt input, checked before anything is tokenized or allocated (validation prompts are
# short; these are far above any useful one).
MAX_PROMPTS_BYTES = 64 << 20
MAX_PROMPTS = 4096
MAX_PROMPT_CHARS = 256 << 10  # characters of one text prompt
_TOKEN_IDS = re.compile(r"-?[0-9]+(?:\s+-?[0-9]+)*")


ROLES = ("system", "user", "assistant", "tool", "developer")
MAX_TEMPLATE_BYTES = 1 << 20  # real chat templates are a few KB


def _token_list(value: Any) -> bool:
    return isinstance(value, list) and all(type(i) is int for i in value)  # JSON true/false are not ids


def messages_problem(value: Any) -> str | None:
    """None when `value` is a chat vLLM's chat API accepts for a text model, else what is wrong, naming the
    message (1-based) and the field: roles system/user/assistant/tool; `content` text, a list of
    {"type": "text", "text": ...} parts (or plain strings), or null/absent on an assistant turn; a tool turn's
    `tool_call_id`; an assistant's `tool_calls` (function calls, `arguments` a JSON string or an object)."""
    if not isinstance(value, list) or not value:
        return "must be a non-empty list of turns"
    for i, m in enumerate(value, 1):
        where = f"message {i}"
        if not isinstance(m, dict):
            return f"{where} is not an object"
        role = m.get("role")
        if role not in ROLES:
            return f"{where}: field `role` is {role!r}, not one of {', '.join(ROLES)}"
        content = m.get("content")
        if content is None and role != "assistant":
            return f"{where}: field `content` is missing (only an assistant turn may omit it)"
        if isinstance(content, list):
            for j, part in enumerate(content, 1):
                if isinstance(part, str):
                    continue
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    return (f"{where}: field `content` part {j} ({kind!r}) is not a {{\"type\": \"text\", \"text\": "
                            "...}} part (the target is a text model)")
        elif content is not None and not isinstance(content, str):
            return f"{where}: field `content` must be text or a list of text parts, got {type(content).__name__}"
        if role == "tool" and not isinstance(m.get("tool_call_id"), str):
            return f"{where}: field `tool_call_id` (text) is required on a tool turn"
        if m.get("generate") is not None and not (m["generate"] is True and role == "assistant" and content is None):
            return (f"{where}: field `generate` (true) marks an assistant turn without content for the target to "
                    "answer")
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls is not None:
            if not isinstance(calls, list):
                return f"{where}: field `tool_calls` must be a list"
            for j, call in enumerate(calls, 1):
                fn = call.get("function") if isinstance(call, dict) else None
                if not (isinstance(call, dict) and call.get("type", "function") == "function"
                        and isinstance(fn, dict)):
                    return (f"{where}: field `tool_calls` entry {j} is not a "
                            '{"type": "function", "function": {...}} call')
                if not isinstance(fn.get("name"), str):
                    return f"{where}: field `tool_calls` entry {j}: `function.name` (text) is required"
    return None


def _messages(value: Any) -> bool:
    return messages_problem(value) is None


def pending_turn(messages: Any) -> int | None:
    """Index of the first assistant turn the target is to answer (`"generate": true`), else None."""
    if not isinstance(messages, list):
        return None
    return next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("generate") is True), None)


def _texts(content: Any) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    return [part if isinstance(part, str) else part["text"] for part in content]


def _arguments(value: Any) -> dict:
    """A tool call's arguments as vLLM hands them to the template: an object (a JSON string decoded; empty,
    invalid JSON or a non-object: {})."""
    if isinstance(value, str) and value:
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return {}
    return value if isinstance(value, dict) else {}


def conversation(messages: list[dict[str, Any]], content_format: str) -> list[dict[str, Any]]:
    """The turns as vLLM's chat endpoint hands them to the template (`content_format` "string": text parts
    joined with "\n"; "openai": a list of {"type": "text", "text": ...} parts, a plain string wrapped as one;
    a tool turn's parts always joined). Kept per turn: role, content, an assistant's tool_calls (arguments
    decoded to an object; an empty list dropped) and text `reasoning` (also as `reasoning_content`), a tool
    turn's tool_call_id, a text `name` and `task`; other keys are dropped, as vLLM drops them."""
    out = []
    for m in messages:
        texts = _texts(m.get("content"))
        role = m["role"]
        content: Any = [{"type": "text", "text": t} for t in texts] if content_format == "openai" else "\n".join(texts)
        turn: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls:
                turn["tool_calls"] = [dict(c, function=dict(c["function"], arguments=_arguments(
                    c["function"].get("arguments")))) for c in calls]
            if isinstance(m.get("reasoning"), str):
                turn["reasoning"] = turn["reasoning_content"] = m["reasoning"]
        elif role == "tool":
            turn["tool_call_id"] = m["tool_call_id"]
            turn["content"] = "\n".join(texts)
        elif role == "developer":
            turn["tools"] = m.get("tools")
        for key in ("name", "task"):  # kept when text, as vLLM keeps them
            if isinstance(m.get(key), str):
                turn[key] = m[key]
        out.append(turn)
    return out


def developer_as_system(turns: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """vLLM's handling of developer turns for a template that never names the role ('"developer"' or
    "'developer'" not in its text): each becomes a system turn (its `tools` dropped), then, when a system turn
    is not first or there are several, all system turns merge into one at the start, their non-empty texts
    joined with a blank line (a list of parts: its texts joined with "\n" first)."""
    if not any(t["role"] == "developer" for t in turns) or '"developer"' in template or "'developer'" in template:
        return turns
    turns = [{k: v for k, v in t.items() if k != "tools"} | {"role": "system"} if t["role"] == "developer" else t
             for t in turns]
    systems = [i for i, t in enumerate(turns) if t["role"] == "system"]
    if systems == [0] or not systems:
        return turns
    texts = []
    for i in systems:
        content = turns[i]["content"]
        text = content if isinstance(content, str) else "\n".join(p["text"] for p in content)
        if text:
            texts.append(text)
    return [{"role": "system", "content": "\n\n".join(texts)}, *(t for t in turns if t["role"] != "system")]


def content_format(template: str) -> str:
    """"openai" when the template loops over a message's content (vLLM then hands content as a list of
    parts), else "string". vLLM 0.33 detects this on the template's syntax tree (renderers/hf.py); this
    reads the same tree for a `for` loop over `X.content`, `X['content']` or a variable named `content`
    (vLLM also follows content passed into macros and aliases of `messages`: a template that only loops
    over content inside such a macro is read here as "string")."""
    from jinja2 import nodes

    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        tree = _compile_jinja_template(template).environment.parse(template)
    except Exception:  # noqa: BLE001 - vLLM's default when the template cannot be parsed
        return "string"

    def is_content(node) -> bool:
        while isinstance(node, (nodes.Filter, nodes.Test)) or (isinstance(node, nodes.Getitem)
                                                             and isinstance(node.arg, nodes.Slice)):
            node = node.node
        if isinstance(node, nodes.Getattr):
            return node.attr == "content"
        if isinstance(node, nodes.Getitem):
            return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
        return isinstance(node, nodes.Name) and node.name == "content"

    return "openai" if any(is_content(loop.iter) for loop in tree.find_all(nodes.For)) else "string"


PROMPTS_FILE = "a prompts file (one prompt per line, as text or token ids)"


def read_prompts(path: str | Path, categories: list[str | None] | None = None, *, what: str = PROMPTS_FILE
                 ) -> list[str | list[int]]:
    """Prompts from a file: JSONL with a `prompt` field (text or a list of ids) or a `messages` field
    (OpenAI-style chat turns), or one per line (space-separated ints or a JSON list = token ids, anything
    else = text). Bounded and typed: a file that is not UTF-8 text, too big, or holds an oversized
    prompt is one error naming it. `categories`, when given, receives each prompt's JSONL `category` field
    (text, as SpecBench and SPEED-Bench files carry it; None where a line has none). `what`: what the file is
    to be, as its errors say (another flag's file read the same way names that flag)."""
    path = Path(path)
    lines = read_text(path, what, max_bytes=MAX_PROMPTS_BYTES).splitlines()
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
            category = value.get("category") if isinstance(value, dict) else None
            if category is not None and not (isinstance(category, str) and category.strip()):
                raise DFlashError(f"line {n}: `category` must be non-empty text", file=path)
            problem = category_problem(category) if category is not None else None
            if problem:  # a label the reports print: an ESC sequence or a 100k-character name is no label
                raise DFlashError(f"line {n}: `category` {problem}", file=path)
            if categories is not None:  # this prompt's, after None for the plain lines before it
                categories += [None] * (len(prompts) - len(categories)) + [category]
            if stripped.startswith("{"):
                if not isinstance(value, dict) or ("prompt" in value) == ("messages" in value):
                    raise DFlashError(f"line {n}: JSONL prompt lines need a `prompt` field (text or token ids) "
                                      "or a `messages` field (chat turns): one of them", file=path)
                if "messages" in value:
                    value = value["messages"]
                    problem = messages_problem(value)
                    if problem:
                        raise DFlashError(f"line {n}: `messages`: {problem}", file=path)
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
        raise DFlashError("no prompts in the file" if what == PROMPTS_FILE else f"the file is empty: not {what}",
                          file=path)
    if categories is not None:
        categories += [None] * (len(prompts) - len(categories))
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


def render_chat(tokenizer, messages: list[dict[str, str]], template: str, kwargs: dict[str, Any], name: str,
            n: int) -> list[int]:
    """Token ids of the chat as vLLM's chat endpoint renders it."""
    messages = developer_as_system(conversation(messages, content_format(template)), template)
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
            prompts, source = list(BUILTIN_TEXT_PROMPTS), BUILTIN_TEXT_NOTE
        else:  # no tokenizer: deterministic id sequences that avoid the special ids
            import random

            rng = random.Random(0)
            pool = [i for i in range(vocab_size) if i not in avoid]
            prompts = [[rng.choice(pool) for _ in range(24)] for _ in range(4)]
            source = BUILTIN_RANDOM_NOTE
    out = []
    for n, p in enumerate(prompts, 1):
        if isinstance(p, str):
            if tokenizer is None:
                raise DFlashError(f"prompt {n} is text but the target ships no tokenizer: give token ids "
                                  "(space-separated ints or a JSON list per line)", file=source)
            if len(p) > MAX_PROMPT_CHARS:
                raise DFlashError(f"prompt {n}: {len(p)} characters (at most {MAX_PROMPT_CHARS})", file=source)
            if template is not None:
                ids = render_chat(tokenizer, [{"role": "user", "content": p}], template, template_kwargs or {},
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
            if sum(len(t) for m in p for t in _texts(m.get("content"))) > MAX_PROMPT_CHARS:
                raise DFlashError(f"prompt {n}: more than {MAX_PROMPT_CHARS} characters", file=source)
            pending = pending_turn(p)  # a turn the target answers first: the prompt it answers, for now
            ids = render_chat(tokenizer, p if pending is None else p[:pending], template, template_kwargs or {},
                          template_name, n)
        else:
            problem = messages_problem(p) if isinstance(p, list) and p and isinstance(p[0], dict) else None
            raise DFlashError(f"prompt {n}: " + (f"`messages`: {problem}" if problem else "neither text, a list of "
                              "integer token ids nor chat messages"), file=source)
        if len(ids) > MAX_PROMPT_TOKENS:
            raise DFlashError(f"prompt {n}: {len(ids)} tokens (at most {MAX_PROMPT_TOKENS})", file=source)
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad or not ids:
            raise DFlashError(f"prompt {n}: " + (f"token ids {bad[:3]} outside the target vocab ({vocab_size})"
                                                 if bad else "empty"), file=source)
        out.append(ids)
    return out, source
