"""`validate`: static, numeric and end-to-end checks of a draft, as many levels as the inputs allow.

- static: `checks.checkpoint_checks` (headers, config, small int tensors) and, with a target config,
  `checks.target_checks` (shapes on the meta device: no weights read).
- numeric (draft only): the draft runs on synthetic context features with every attention backend
  that serves it on the device (or the one asked for): outputs finite, backends agree with `eager`
  within the dtype's tolerance, each layer causal or not as declared (perturb the last block slot:
  earlier slots must not move in a causal layer, must move in a non-causal one). Also the value
  scan: NaN/Inf, all-zero and constant tensors.
- end to end (target weights): speculative decoding on prompts; greedy output must equal the
  target's own greedy output; tau, per-position rates and speedup measured against thresholds.

Before anything is loaded a memory plan (`memory.plan`) says whether draft and target fit at the run's
dtype (by default each checkpoint's own) and refuses the run in one line when they do not. A failed
static level skips the expensive levels unless `keep_going`. `progress` receives one status line per
level and phase (the CLI prints them on stderr).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import platform
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from dflash_convert import __version__
from dflash_convert.format import catalogue, engines, mapping
from dflash_convert.validate import memory
from dflash_convert.io.checkpoint import Checkpoint, open_checkpoint
from dflash_convert.io.reading import read_json, read_text
from dflash_convert.format.configs import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE
from dflash_runtime import DEVICE_MAPS, DRAFT_SAMPLING

from dflash_convert.validate.checks import Check, _check, checkpoint_checks, duplicate_tensors_check, scan_checks, target_checks
from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.validate.report import LEVELS, AcceptanceStats, Environment, ValidationReport

# Relative tolerance (max |a - b| / max |eager|) for backends vs eager, per dtype name.
# bfloat16 keeps 8 significant bits (eps 2**-8): backends that sum in another order differ by several
# eps after a few layers, and CPU runs now load drafts in their own (usually bf16) dtype.
TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 6e-2}
CONTEXT_TOKENS = 24  # synthetic context length of the numeric level
# A causal layer's earlier slots must move less than this when the last slot changes (relative),
# a non-causal layer's at least this much: kernels compute rows independently, so a causal layer
# gives (near) bit-identical earlier rows while a bidirectional one moves them by percents.
CAUSAL_PROBE_TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
BASELINE_PROMPTS = 4  # prompts also decoded target-only (speedup, direct comparison)
TIMING_ROUNDS = 3  # interleaved target-only / speculative rounds over the baseline prompts
TINY_MODEL_BYTES = 256 << 20  # below this (target + draft) one CPU thread is fastest: no hand-offs per small op
BUSY_LOAD = 0.75  # 1-minute load average per usable core above which timings are reported unreliable
AUTO_TOKENS_WARN = 1.2  # without --min-acceptance-length, tau below this is reported as a warning
BUILTIN_TEXT_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Question: A train travels 60 km in 45 minutes. What is its average speed in km/h?\nAnswer:",
    "Once upon a time, in a small village by the sea,",
)


# ----------------------------------------------------------------------------- prompts

# Bounds on prompt input, checked before anything is tokenized or allocated (validation prompts are
# short; these are far above any useful one).
MAX_PROMPTS_BYTES = 64 << 20
MAX_PROMPTS = 4096
MAX_PROMPT_CHARS = 256 << 10  # characters of one text prompt
MAX_PROMPT_TOKENS = 8192  # token ids of one prompt, given or tokenized
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


# ----------------------------------------------------------------------------- target

def _target_paths(target: str | Path) -> tuple[Path, Path, bool]:
    """(model dir, config.json, has weights) of a --target given as a directory or a config.json."""
    path = Path(target)
    if path.is_file():
        return path.parent, path, False if path.name == "config.json" else True
    if not path.is_dir():
        raise DFlashError("target is neither a model directory nor a config.json", file=path)
    config = path / "config.json"
    if not config.exists():
        raise DFlashError("target directory has no config.json", file=path)
    weights = any(path.glob("*.safetensors"))
    return path, config, weights


# ----------------------------------------------------------------------------- numeric level

def _with_backend(draft, name: str):
    """The same loaded draft (weights and context cache shared) attending with another backend."""
    return draft.with_backend(name)


def _earlier_slots_change(a, b) -> float:
    """max |a - b| over block slots 0..B-2, relative to max |a| there (a, b: [B, H])."""
    return float((a[:-1] - b[:-1]).abs().max() / a[:-1].abs().max().clamp_min(1e-6))


def _single_layer(draft, i: int):
    """Draft layer i alone (final norm kept): to probe that layer's causality."""
    one = copy.copy(draft)
    one.layers = [draft.layers[i]]
    one.cache_k, one.cache_v = [draft.cache_k[i]], [draft.cache_v[i]]
    return one


def numeric_checks(ckpt: Checkpoint, *, device: str, dtype, backend: str, causal: bool | None,
                   block_size: int | None = None, seed: int = 0, progress: Callable[[str], None] | None = None,
                   draft_options: dict[str, Any] | None = None) -> tuple[list[Check], dict[str, bool], Any]:
    """(checks, backend -> serves this draft here, the loaded draft set to the decoding backend or None).
    `draft_options`: what load_draft is given to run the draft as served (per-query window, mask embedding)."""
    import torch

    from dflash_runtime.attention import BACKENDS, select_backend
    from dflash_runtime.model import load_draft, resolve_layer_causal

    spec = ckpt.spec
    dtype_name = str(dtype).removeprefix("torch.")
    layer_causal = resolve_layer_causal(spec, causal)
    sliding = "sliding_attention" in spec.layer_types and spec.sliding_window is not None
    dev_type = torch.device(device).type
    capable = {name: b.why_not(layer_causal, sliding, dev_type, dtype) is None for name, b in BACKENDS.items()}
    checks: list[Check] = []
    try:
        chosen = select_backend(backend, layer_causal, sliding, device, dtype)
    except DFlashError as exc:
        return [_check("backend", False, str(exc), value=backend, level="numeric")], capable, None
    say = progress or (lambda message: None)
    say(f"numeric: loading the draft ({dtype_name}, {device})")
    try:
        draft = load_draft(ckpt, device=device, dtype=dtype, backend="eager", causal=causal, **(draft_options or {}))
    except DFlashError as exc:
        return [_check("draft_loads", False, str(exc), level="numeric")], capable, None
    checks.append(_check("draft_loads", True, f"draft loaded ({dtype_name}, {device}); backend for decoding: "
                         f"{chosen}", value=chosen, level="numeric"))
    names = ["eager"] + ([n for n in BACKENDS if n != "eager" and capable[n]] if backend == "auto"
                         else [chosen] if chosen != "eager" else [])
    g = torch.Generator().manual_seed(seed)
    width, hidden, block = spec.context_width, spec.hidden_size, block_size or spec.block_size
    features = torch.randn(CONTEXT_TOKENS, width, generator=g).to(device)  # [T, A*Ht] ~ target states
    x = (torch.randn(block, hidden, generator=g) * 0.02).to(device)  # [B, H] ~ embedding rows
    x_moved = x.clone()
    x_moved[-1] = torch.randn(hidden, generator=g).to(device) * 0.02  # a different token in the last slot
    uniform = len(set(layer_causal)) == 1
    probe_tol = CAUSAL_PROBE_TOLERANCE[dtype_name]
    with torch.inference_mode(), warnings.catch_warnings():
        # eager FlexAttention is what is being checked here; its "compile me" advice is noise
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        draft.reset()
        draft.add_context(features, 0)
        outputs, probes = {}, {}
        for name in names:
            say(f"numeric: backend {name}")
            d = _with_backend(draft, name)
            out = d.block_hidden(x, CONTEXT_TOKENS).float()  # [B, H]
            outputs[name] = out
            bad = int((~torch.isfinite(out)).sum())
            checks.append(_check(f"finite_output.{name}", bad == 0, f"{name}: {bad} of {out.numel()} block outputs "
                                 "are NaN/Inf" if bad else f"{name}: all block outputs finite", value=bad,
                                 threshold=0, level="numeric"))
            # How much the earlier slots move when the last slot holds another token: per layer for a
            # mixed draft; for a uniform one the whole stack answers for every layer at once.
            if uniform:
                probes[name] = [_earlier_slots_change(out, d.block_hidden(x_moved, CONTEXT_TOKENS).float())]
            else:
                probes[name] = []
                for i in range(len(layer_causal)):
                    one = _single_layer(d, i)
                    probes[name].append(_earlier_slots_change(one.block_hidden(x, CONTEXT_TOKENS).float(),
                                                              one.block_hidden(x_moved, CONTEXT_TOKENS).float()))
        ref = outputs["eager"]
        scale = ref.abs().max().clamp_min(1e-6)
        tol = TOLERANCE[dtype_name]
        for name in names[1:]:
            diff = float((outputs[name] - ref).abs().max() / scale)
            ok = diff <= tol if diff == diff else False
            checks.append(_check(f"backend_agreement.{name}", ok, f"{name} vs eager: max relative difference "
                                 f"{diff:.2e} ({dtype_name} tolerance {tol:g})", value=diff, threshold=tol,
                                 level="numeric"))
    mode = ", ".join(f"{i}:{'causal' if c else 'non-causal'}" for i, c in enumerate(layer_causal))
    for name in names:
        wrong = []
        for i, change in enumerate(probes[name]):
            what = "the draft" if uniform else f"layer {i}"
            if layer_causal[i] and not change <= probe_tol:
                wrong.append(f"{what} is declared causal but earlier block slots changed by {change:.1e} when the "
                             "last slot changed")
            if not layer_causal[i] and not change > probe_tol:
                wrong.append(f"{what} is declared non-causal but earlier block slots did not see the last slot "
                             f"(change {change:.1e})")
        checks.append(_check(f"causality_behaviour.{name}", not wrong, f"{name}: " + "; ".join(wrong) if wrong else
                             f"{name}: block attention behaves as declared ({mode})", value=probes[name],
                             threshold=probe_tol, level="numeric"))
    draft.reset()
    return checks, capable, _with_backend(draft, chosen)


# ----------------------------------------------------------------------------- end-to-end level

def end_to_end(ckpt: Checkpoint, target_dir: Path, prompt_ids: list[list[int]], *, draft=None, device: str, dtype,
               target_dtype=None, backend: str, target_backend: str, causal: bool | None, block_size: int | None,
               max_new_tokens: int, temperature: float, min_acceptance_length: float | None,
               min_position_rates: list[float] | None, stop_token_ids: Iterable[int], seed: int,
               draft_sampling: str = "greedy", device_map: str | None = None, max_memory: dict | None = None,
               min_speedup: float | None = None, timing_rounds: int = TIMING_ROUNDS,
               progress: Callable[[str], None] | None = None, compile: bool = False,
               draft_options: dict[str, Any] | None = None, last_layer_post_norm: bool = False
               ) -> tuple[list[Check], AcceptanceStats | None]:
    from dflash_runtime import check_pair, load_draft, load_target, speculative_generate, target_generate

    say = progress or (lambda message: None)
    checks: list[Check] = []
    target_dtype = target_dtype or dtype
    say(f"end to end: loading the target {target_dir} ({str(target_dtype).removeprefix('torch.')}, "
        + (f"device map {device_map}" if device_map or max_memory else device) + ")")
    with _loading_bar(progress is not None):
        target = load_target(target_dir, device=device, dtype=target_dtype, attn_implementation=target_backend,
                             trust_remote_code=False, device_map=device_map, max_memory=max_memory, compile=compile)
    if last_layer_post_norm:  # the engine feeds the draft the last layer's output after the final norm
        target.feed_after_final_norm({target.num_layers - 1})
    if target.offloaded:
        say("end to end: target placed as " + ", ".join(f"{n} module(s) on {d}" for d, n in target.offloaded.items())
            + f"; the draft runs on {target.draft_device}")
    try:
        if draft is None:  # not loaded by the numeric level
            say(f"end to end: loading the draft ({str(dtype).removeprefix('torch.')}, {target.draft_device})")
            draft = load_draft(ckpt, device=target.draft_device, dtype=dtype, backend=backend, causal=causal,
                               **(draft_options or {}))
        elif draft.device != target.draft_device:
            draft = load_draft(ckpt, device=target.draft_device, dtype=dtype, backend=draft.backend, causal=causal,
                               **(draft_options or {}))
        if compile:  # static caches and compiled steps; the warm-up below compiles them
            draft = draft.with_backend(draft.backend, compile=True)
        check_pair(draft, target)
    except DFlashError as exc:
        return [_check("pair_compatible", False, str(exc), level="end_to_end")], None
    checks.append(_check("pair_compatible", True, f"draft and target {target_dir} run together "
                         f"({target.num_layers} target layers, hidden {target.hidden_size})", level="end_to_end"))
    block = block_size or draft.block_size
    stop = tuple(stop_token_ids)
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, stop_token_ids=stop, seed=seed)
    spec_kw = dict(kw, block_size=block, draft_sampling=draft_sampling)
    base_n = min(BASELINE_PROMPTS, len(prompt_ids))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the block-size note is reported once, as a check, below
        say("end to end: warm-up")
        # one step of each path (first-call allocations and lazy initialisation): a longer warm-up costs
        # minutes at real size on CPU, where a draft that accepts little makes every token a verify step
        speculative_generate(draft, target, prompt_ids[0], **{**spec_kw, "max_new_tokens": 2})
        target_generate(target, prompt_ids[0], **{**kw, "max_new_tokens": 2})
        runs = []
        for i, p in enumerate(prompt_ids, 1):
            runs.append(speculative_generate(draft, target, p, **spec_kw))
            say(f"end to end: prompt {i}/{len(prompt_ids)}: {runs[-1].stats.new_tokens} tokens, "
                f"tau {runs[-1].stats.tau:.2f}")
        # Timing: target-only and speculative decoding of the first prompts, interleaved (the order
        # alternates per round) so that both see the same machine; the speedup is the ratio of exactly
        # the tokens/s reported, and the rounds give its spread.
        rounds: list[tuple[list, list]] = []
        for r in range(timing_rounds):
            base_round, spec_round = [], []
            for p in prompt_ids[:base_n]:
                if r % 2 == 0:
                    base_round.append(target_generate(target, p, **kw))
                    spec_round.append(speculative_generate(draft, target, p, **spec_kw))
                else:
                    spec_round.append(speculative_generate(draft, target, p, **spec_kw))
                    base_round.append(target_generate(target, p, **kw))
            rounds.append((base_round, spec_round))
            say(f"end to end: timing round {r + 1}/{timing_rounds}: speedup "
                f"{_ratio(_tokens_per_s(spec_round), _tokens_per_s(base_round)):.2f}x")
    baselines = rounds[0][0]
    timed_base = [g for base_round, _ in rounds for g in base_round]
    timed_spec = [g for _, spec_round in rounds for g in spec_round]
    num = sum(r.stats.num_drafts for r in runs)
    accepted = sum(r.stats.accepted for r in runs)
    tau = 1.0 + accepted / num if num else 1.0
    rates = [sum(r.stats.per_position_rates[k] * r.stats.num_drafts for r in runs
                 if k < len(r.stats.per_position_rates)) / num if num else 0.0 for k in range(block - 1)]
    spec_tokens = sum(r.stats.new_tokens for r in runs)
    spec_tps, base_tps = _tokens_per_s(timed_spec), _tokens_per_s(timed_base)
    speedup = _ratio(spec_tps, base_tps)
    per_round = [_ratio(_tokens_per_s(sr), _tokens_per_s(br)) for br, sr in rounds]
    if temperature == 0:
        bad = []  # (prompt, first token that is not the target's greedy choice)
        for i, (p, r) in enumerate(zip(prompt_ids, runs)):
            at = _first_non_greedy(target, p, r.tokens)
            if at is None and i < base_n and r.tokens != baselines[i].tokens:
                at = _first_difference(r.tokens, baselines[i].tokens)
            if at is not None:
                bad.append((i, at))
        equal = len(runs) - len(bad)
        msg = (f"speculative output is the target's greedy output on all {len(runs)} prompts (every token the "
               f"target's argmax after the tokens before it; identical to target-only decoding on the first "
               f"{base_n})" if not bad else f"prompt {bad[0][0] + 1}: token {bad[0][1]} of the speculative output "
               f"is not the target's greedy choice ({equal}/{len(runs)} prompts equal)")
        checks.append(_check("greedy_output_equal", not bad, msg, value=f"{equal}/{len(runs)}",
                             threshold=f"{len(runs)}/{len(runs)}", level="end_to_end"))
    else:
        equal = None
        checks.append(_check("greedy_output_equal", None, f"temperature {temperature}: outputs are samples; "
                             "equality with target-only decoding is only defined for greedy decoding",
                             level="end_to_end"))
    if min_acceptance_length is not None:
        # compared as reported (4 decimals): a threshold equal to the tau a report showed passes
        checks.append(_check("acceptance_length", round(tau, 4) >= min_acceptance_length,
                             f"tau {tau:.3f} over {num} draft steps (block {block}); required "
                             f">= {min_acceptance_length}", value=round(tau, 4), threshold=min_acceptance_length,
                             level="end_to_end"))
    else:
        checks.append(_check("acceptance_length", tau >= AUTO_TOKENS_WARN,
                             f"tau {tau:.3f} over {num} draft steps (block {block}); no --min-acceptance-length "
                             f"given" + ("" if tau >= AUTO_TOKENS_WARN else ": the draft accepts almost nothing"),
                             value=round(tau, 4), threshold=None, level="end_to_end", bad="warn"))
    if min_position_rates:
        low = [f"position {k + 1}: {rates[k]:.3f} < {m}" for k, m in enumerate(min_position_rates)
               if k < len(rates) and rates[k] < m]
        extra = len(min_position_rates) > len(rates)
        checks.append(_check("position_rates", not low and not extra,
                             "; ".join(low) if low else (f"{len(min_position_rates)} thresholds for {len(rates)} "
                             "draft positions" if extra else "every position meets its threshold"),
                             value=[round(r, 4) for r in rates], threshold=list(min_position_rates),
                             level="end_to_end"))
    checks.append(_speedup_check(speedup, per_round, spec_tps, base_tps, base_n, timing_rounds, min_speedup))
    if block != draft.block_size:
        checks.append(_check("block_size_override", False, f"run at block size {block}; the draft was trained "
                             f"at {draft.block_size}", value=block, threshold=draft.block_size,
                             level="end_to_end", bad="warn"))
    stats = AcceptanceStats(prompts=len(runs), new_tokens=spec_tokens, block_size=block,
                            max_new_tokens=max_new_tokens, temperature=temperature, draft_sampling=draft_sampling,
                            acceptance_length=round(tau, 4), per_position_rates=[round(r, 4) for r in rates],
                            num_drafts=num, accepted=accepted, outputs_equal=equal, baseline_prompts=base_n,
                            timing_rounds=timing_rounds, speculative_tokens_per_s=spec_tps,
                            target_tokens_per_s=base_tps, speedup=speedup,
                            speedup_range=[min(per_round), max(per_round)],
                            speculative_tokens_per_s_range=_tps_range([sr for _, sr in rounds]),
                            target_tokens_per_s_range=_tps_range([br for br, _ in rounds]))
    return checks, stats


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def _tokens_per_s(generations) -> float:
    """New tokens over decode time (prefill excluded, as z-lab's time per output token)."""
    time_s = sum(g.stats.total_time_s - g.stats.prefill_time_s for g in generations)
    return sum(g.stats.new_tokens for g in generations) / time_s if time_s > 0 else 0.0


def _tps_range(rounds) -> list[float]:
    per_round = [_tokens_per_s(r) for r in rounds]
    return [min(per_round), max(per_round)]


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_load() -> tuple[float | None, bool]:
    """(1-minute load average, whether it makes timings unreliable on the usable cores)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None, False
    return load, load > BUSY_LOAD * usable_cores()


def _speedup_check(speedup: float, per_round: list[float], spec_tps: float, base_tps: float, prompts: int,
                   rounds: int, min_speedup: float | None) -> Check:
    """Speedup of the timed runs: a gate only with --min-speedup; a warning when the machine is busy."""
    import torch

    load, busy = machine_load()
    threads = torch.get_num_threads()
    msg = (f"speedup {speedup:.2f}x ({spec_tps:.1f} vs {base_tps:.1f} tok/s over {rounds} interleaved round(s) of "
           f"{prompts} prompt(s); per round {min(per_round):.2f}x-{max(per_round):.2f}x; {threads} thread(s))")
    if busy:
        msg += (f"; load average {load:.1f} on {usable_cores()} core(s): other work competes for the CPU, timings "
                "are unreliable")
    if min_speedup is not None:
        return _check("speedup", speedup >= min_speedup, msg + f"; required >= {min_speedup}",
                      value=round(speedup, 4), threshold=min_speedup, level="end_to_end")
    return _check("speedup", not busy, msg + "; informational (no --min-speedup given)", value=round(speedup, 4),
                  level="end_to_end", bad="warn")


def _first_non_greedy(target, prompt: list[int], tokens: list[int]) -> int | None:
    """Index of the first generated token that is not the target's argmax given everything before it
    (one teacher-forced target pass), or None when the whole output is the target's greedy output."""
    import torch

    target.set_capture([])
    target.reset()
    ids = torch.tensor(prompt + tokens, dtype=torch.long)
    logits, _ = target.forward(ids, 0)  # [P+N, V]
    greedy = logits[len(prompt) - 1:-1].argmax(dim=-1).tolist()  # the target's choice for each new token
    target.reset()
    return next((i for i, (t, g) in enumerate(zip(tokens, greedy)) if t != g), None)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# ----------------------------------------------------------------------------- the command

def _environment(device: str, dtype_name: str, backends: dict[str, bool], draft_backend: str | None,
                 target_backend: str | None, causal: bool | None, *, threads: int | None = None,
                 target_dtype: str | None = None, device_map: str | None = None,
                 draft_sampling: str = "greedy") -> Environment:
    versions: dict[str, str | None] = {"python": platform.python_version(), "dflash_convert": __version__}
    for mod in ("torch", "transformers", "numpy"):
        m = sys.modules.get(mod)
        versions[mod] = getattr(m, "__version__", None) if m is not None else None
    torch = sys.modules.get("torch")
    load, _ = machine_load()
    return Environment(versions=versions, platform=platform.platform(), device=device, dtype=dtype_name,
                       target_dtype=target_dtype, device_map=device_map, draft_sampling=draft_sampling,
                       backends=backends, draft_backend=draft_backend, target_backend=target_backend,
                       causal_override=causal, threads=threads or (torch.get_num_threads() if torch is not None
                                                                   else None),
                       cores=usable_cores(), load_average=round(load, 2) if load is not None else None)


def _causal_override_check(ckpt: Checkpoint, causal: bool | None) -> Check | None:
    if causal is None:
        return None
    declared = list(ckpt.spec.layer_causal)
    differ = [i for i, c in enumerate(declared) if c != causal]
    mode = "causal" if causal else "non-causal"
    return _check("causal_override", not differ,
                  f"run forced {mode}; layers {differ} were trained " + ("non-causal" if causal else "causal") +
                  ": a deployment forcing this mode runs the draft unlike its training" if differ else
                  f"run forced {mode}, as every layer declares", value=mode, threshold=declared, level="static")


def validate(checkpoint_path: str | Path, *, target: str | Path | None = None,
             prompts: str | Path | Sequence[str | list[int]] | None = None, max_new_tokens: int = 64,
             block_size: int | None = None, temperature: float = 0.0, device: str = "auto", dtype: str = "auto",
             backend: str = "auto", target_backend: str = "sdpa", causal: bool | None = None,
             min_acceptance_length: float | None = None, min_position_rates: list[float] | None = None,
             levels: Iterable[str] | None = None, checkpoint_revision: str | None = None,
             target_revision: str | None = None, target_name: str | None = None, seed: int = 0,
             allow_pickle: bool = False, draft_sampling: str = "greedy", device_map: str | None = None,
             max_memory: dict[str, int] | None = None, threads: int | None = None,
             min_speedup: float | None = None, keep_going: bool = False, timing_rounds: int = TIMING_ROUNDS,
             progress: Callable[[str], None] | None = None, engine: str | None = None,
             compile: bool = False) -> ValidationReport:
    """Run every level the inputs allow (or those in `levels`) and report which ran and why others did not.

    `engine` (vllm, sglang, zlab): run the draft as that engine would serve it (its ids order, per-layer
    causality, block size, vocabulary handling) and fail `engine_fidelity` where it differs from training;
    that failure does not skip the runtime levels, whose acceptance is then what the deployment gets.

    dtype "auto" loads each checkpoint in its own dtype (its config's `dtype`/`torch_dtype`, else the
    dtype its weights are stored in). threads None picks 1 on CPU for tiny pairs, torch's default
    otherwise (the choice is in the report). Raises DFlashError, before loading anything, when the
    memory plan says the run does not fit."""
    t0 = time.perf_counter()
    say = progress or (lambda message: None)
    wanted = list(levels) if levels is not None else list(LEVELS)
    unknown = [lv for lv in wanted if lv not in LEVELS]
    if unknown:
        raise UsageError(f"unknown validation level(s) {unknown}; choose from {', '.join(LEVELS)}")
    if block_size is not None and not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise UsageError(f"--block-size must be in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}], got {block_size}")
    if not 1 <= max_new_tokens <= MAX_PROMPT_TOKENS:
        raise UsageError(f"--max-new-tokens must be in [1, {MAX_PROMPT_TOKENS}], got {max_new_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise UsageError(f"--temperature must be a finite number >= 0, got {temperature}")
    if min_acceptance_length is not None and not (math.isfinite(min_acceptance_length) and min_acceptance_length >= 0):
        raise UsageError(f"--min-acceptance-length must be a finite number >= 0, got {min_acceptance_length}")
    if min_position_rates and not all(math.isfinite(r) and 0 <= r <= 1 for r in min_position_rates):
        raise UsageError(f"--min-position-rates must be rates in [0, 1], got {list(min_position_rates)}")
    if draft_sampling not in DRAFT_SAMPLING:
        raise UsageError(f"--draft-sampling {draft_sampling!r}: choose {' or '.join(DRAFT_SAMPLING)}")
    if device_map is not None and device_map not in DEVICE_MAPS:
        raise UsageError(f"--device-map {device_map!r}: choose {', '.join(DEVICE_MAPS)}")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be at least 1, got {threads}")
    if timing_rounds < 1:
        raise UsageError(f"timing rounds must be at least 1, got {timing_rounds}")
    if max_memory is not None and device_map is None:
        device_map = "auto"  # a memory budget means placement by the device map
    duplicates = duplicate_tensors_check(checkpoint_path)
    if duplicates.failed:  # the checkpoint cannot be opened: report the one problem found
        return ValidationReport(
            tool_version=__version__, checkpoint=str(checkpoint_path), checkpoint_revision=checkpoint_revision,
            target=target_name or (str(target) if target is not None else None), target_revision=target_revision,
            levels_run=["static"], levels_skipped={lv: "the checkpoint stores a tensor twice" for lv in LEVELS[1:]},
            checks=[duplicates], environment=_environment(device, dtype, {}, None, None, causal),
            duration_s=round(time.perf_counter() - t0, 3), passed=False)
    ckpt = open_checkpoint(checkpoint_path, allow_pickle=allow_pickle)
    target_dir = target_config = None
    target_has_weights = False
    info = None
    if target is not None:
        target_dir, target_config, target_has_weights = _target_paths(target)
        info = mapping.target_info(read_json(target_config), target_name or str(target), file=str(target_config))
    view = None
    if engine is not None:
        if causal is not None:
            raise UsageError("give --engine or --causal/--non-causal, not both (the engine decides causality)")
        view = engines.serving_view(ckpt, engine, num_target_layers=info.num_layers if info else None)
        trained, ckpt = ckpt, engines.applied_checkpoint(ckpt, view)
    draft_options = {"window_per_query": view is not None and view.window_semantics == "per_query"}  # engines' window
    mask_check, draft_options["mask_embedding"] = _mask_embedding(
        ckpt, allow_pickle=allow_pickle,
        ignored=view is not None and engines.ENGINES_BY_KEY[view.engine].mask_embedding == "ignored")
    last_layer_post_norm = view is not None and engines.ENGINES_BY_KEY[view.engine].last_layer == "post_norm"
    prompt_list = read_prompts(prompts) if isinstance(prompts, (str, Path)) else prompts
    # end to end needs the target; fail on unusable prompts before any slow work
    prompt_ids = None
    if "end_to_end" in wanted and target_has_weights:
        avoid = {i for i in (ckpt.spec.mask_token_id, info.pad_token_id, *info.eos_token_ids) if i is not None}
        prompt_ids, _ = tokenize_prompts(prompt_list, target_dir, info.vocab_size, avoid,
                                         source=str(prompts) if isinstance(prompts, (str, Path)) else "prompts")

    checks: list[Check] = []
    run: list[str] = []
    skipped: dict[str, str] = {}
    backends: dict[str, bool] = {}
    draft_backend = None
    report_stats = None
    loaded = None  # the draft the numeric level loaded, reused end to end
    dev_name, dtype_name, target_dtype_name = device, dtype, None
    chosen_threads = None

    if "static" in wanted:
        say("static: config, tensor headers" + (" and the target's config" if info is not None else ""))
        checks += [duplicates, *checkpoint_checks(trained if view is not None else ckpt, scan=False)]
        if info is not None:  # the target answers what the draft config alone could not
            answered = {"target_layer_ids_range", "mask_token_id_special"}
            checks = [c for c in checks if not (c.status == "skip" and c.name in answered)]
            checks += target_checks(ckpt.spec, info, ckpt=ckpt)
        checks += [c for c in (_causal_override_check(ckpt, causal), mask_check) if c is not None]
        run.append("static")
        static_failed = [c.name for c in checks if c.status == "fail"]
        say(f"static: {len(checks)} checks, " + (f"failed: {', '.join(static_failed)}" if static_failed else
                                                  "none failed"))
        if static_failed and not keep_going:
            why = f"static checks failed ({', '.join(static_failed)}); --keep-going runs it anyway"
            for lv in ("numeric", "end_to_end"):
                if lv in wanted:
                    skipped[lv] = why
            wanted = [lv for lv in wanted if lv not in skipped]
    if view is not None:
        checks.append(_engine_fidelity_check(view))
        if not view.loads:
            for lv in ("numeric", "end_to_end"):
                if lv in wanted:
                    skipped[lv] = f"{view.title} {view.version} would not load this checkpoint (engine_fidelity)"
            wanted = [lv for lv in wanted if lv not in skipped]
    e2e_runs = "end_to_end" in wanted and target_has_weights
    needs_torch = "numeric" in wanted or e2e_runs
    previous_threads = None
    try:
        if needs_torch:
            import torch

            from dflash_runtime.device import resolve_device, resolve_dtype

            dev = resolve_device(device)
            dev_name = str(dev)
            draft_dtype_name = dtype if dtype != "auto" else _own_dtype({"dtype": ckpt.spec.dtype}, ckpt.tensors)
            torch_dtype = resolve_dtype(draft_dtype_name)
            dtype_name = str(torch_dtype).removeprefix("torch.")
            target_torch_dtype = None
            if e2e_runs:
                target_dtype_name = dtype if dtype != "auto" else _own_dtype(read_json(target_config),
                                                                            memory.weight_headers(target_dir))
                target_torch_dtype = resolve_dtype(target_dtype_name)
                target_dtype_name = str(target_torch_dtype).removeprefix("torch.")
            # the memory plan, before anything is loaded
            spec = ckpt.spec
            draft_tensors = [ckpt.tensors[n] for n in catalogue.expected_shapes(spec) if n in ckpt.tensors]
            block = block_size or spec.block_size
            sequence = (max(map(len, prompt_ids)) if prompt_ids else CONTEXT_TOKENS) + max_new_tokens + block
            plan = memory.plan(draft_tensors, dtype_name, device=dev_name, target_dir=target_dir if e2e_runs else None,
                               target_dtype=target_dtype_name, draft_layers=spec.num_layers,
                               draft_kv_width=spec.num_kv_heads * spec.head_dim, sequence=sequence, block=block,
                               device_map=device_map if e2e_runs else None, max_memory=max_memory)
            if not plan.fits:
                raise DFlashError(plan.refusal())
            say(f"memory plan: {plan.describe()}")
            if dev.type == "cpu":
                previous_threads = torch.get_num_threads()
                tiny = plan.draft_bytes + plan.target_bytes < TINY_MODEL_BYTES
                chosen_threads = threads or (1 if tiny else previous_threads)
                torch.set_num_threads(chosen_threads)
                say(f"CPU threads: {chosen_threads}" + ("" if threads else " (tiny models run fastest on one)"
                                                        if tiny else " (torch's default)"))
        if "numeric" in wanted:
            say("numeric: value scan")
            checks += scan_checks(ckpt)
            numeric, backends, loaded = numeric_checks(ckpt, device=dev_name, dtype=torch_dtype, backend=backend,
                                                       causal=causal, block_size=block_size, seed=seed, progress=say,
                                                       draft_options=draft_options)
            draft_backend = loaded.backend if loaded is not None else None
            checks += numeric
            run.append("numeric")
            failed_numeric = [c.name for c in numeric if c.status == "fail"]
            say("numeric: " + (f"failed: {', '.join(failed_numeric)}" if failed_numeric else "none failed"))
        if "end_to_end" in wanted:
            if target is None:
                skipped["end_to_end"] = "no --target given"
            elif not target_has_weights:
                skipped["end_to_end"] = f"target {target} has no weights (config only)"
            elif any(c.name in ("draft_loads", "backend") and c.status == "fail" for c in checks):
                skipped["end_to_end"] = "the draft cannot be loaded (see the numeric checks)"
            else:
                stop = info.eos_token_ids if info is not None else ()
                e2e, stats = end_to_end(ckpt, target_dir, prompt_ids, draft=loaded, device=dev_name, dtype=torch_dtype,
                                        target_dtype=target_torch_dtype, backend=backend,
                                        target_backend=target_backend, causal=causal, block_size=block_size,
                                        max_new_tokens=max_new_tokens, temperature=temperature,
                                        min_acceptance_length=min_acceptance_length,
                                        min_position_rates=min_position_rates, stop_token_ids=stop, seed=seed,
                                        draft_sampling=draft_sampling, device_map=device_map, max_memory=max_memory,
                                        min_speedup=min_speedup, timing_rounds=timing_rounds, progress=progress,
                                        draft_options=draft_options, last_layer_post_norm=last_layer_post_norm,
                                        compile=compile)
                checks += e2e
                run.append("end_to_end")
                report_stats = stats
    finally:
        if previous_threads is not None:
            import torch

            torch.set_num_threads(previous_threads)
    for lv in LEVELS:
        if lv not in run and lv not in skipped:
            skipped[lv] = "not requested"
    env = _environment(dev_name, dtype_name, backends, draft_backend, target_backend if "end_to_end" in run else None,
                       causal, threads=chosen_threads, target_dtype=target_dtype_name, device_map=device_map,
                       draft_sampling=draft_sampling)
    return ValidationReport(
        tool_version=__version__, checkpoint=str(checkpoint_path), checkpoint_format=ckpt.format,
        checkpoint_revision=checkpoint_revision, target=target_name or (str(target) if target is not None else None),
        target_revision=target_revision, levels_run=run, levels_skipped=skipped, checks=checks,
        acceptance=report_stats, environment=env,
        duration_s=round(time.perf_counter() - t0, 3), passed=not any(c.status == "fail" for c in checks))


def _own_dtype(raw_config: dict, tensors) -> str:
    """A checkpoint's own dtype: its config's, else the one its floating weights are stored in, else float32."""
    return memory.config_dtype(raw_config) or memory.stored_dtype(tensors) or "float32"


def _mask_embedding(ckpt: Checkpoint, *, allow_pickle: bool, ignored: bool) -> tuple[Check | None, Any]:
    """(check, the vector the runtime levels embed the mask slots with, or None) for a mask_embedding.pt beside
    the weights: loaded once (pass; as vLLM and SGLang use it), unusable (fail), or present but a pickle not
    allowed (warn). No check: no file, or an engine that ignores it (--engine zlab: engine_fidelity says so)."""
    name = catalogue.MASK_EMBEDDING_FILE
    if ignored or not any(f.name == name for f in ckpt.companion_files):
        return None, None
    if not allow_pickle:
        return Check(name="mask_embedding", status="warn", value="not loaded", message=f"{name} is a pickle and "
                     "was not loaded: the runtime levels embed the mask slots with the target's row of mask_token_id "
                     "(as z-lab does), vLLM and SGLang with this file; --allow-pickle loads it (weights_only)"), None
    try:
        vector = ckpt.load_mask_embedding(allow_pickle=True)
    except DFlashError as exc:
        return Check(name="mask_embedding", status="fail", value=name, message=str(exc)), None
    return Check(name="mask_embedding", status="pass", value=list(vector.shape),
                 message=f"{name} loaded (weights_only): the runtime levels embed the mask slots with it, as vLLM "
                         "and SGLang do"), vector


def _engine_fidelity_check(view) -> Check:
    errors = [d for d in view.divergences if d.severity == "error"]
    warns = [d for d in view.divergences if d.severity == "warning"]
    shown = errors or warns
    message = (f"{view.title} {view.version}: " + ("; ".join(f"{d.field}: {d.consequence} (fix: {d.fix})"
                                                          for d in shown) if shown else "serves the draft as trained"))
    return Check(name="engine_fidelity", status="fail" if errors or not view.loads else "warn" if warns else "pass",
                 value=view.engine, threshold="as trained", message=message, level="static")


@contextlib.contextmanager
def _loading_bar(shown: bool):
    """transformers' own weight-loading bar, off when no progress is wanted (-q): its public switch, restored after."""
    from transformers.utils import logging as transformers_logging

    was = transformers_logging.is_progress_bar_enabled()
    if not shown:
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not shown:
            transformers_logging.enable_progress_bar()


def validate_output_dir(path: str | Path, progress: Callable[[str], None] | None = None) -> ValidationReport:
    """Static + numeric validation of a freshly converted checkpoint (convert --validate, before the rename)."""
    return validate(path, levels=("static", "numeric"), progress=progress)
