"""Thinking on and off: --chat-template-kwargs renders the chat template as transformers does (Qwen3's published
enable_thinking branch), --compare-thinking reports tau per mode side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

# Qwen3's published chat template, its generation prompt and enable_thinking branch (the rest of it, tools and
# earlier reasoning, does not bear on a single user turn): with enable_thinking false the template writes an
# empty think block, so the model answers without reasoning.
QWEN3_THINKING = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")


@pytest.fixture(scope="module")
def chat(tmp_path_factory, tiny_target) -> Path:
    from factories import chat_target

    return chat_target(tiny_target, tmp_path_factory.mktemp("thinking") / "target")


@pytest.mark.parametrize("thinking", [True, False])
def test_the_thinking_kwarg_renders_as_transformers_does(chat, thinking):
    from transformers import AutoTokenizer

    from dflash_convert.validate.prompts import tokenize_prompts

    tok = AutoTokenizer.from_pretrained(chat)
    ours, _ = tokenize_prompts(["hello the world"], chat, 512, set(), tokenizer=tok, template=QWEN3_THINKING,
                               template_kwargs={"enable_thinking": thinking})
    theirs = tok.apply_chat_template([{"role": "user", "content": "hello the world"}], chat_template=QWEN3_THINKING,
                                     add_generation_prompt=True, enable_thinking=thinking, tokenize=True)
    theirs = theirs["input_ids"] if not isinstance(theirs, list) else theirs
    assert ours[0] == list(theirs)
    text = tok.apply_chat_template([{"role": "user", "content": "x"}], chat_template=QWEN3_THINKING,
                                   add_generation_prompt=True, enable_thinking=thinking, tokenize=False)
    assert ("<think>" in text) is not thinking  # the branch is taken: off writes the empty think block


def test_compare_thinking_reports_each_mode(cli, chat, speculators_drafts):
    r = cli("validate", speculators_drafts["full"], "--target", chat, "--compare-thinking", "--levels", "end_to_end",
            "--sampling", "greedy", "--max-new-tokens", "4", "--json")
    assert r.code == 0, r.err
    report = r.json()
    modes = report["per_thinking_mode"]
    assert [m["label"] for m in modes] == ["thinking on", "thinking off"]
    assert all(m["prompts"] == 4 and m["outputs_equal"] == 4 and m["num_drafts"] > 0 for m in modes)
    assert modes[0]["acceptance_length"] == report["acceptance"]["acceptance_length"]
    names = [c["name"] for c in report["checks"]]
    assert "greedy_output_equal (thinking off)" in names and "compare_thinking" not in names
    assert "tau per thinking mode (--compare-thinking): thinking on" in r.err
    assert report["options"]["compare_thinking"] is True
    # --profile-out's file: each mode's profile, its conditions naming the template variables it was rendered with
    profile = report["speculation_profile"]
    kwargs = [p["measurement_conditions"].get("chat_template_kwargs") for p in [profile, *profile["profiles"]]]
    assert kwargs == [{"enable_thinking": True}, {"enable_thinking": False}]
    assert profile["profiles"][0]["mean_accept_length"] == pytest.approx(modes[1]["acceptance_length"], abs=1e-4)


def test_compare_thinking_says_when_the_template_has_no_switch(cli, tmp_path, tiny_target, speculators_drafts):
    from factories import chat_target

    plain = chat_target(tiny_target, tmp_path / "plain", template="{% for m in messages %}{{ m.content }}{% endfor %}")
    r = cli("validate", speculators_drafts["full"], "--target", plain, "--compare-thinking", "--levels", "end_to_end",
            "--sampling", "greedy", "--max-new-tokens", "2", "--json")
    assert r.code == 0, r.err
    warned = next(c for c in r.json()["checks"] if c["name"] == "compare_thinking")
    assert warned["status"] == "warn" and "the two modes are one run" in warned["message"]
    r = cli("validate", speculators_drafts["full"], "--compare-thinking", "--chat-template-kwargs",
            '{"enable_thinking": true}')
    assert r.code == 2 and "sets enable_thinking itself" in r.err
