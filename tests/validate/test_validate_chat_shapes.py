"""Every chat shape vLLM's chat API accepts for a text model: content as text parts (joined with "\\n" for
templates that take content as a string, as parts for templates that loop over it), tool turns with
tool_call_id, assistant tool_calls (arguments decoded to an object), a name; keys vLLM drops are dropped; a
refusal names the line, the message and the field."""

from __future__ import annotations

import json
import os

import pytest

from dflash_convert.errors import DFlashError
from factories import chat_target
from processes import VLLM_PYTHON, needs_vllm

WORDS_TEMPLATE = (  # takes content as a string (vLLM's "string" format): renders every field it is handed
    "{{ bos_token }}{% for m in messages %}{{ m.role }} {{ m.content }}"
    "{% if m.name is defined %} name={{ m.name }}{% endif %}"
    "{% if m.tool_call_id is defined %} id={{ m.tool_call_id }}{% endif %}"
    "{% if m.tool_calls is defined %}{% for c in m.tool_calls %} call={{ c.function.name }}"
    "{{ c.function.arguments | tojson }}{% endfor %}{% endif %}"
    "{% if m.task is defined %} task={{ m.task }}{% endif %}{% if m.extra is defined %} EXTRA{% endif %} "
    "{% endfor %}{% if add_generation_prompt %}assistant{% endif %}")
PARTS_TEMPLATE = (  # loops over content (vLLM's "openai" format)
    "{{ bos_token }}{% for m in messages %}{{ m.role }}{% if m.content is string %} {{ m.content }}{% else %}"
    "{% for p in m.content %} [{{ p.text }}]{% endfor %}{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}")

CHAT = [
    {"role": "system", "content": [{"type": "text", "text": "the cat"}, "sat"]},
    {"role": "user", "content": "hello", "name": "world", "extra": 1},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "the", "arguments": "{\"cat\": 1}"}},
        {"id": "c2", "type": "function", "function": {"name": "sat", "arguments": "not json"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "hello"},
                                                       {"type": "text", "text": "world"}]},
    {"role": "assistant", "content": "the", "tool_calls": []},
    {"role": "user", "content": "sat"},
]


def test_the_conversation_vllm_hands_the_template():
    from dflash_convert.validate.prompts import content_format, conversation

    assert content_format(WORDS_TEMPLATE) == "string" and content_format(PARTS_TEMPLATE) == "openai"
    assert conversation(CHAT, "string") == [
        {"role": "system", "content": "the cat\nsat"},
        {"role": "user", "content": "hello", "name": "world"},  # `extra` dropped, as vLLM drops it
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "the", "arguments": {"cat": 1}}},
            {"id": "c2", "type": "function", "function": {"name": "sat", "arguments": {}}}]},
        {"role": "tool", "content": "hello\nworld", "tool_call_id": "c1"},
        {"role": "assistant", "content": "the"},  # an empty tool_calls list dropped
        {"role": "user", "content": "sat"}]
    parts = conversation(CHAT, "openai")
    assert parts[0]["content"] == [{"type": "text", "text": "the cat"}, {"type": "text", "text": "sat"}]
    assert parts[1]["content"] == [{"type": "text", "text": "hello"}]  # a string wrapped as one part
    assert parts[2]["content"] == [] and parts[3]["content"] == "hello\nworld"  # tool turns: always joined


def test_developer_turns_become_system_as_vllm_does():
    from dflash_convert.validate.prompts import conversation, developer_as_system

    chat = [{"role": "user", "content": "a"}, {"role": "developer", "content": "b", "tools": [1]},
            {"role": "system", "content": ["c", "d"]}, {"role": "system", "content": ""}]
    turns = conversation(chat, "string")
    assert developer_as_system(turns, WORDS_TEMPLATE) == [{"role": "system", "content": "b\n\nc\nd"},
                                                          {"role": "user", "content": "a"}]
    kept = developer_as_system(turns, "{% if m.role == 'developer' %}{% endif %}")  # the template names the role
    assert kept[1] == {"role": "developer", "content": "b", "tools": [1]}
    first = conversation([{"role": "developer", "content": "b"}, {"role": "user", "content": "a"}], "string")
    assert developer_as_system(first, WORDS_TEMPLATE) == [{"role": "system", "content": "b"},
                                                          {"role": "user", "content": "a"}]


@pytest.mark.parametrize("template", [WORDS_TEMPLATE, PARTS_TEMPLATE])
def test_ids_equal_transformers_rendering_of_that_conversation(tiny_target, tmp_path, template):
    """The ids fed to the target are transformers' apply_chat_template (what vLLM 0.33 calls) of the
    conversation vLLM builds; parts handed to a string template (a planted 'always openai') fail here, a
    planted ' '-join of parts fails the test above (this word-level tokenizer splits on any whitespace)."""
    from transformers import AutoTokenizer

    from dflash_convert.validate.prompts import load_tokenizer, read_prompts, tokenize_prompts

    target = chat_target(tiny_target, tmp_path / "target", template=template)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": CHAT}) + "\n")
    tokenizer = load_tokenizer(target)
    ids, _ = tokenize_prompts(read_prompts(prompts), target, 512, set(), tokenizer=tokenizer, template=template)
    own = AutoTokenizer.from_pretrained(target)
    expected_conversation = [
        {"role": "system", "content": "the cat\nsat"}, {"role": "user", "content": "hello", "name": "world"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "the", "arguments": {"cat": 1}}},
            {"id": "c2", "type": "function", "function": {"name": "sat", "arguments": {}}}]},
        {"role": "tool", "content": "hello\nworld", "tool_call_id": "c1"}, {"role": "assistant", "content": "the"},
        {"role": "user", "content": "sat"}]
    if template is PARTS_TEMPLATE:
        for turn in expected_conversation:
            if turn["role"] != "tool":
                turn["content"] = [{"type": "text", "text": t} for t in turn["content"].split("\n") if t]
    text = own.apply_chat_template(expected_conversation, add_generation_prompt=True, tokenize=False)
    assert ids[0] == own(text, add_special_tokens=False)["input_ids"]
    if template is WORDS_TEMPLATE:  # what the template saw
        assert "the cat\nsat" in text and "id=c1" in text and 'call=the{"cat": 1}' in text and "EXTRA" not in text
    else:
        assert "[the cat] [sat]" in text and "tool hello\nworld" in text


@pytest.mark.parametrize("turn,needle", [
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
     "message 2: field `content` part 1 ('image_url')"),
    ({"role": "tool", "content": "x"}, "message 2: field `tool_call_id`"),
    ({"role": "assistant", "content": "x", "tool_calls": [{"type": "retrieval"}]},
     "message 2: field `tool_calls` entry 1"),
    ({"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}, "`function.name`"),
    ({"role": "robot", "content": "x"}, "message 2: field `role` is 'robot'"),
    ({"role": "user"}, "message 2: field `content` is missing"),
    ({"role": "user", "content": 5}, "message 2: field `content` must be text"),
])
def test_a_refusal_names_the_line_the_message_and_the_field(tmp_path, turn, needle):
    from dflash_convert.validate.prompts import read_prompts

    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "x"}\n' + json.dumps({"messages": [{"role": "user", "content": "x"}, turn]}) + "\n")
    with pytest.raises(DFlashError) as err:
        read_prompts(p)
    assert "line 2" in str(err.value) and needle in str(err.value) and str(p) in str(err.value)


VLLM_RENDER = """
import json, sys
from transformers import AutoTokenizer
from vllm.config import ModelConfig
from vllm.renderers.hf import parse_chat_messages, resolve_chat_template_content_format, safe_apply_chat_template
target, chats = sys.argv[1], json.loads(open(sys.argv[2]).read())
tok = AutoTokenizer.from_pretrained(target)
mc = ModelConfig(model=target, tokenizer=target)
out = []
for messages in chats:
    fmt = resolve_chat_template_content_format(tok.chat_template, None, "auto", tok, model_config=mc)
    conv, _, _ = parse_chat_messages(messages, mc, fmt)
    text = safe_apply_chat_template(mc, tok, conv, tokenize=False, add_generation_prompt=True)
    ids = safe_apply_chat_template(mc, tok, conv, tokenize=True, add_generation_prompt=True)
    out.append({"format": fmt, "text": text, "ids": list(ids)})
print("RESULT " + json.dumps(out))
"""
SHAPES = [CHAT, [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]}],
          [{"role": "system", "content": "the"}, {"role": "user", "content": "cat", "name": "sat", "task": "hello"},
           {"role": "assistant", "content": "hello", "reasoning": "world"}, {"role": "user", "content": "the cat"}],
          [{"role": "user", "content": "hello"}, {"role": "assistant", "content": None, "tool_calls": [
              {"id": "x", "type": "function", "function": {"name": "cat", "arguments": {"the": [1, 2]}}}]},
           {"role": "tool", "tool_call_id": "x", "content": "sat"}],
          [{"role": "user", "content": "hello"}, {"role": "developer", "content": "the cat"},
           {"role": "system", "content": [{"type": "text", "text": "sat"}, {"type": "text", "text": "world"}]}],
          [{"role": "developer", "content": "the"}, {"role": "user", "content": "cat"}]]


@needs_vllm
@pytest.mark.parametrize("template", [WORDS_TEMPLATE, PARTS_TEMPLATE])
def test_ids_equal_vllms_own_rendering(tiny_target, tmp_path, template):
    """vLLM's own chat path (parse_chat_messages with the content format it detects, then
    safe_apply_chat_template) in its venv gives the text and the ids this tool feeds the target."""
    import subprocess
    import sys

    from dflash_convert.validate.prompts import (content_format, conversation, developer_as_system, load_tokenizer,
                                                 tokenize_prompts)

    target = chat_target(tiny_target, tmp_path / "target", template=template)
    (tmp_path / "chats.json").write_text(json.dumps(SHAPES))
    (tmp_path / "render.py").write_text(VLLM_RENDER)
    done = subprocess.run([VLLM_PYTHON, str(tmp_path / "render.py"), str(target), str(tmp_path / "chats.json")],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ""})
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, (done.stdout + done.stderr)[-3000:]
    theirs = json.loads(line.removeprefix("RESULT "))
    tokenizer = load_tokenizer(target)
    ours, _ = tokenize_prompts(SHAPES, target, 512, set(), tokenizer=tokenizer, template=template)
    fmt = content_format(template)
    for chat, mine, vllm in zip(SHAPES, ours, theirs):
        text = tokenizer.apply_chat_template(developer_as_system(conversation(chat, fmt), template),
                                             chat_template=template, tokenize=False, add_generation_prompt=True)
        assert (fmt, text, mine) == (vllm["format"], vllm["text"], vllm["ids"]), sys.version
