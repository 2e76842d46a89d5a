"""--context-lengths against --endpoint: prompts of exactly L tokens of the target's tokenizer, sent as token ids
(/v1/completions takes a list of ids as its prompt, in vLLM and SGLang alike, and tokenizes nothing), each
length's requests measured as a phase of their own after the run's prompts.

Where the prompts come from, first found:
- a CHECKPOINT with --target whose end-to-end level ran: that level's own windows (breakdown.long_contexts), the
  token ids the runtime decoded, so each length's figures stand beside the runtime's;
- the server's own tokenizer: POST /tokenize {"model", "prompt", "add_special_tokens"} answers {"tokens", "count",
  "max_model_len"} (vLLM 0.33 always serves it, SGLang 0.5.23 too), the text cut as the runtime cuts it;
- a server without /tokenize (a router in front of it): the tokenizer of a local --target directory;
- none: a --long-context-file of token ids, or prompts given as token ids, need no tokenizer; otherwise exit 1
  saying what to give (never prompts of other lengths).

Each length must fit: L + --max-new-tokens within the max_model_len the server's /v1/models card gives, else a usage
error before anything is sent (vLLM cuts max_tokens short to fit, silently); where the card does not say, an
answer ended for length short of --max-new-tokens is an error. Every answer's usage.prompt_tokens, where given,
must be L.

A phase's counts are exact either way: per-request statistics summed, else the deltas of the server's counters
around the phase when no other request ran (measure.measured, as for the run's prompts)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.validate.breakdown import LongContexts, long_contexts
from dflash_convert.validate.endpoint.client import Endpoint, EndpointError, field_of, served_max_model_len
from dflash_convert.validate.endpoint.measure import bodies, measured, read_counters, send_all
from dflash_convert.validate.options import ValidateOptions
from dflash_convert.validate.report import SliceAcceptance

TOKENIZE = "/tokenize"  # vLLM's and SGLang's (SGLang also serves /v1/tokenize)
ANY_VOCAB = sys.maxsize  # the server's own ids: its vocabulary bounds them (it refuses any other: HTTP 400)


class ServerTokenizer:
    """The served model's tokenizer behind POST /tokenize, called as breakdown.long_contexts calls a transformers
    tokenizer: tokenizer(text, add_special_tokens=...)["input_ids"]."""

    def __init__(self, endpoint: Endpoint, model: str):
        self.endpoint, self.model = endpoint, model

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        where = f"{self.endpoint.label} {self.endpoint.url}{TOKENIZE}"
        body = self.endpoint.post(TOKENIZE, {"model": self.model, "prompt": text,
                                             "add_special_tokens": add_special_tokens}).body
        tokens = field_of(body, "tokens", where)
        if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
            raise EndpointError(f"{where}: `tokens` is not a list of token ids")
        if body.get("count", len(tokens)) != len(tokens):
            raise EndpointError(f"{where}: `count` {body['count']} is not the {len(tokens)} tokens it lists")
        return {"input_ids": tokens}


def refuse_beyond_context(endpoint: Endpoint, model: str, lengths: list[int], max_new_tokens: int) -> None:
    """A usage error (exit 2) where the longest length and the new tokens pass the context the server serves."""
    served = served_max_model_len(endpoint, model)
    need = max(lengths) + max_new_tokens
    if served is not None and need > served:
        raise UsageError(f"--context-lengths {max(lengths)} + --max-new-tokens {max_new_tokens} = {need} tokens "
                         f"exceeds the max_model_len {served} that {endpoint.url} serves {model} with; give lengths "
                         f"of at most {served - max_new_tokens}")


def endpoint_long_contexts(opts: ValidateOptions, endpoint: Endpoint, model: str,
                           prompts: list[tuple[str | None, Any]], say: Callable[[str], None]) -> LongContexts:
    """The --context-lengths prompts cut with the server's tokenizer, else a local --target's (module doc)."""
    tokenizer, why = ServerTokenizer(endpoint, model), ""
    try:
        prefix = tokenizer("", add_special_tokens=True)["input_ids"]  # the probe: does the server tokenize?
    except EndpointError as exc:
        why = str(exc)
        tokenizer, whose = _local_tokenizer(opts), f"the local tokenizer of --target {opts.target}"
    else:
        whose = f"the server's own tokenizer (POST /tokenize; {len(prefix)} special token(s) first)"
    own = [p for name, p in prompts if name is None]
    ids = [p for p in own if isinstance(p, list) and all(type(t) is int for t in p)]
    vocab = ANY_VOCAB if tokenizer is None or isinstance(tokenizer, ServerTokenizer) else len(tokenizer)
    try:
        long = long_contexts(list(opts.context_lengths), opts.long_context_file, tokenizer, own or None, ids, vocab)
    except DFlashError as exc:
        if tokenizer is not None:
            raise
        raise EndpointError(f"--context-lengths against {endpoint.url}: no tokenizer to cut prompts of exact lengths "
                            f"({why or 'none'}; {str(exc).splitlines()[0]}): give --target DIR (a directory with the "
                            "target's tokenizer), or a --long-context-file of token ids") from None
    say(f"endpoint: --context-lengths prompts cut with {whose}" if tokenizer is not None else
        f"endpoint: --context-lengths prompts cut from token ids (no tokenizer: {why})")
    return LongContexts(long.windows, long.source + (f"; cut with {whose}" if tokenizer is not None else ""))


def _local_tokenizer(opts: ValidateOptions):
    """The tokenizer of a local --target directory (None: no --target, a Hub id, or no tokenizer files)."""
    from dflash_convert.validate.prompts import load_tokenizer

    target = Path(opts.target) if opts.target is not None else None
    return load_tokenizer(target) if target is not None and target.is_dir() else None


def measure_lengths(endpoint: Endpoint, long: LongContexts, *, model: str, engine: str, sampling: dict[str, Any],
                    seed: int | None, opts: ValidateOptions, say: Callable[[str], None],
                    width: int | None = None) -> list[SliceAcceptance]:
    """Each length's prompts sent as a phase of their own, `opts.endpoint_concurrency` in flight, and measured
    exactly (module doc); one slice per length. `width`: the draft tokens per verify step the run's prompts were
    served at (None: not said); a phase served at another is an error, never a point of the curve. Any error of a
    phase names it."""
    slices = []
    for length, windows in long.windows.items():
        try:
            slices.append(_measure_length(endpoint, length, windows, model=model, engine=engine, sampling=sampling,
                                          seed=seed, opts=opts, say=say, width=width))
        except EndpointError as exc:
            raise EndpointError(f"the --context-lengths phase of {length} tokens: {exc}") from None
    return slices


def _measure_length(endpoint: Endpoint, length: int, windows, *, model, engine, sampling, seed, opts, say,
                    width) -> SliceAcceptance:
    sent = bodies([(None, w) for w in windows], model=model, engine=engine, sampling=sampling,
                  max_tokens=opts.max_new_tokens, seed=seed, logprobs=False)
    before = read_counters(endpoint)
    replies, _ = send_all(endpoint, sent, opts.endpoint_concurrency)
    after = read_counters(endpoint)
    other = next((r.prompt_tokens for r in replies if r.prompt_tokens not in (None, length)), None)
    if other is not None:
        raise EndpointError(f"{endpoint.label} {endpoint.url}: the server counted {other} prompt tokens for a "
                            f"--context-lengths prompt of {length} token ids: it did not serve them as sent")
    cut = next((r.new_tokens for r in replies if r.finish_reason == "length" and
                r.new_tokens < opts.max_new_tokens), None)
    if cut is not None:  # vLLM shortens max_tokens to what its context leaves, and says "length"
        raise EndpointError(f"{endpoint.label} {endpoint.url}: a --context-lengths prompt of {length} tokens got "
                            f"{cut} of --max-new-tokens {opts.max_new_tokens} tokens, ended for length: the "
                            "served context is shorter than the prompt and its new tokens; give shorter lengths")
    counts, _ = measured(endpoint, replies, before, after)
    if None not in (width, counts.width) and counts.width != width:
        raise EndpointError(f"{endpoint.label} {endpoint.url}: this phase was served at {counts.width} draft tokens "
                            f"per verify step, the run's prompts at {width}: another configuration, not mixed "
                            "into the curve")
    say(f"endpoint: context {length} tokens, {len(replies)} prompt(s): tau {counts.tau:.2f}")
    return SliceAcceptance(label=f"{length} tokens", prompts=len(replies), context_tokens=length,
                           new_tokens=sum(r.new_tokens for r in replies), num_drafts=counts.steps,
                           accepted=counts.accepted, acceptance_length=counts.tau,
                           per_position_rates=counts.rates, accepted_histogram=counts.histogram or [])
