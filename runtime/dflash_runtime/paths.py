"""The target's two computations of one generation's logits, to judge where a speculative output parts from
the target's greedy output.

Speculative decoding takes each token from a row of a verify block (the anchor and the proposals, forwarded
together at start..start+P); target-only decoding takes it from a one-token forward. Both compute the same
function, but with other shapes, so other kernels and reduction orders: in bfloat16 their logits differ by a few
units in the last place after a few layers, and where two tokens sit that close, each path may pick another.
A parting is then the target's own rounding, not the draft or the loop.

Both paths are recomputed here, teacher-forced on the generated tokens, with the target alone and independent of
the decode loop (so a defect of the loop is not replayed, and shows as a parting the paths do not explain):
    one_token_logits: prefill the prompt, then one token at a time, as target-only decoding runs;
    verify_logits: prefill, then the speculative run's verify blocks as it ran them: each step's anchor and
        proposals (the accepted ones are the committed tokens; the slots after the first rejected one do not
        reach the committed rows of a causal target and are filled with what followed, for the block's shape),
        cropped to the committed tokens after each step.
Row k of either is the logits token k was picked from, penalized as the loop penalizes them. A long output at a
large vocabulary makes [N, V] float32 gigabytes (2.5 GB at 4096 tokens and 152k ids): `one_token_partings` and
`verify_logits(rows=...)` keep only the rows a parting needs, computed exactly as the whole tensors are.
"""

from __future__ import annotations

from typing import Iterator

import torch

from .sampling import Penalties, penalize
from .target import Target


def _prefill(target: Target, prompt: torch.Tensor, penalties: Penalties | None, step_tokens: int,
             max_len: int) -> torch.Tensor:
    target.set_capture([])
    target.reset(max_len, step_tokens)
    logits, _ = target.forward(prompt, 0, last_logits_only=True)
    return penalize(logits[-1:], penalties, prompt, prompt[:0], 0)  # [1, V]


@torch.inference_mode()
def one_token_logits(target: Target, prompt_ids: list[int], tokens: list[int], *, max_new_tokens: int | None = None,
                     penalties: Penalties | None = None) -> torch.Tensor:
    """[N, V] float32: row k the target's logits for token k of `tokens` (N of them), computed as target-only
    decoding computes them: the prompt prefilled, then tokens[:k] fed one at a time (`max_new_tokens` as the run
    had it: it sizes a static cache, whose length the attention kernels see)."""
    return torch.cat(list(_one_token_rows(target, prompt_ids, tokens, max_new_tokens, penalties)))


@torch.inference_mode()
def one_token_partings(target: Target, prompt_ids: list[int], tokens: list[int], *,
                       max_new_tokens: int | None = None, penalties: Penalties | None = None
                       ) -> tuple[list[int], dict[int, torch.Tensor]]:
    """(the one-token decode's greedy token at each of the N positions, {k: its row k [V]} where that is not
    tokens[k]): one_token_logits' rows and argmax, each row dropped once read unless a parting needs it."""
    greedy: list[int] = []
    kept: dict[int, torch.Tensor] = {}
    for k, row in enumerate(_one_token_rows(target, prompt_ids, tokens, max_new_tokens, penalties)):
        greedy.append(int(row.argmax(dim=-1)))
        if greedy[-1] != tokens[k]:
            kept[k] = row[0]
    return greedy, kept


def _one_token_rows(target: Target, prompt_ids: list[int], tokens: list[int], max_new_tokens: int | None,
                    penalties: Penalties | None) -> Iterator[torch.Tensor]:
    """Row k [1, V] of one_token_logits, one at a time (the target reset after the last)."""
    device = target.device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)
    out = torch.as_tensor(tokens, dtype=torch.long, device=device)
    yield _prefill(target, prompt, penalties, 1, prompt.numel() + (max_new_tokens or len(tokens)) + 1)
    for k in range(1, len(tokens)):
        logits, _ = target.forward(out[k - 1:k], prompt.numel() + k - 1)  # [1, V]
        yield penalize(logits, penalties, prompt, out[:k], k)
    target.reset()


@torch.inference_mode()
def verify_logits(target: Target, prompt_ids: list[int], tokens: list[int], accepted_per_step: list[int], *,
                  proposals: int, max_new_tokens: int, full_last_block: bool = False,
                  penalties: Penalties | None = None, rows: list[int] | None = None) -> torch.Tensor:
    """[N, V] float32: row k the target's logits for token k of a speculative generation's `tokens`, computed as
    its verify blocks computed them. `accepted_per_step`: the proposals accepted at each verify step (in order),
    `proposals`: a full block's proposals, `max_new_tokens` and `full_last_block` as the run had them (they size
    the last block). `rows` given: only those rows, in that order ([len(rows), V]; each block's others dropped).
    Raises ValueError when the steps do not account for the tokens."""
    device = target.device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)
    n = len(tokens)
    kept: dict[int, torch.Tensor] = {}  # position -> its row (`rows` given)
    first = _prefill(target, prompt, penalties, proposals + 1, prompt.numel() + max_new_tokens + proposals + 1)
    out = [first] if rows is None else []
    if rows is not None and 0 in rows:
        kept[0] = first[0]
    committed, start = 1, prompt.numel()  # tokens with a row; the anchor (tokens[committed - 1]) is at `start`
    for accepted in accepted_per_step:
        if committed >= n:
            raise ValueError(f"{len(accepted_per_step)} verify steps for {n} tokens: more steps than tokens")
        size = proposals if full_last_block else min(proposals, max_new_tokens - committed)
        if accepted > size:
            raise ValueError(f"a step accepted {accepted} of {size} proposals")
        after = tokens[committed:committed + size]
        filler = after + [after[-1] if after else tokens[committed - 1]] * (size - len(after))
        block = torch.as_tensor([tokens[committed - 1]] + filler, dtype=torch.long, device=device)  # [size+1]
        logits, _ = target.forward(block, start)  # [size+1, V]
        seen = torch.as_tensor(tokens[:committed] + filler, dtype=torch.long, device=device)
        logits = penalize(logits, penalties, prompt, seen, committed)
        new = min(accepted + 1, n - committed)  # the accepted proposals and the target's token after them
        if rows is None:
            out.append(logits[:new])
        else:  # a copy: a view would keep the whole block alive
            kept.update({k: logits[k - committed].clone() for k in rows if committed <= k < committed + new})
        committed += new
        start += new
        target.crop(start)
    target.reset()
    if committed != n:
        raise ValueError(f"{len(accepted_per_step)} verify steps account for {committed} of {n} tokens")
    if rows is None:
        return torch.cat(out)
    return torch.stack([kept[k] for k in rows]) if rows else first[:0]
