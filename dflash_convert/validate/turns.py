"""Later turns of multi-turn prompts (MT-Bench's second turn, or any chat with an assistant turn marked
`"generate": true`): the target answers the conversation so far, its answer (decoded without special
tokens, as z-lab's benchmark feeds it back) becomes that assistant turn, and the chat is rendered again up
to the next such turn or in full. The answer is the target's own decoding (target-only, the run's sampling,
penalties, stop ids and seed): the same for every draft, so two runs of one target measure the same prompts."""

from __future__ import annotations

from typing import Any, Callable

from dflash_convert.validate.prompts import render_chat, pending_turn


def answer_turns(target, pending: dict[int, list[dict[str, Any]]], prompt_ids: list[list[int]], *, how: dict,
                 max_new_tokens: int, sampling, say: Callable[[str], None]) -> None:
    """Replace prompt_ids[i] of every pending chat by its rendering with the target's answers filled in.
    `how`: tokenizer, template, template_kwargs, template_name as the prompts were rendered with; `sampling`:
    the run's dflash_runtime.Sampling (stop ids, penalties and seed included)."""
    from dflash_runtime import target_generate

    tokenizer = how["tokenizer"]
    for n, (i, messages) in enumerate(sorted(pending.items()), 1):
        chat = [dict(m) for m in messages]
        while (k := pending_turn(chat)) is not None:
            answer = target_generate(target, prompt_ids[i], max_new_tokens=max_new_tokens, sampling=sampling).tokens
            chat[k] = {"role": "assistant", "content": tokenizer.decode(answer, skip_special_tokens=True)}
            rest = pending_turn(chat)
            prompt_ids[i] = render_chat(tokenizer, chat if rest is None else chat[:rest], how["template"],
                                    how["template_kwargs"] or {}, how["template_name"], i + 1)
        say(f"end to end: earlier turns answered by the target: {n}/{len(pending)}")
