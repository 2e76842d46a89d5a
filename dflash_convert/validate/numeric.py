"""The numeric level (draft only): the draft runs on synthetic context features with every attention
backend that serves it on the device (or the one asked for): outputs finite, backends agree with
`eager` within the dtype's tolerance, each layer causal or not as declared (perturb the last block
slot: earlier slots must not move in a causal layer, must move in a non-causal one)."""

from __future__ import annotations

import warnings
from typing import Any, Callable

from dflash_convert.errors import DFlashError, NotRunnable
from dflash_convert.io.checkpoint import Checkpoint
from dflash_convert.validate import memory
from dflash_convert.validate.static import Check, make_check

# Relative tolerance (max |a - b| / max |eager|) for backends vs eager, per dtype name.
# bfloat16 keeps 8 significant bits (eps 2**-8): backends that sum in another order differ by several
# eps after a few layers, and CPU runs now load drafts in their own (usually bf16) dtype.
TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 6e-2}
CONTEXT_TOKENS = 24  # synthetic context length of the numeric level
# A causal layer's earlier slots must move less than this when the last slot changes (relative),
# a non-causal layer's at least this much: kernels compute rows independently, so a causal layer
# gives (near) bit-identical earlier rows while a bidirectional one moves them by percents.
CAUSAL_PROBE_TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def _earlier_slots_change(a, b) -> float:
    """max |a - b| over block slots 0..B-2, relative to max |a| there (a, b: [B, H])."""
    return float((a[:-1] - b[:-1]).abs().max() / a[:-1].abs().max().clamp_min(1e-6))


def numeric_checks(ckpt: Checkpoint, *, device: str, dtype, backend: str, causal: bool | None,
                   block_size: int, seed: int = 0, progress: Callable[[str], None] | None = None,
                   draft_options: dict[str, Any] | None = None) -> tuple[list[Check], dict[str, bool], Any]:
    """(checks, backend -> serves this draft here, the loaded draft set to the decoding backend or None).
    `block_size`: the run's block (resolved once by validate: --block-size or the first K's, else the draft's).
    `draft_options`: what load_draft is given to run the draft as served (per-query window, mask embedding)."""
    import torch

    from dflash_runtime.attention import BACKENDS, select_backend
    from dflash_runtime.draft_load import load_draft, resolve_layer_causal

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
        return [make_check("backend", False, str(exc), value=backend, level="numeric")], capable, None
    say = progress or (lambda message: None)
    say(f"numeric: loading the draft ({dtype_name}, {device})")
    try:
        draft = load_draft(ckpt, device=device, dtype=dtype, backend="eager", causal=causal, **(draft_options or {}))
    except NotRunnable as exc:  # the runtime's limit, not the draft's defect: no verdict
        raise DFlashError(f"could not run the draft: {exc}") from None
    except DFlashError as exc:
        return [make_check("draft_loads", False, str(exc), level="numeric")], capable, None
    checks.append(make_check("draft_loads", True, f"draft loaded ({dtype_name}, {device}); backend for decoding: "
                         f"{chosen}", value=chosen, level="numeric"))
    names = ["eager"] + ([n for n in BACKENDS if n != "eager" and capable[n]] if backend == "auto"
                         else [chosen] if chosen != "eager" else [])
    inputs = _synthetic_inputs(spec.context_width, spec.hidden_size, block_size, seed, device)
    outputs, probes = _run_backends(draft, names, layer_causal, inputs, say, checks)
    agreement = _agreement_checks(outputs, dtype_name)
    if any(c.status == "fail" for c in agreement) and dtype_name != "float32":
        agreement = _recheck_in_float32(ckpt, agreement, names, layer_causal, inputs, device, causal,
                                        draft_options, say)
    checks += agreement
    checks += _causality_checks(probes, layer_causal, CAUSAL_PROBE_TOLERANCE[dtype_name])
    draft.reset()
    return checks, capable, draft.with_backend(chosen)


def _synthetic_inputs(width: int, hidden: int, block: int, seed: int, device: str):
    """(context features [T, A*Ht] ~ target states, block inputs [B, H] ~ embedding rows, the same with
    another token in the last slot), seeded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    features = torch.randn(CONTEXT_TOKENS, width, generator=g).to(device)
    x = (torch.randn(block, hidden, generator=g) * 0.02).to(device)
    x_moved = x.clone()
    x_moved[-1] = torch.randn(hidden, generator=g).to(device) * 0.02
    return features, x, x_moved


def _run_backends(draft, names: list[str], layer_causal: list[bool], inputs, say,
                  checks: list[Check]) -> tuple[dict, dict]:
    """Each backend's block output on the same synthetic context ({name: [B, H]}), and how much the earlier
    slots move when the last slot holds another token ({name: [change per probed unit]}): per layer for a
    mixed draft; for a uniform one the whole stack answers for every layer at once. Appends finite_output."""
    import torch

    features, x, x_moved = inputs
    uniform = len(set(layer_causal)) == 1
    outputs, probes = {}, {}
    with torch.inference_mode(), warnings.catch_warnings():
        # eager FlexAttention is what is being checked here; its "compile me" advice is noise
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        draft.reset()
        draft.add_context(features, 0)
        for name in names:
            say(f"numeric: backend {name}")
            d = draft.with_backend(name)  # the same weights and context cache
            out = d.block_hidden(x, CONTEXT_TOKENS).float()  # [B, H]
            outputs[name] = out
            bad = int((~torch.isfinite(out)).sum())
            checks.append(make_check(f"finite_output.{name}", bad == 0, f"{name}: {bad} of {out.numel()} block outputs "
                                 "are NaN/Inf" if bad else f"{name}: all block outputs finite", value=bad,
                                 threshold=0, level="numeric"))
            units = [None] if uniform else [[i] for i in range(len(layer_causal))]  # all layers, or each alone
            probes[name] = [_earlier_slots_change(d.block_hidden(x, CONTEXT_TOKENS, layers=u).float(),
                                                  d.block_hidden(x_moved, CONTEXT_TOKENS, layers=u).float())
                            for u in units]
    return outputs, probes


def _agreement_checks(outputs: dict, dtype_name: str) -> list[Check]:
    """backend_agreement.<name>: each backend's output against eager's, relative to eager's largest."""
    ref = outputs["eager"]
    scale = ref.abs().max().clamp_min(1e-6)
    tol = TOLERANCE[dtype_name]
    checks = []
    for name, out in outputs.items():
        if name == "eager":
            continue
        diff = float((out - ref).abs().max() / scale)
        ok = diff <= tol if diff == diff else False
        checks.append(make_check(f"backend_agreement.{name}", ok, f"{name} vs eager: max relative difference "
                             f"{diff:.2e} ({dtype_name} tolerance {tol:g})", value=diff, threshold=tol,
                             level="numeric"))
    return checks


def _recheck_in_float32(ckpt: Checkpoint, agreement: list[Check], names: list[str], layer_causal: list[bool],
                        inputs, device: str, causal: bool | None, draft_options, say) -> list[Check]:
    """A backend over the low-precision tolerance is run again in float32 on the same inputs: where it agrees
    with eager there, the difference was the dtype's rounding spread through the layers (a quantized draft's
    dequantized weights spread it further), not the kernel, and the check passes saying both figures; a
    kernel that is wrong (a dropped mask, a wrong window) disagrees in float32 too and still fails."""
    import torch

    from dflash_runtime.draft_load import load_draft

    needed, free = memory.bytes_at(memory.draft_tensors(ckpt), "float32"), memory.device_available(device)
    if free is not None and needed > free:  # a verdict either way would be a guess
        raise DFlashError(f"{_names(agreement)}: over the low-precision tolerance, and the float32 re-check "
                          f"that tells rounding from a wrong kernel needs {needed / 2**30:.1f} GiB on {device}, "
                          f"{free / 2**30:.1f} GiB free: run with --dtype float32")
    say("numeric: backends disagree beyond the dtype's tolerance; running them again in float32")
    draft = load_draft(ckpt, device=device, dtype=torch.float32, backend="eager", causal=causal,
                       **(draft_options or {}))
    outputs32, _ = _run_backends(draft, names, layer_causal, inputs, say, [])
    exact = {c.name: c for c in _agreement_checks(outputs32, "float32")}
    del draft, outputs32
    rechecked = []
    for check in agreement:
        again = exact[check.name]
        if check.status == "fail" and again.status == "pass":
            check = make_check(check.name, True, f"{check.message}; in float32 {again.value:.2e} (tolerance "
                               f"{again.threshold:g}): the low-precision difference is rounding, not the kernel",
                               value=check.value, threshold=check.threshold, level="numeric")
        elif check.status == "fail":
            check = make_check(check.name, False, f"{check.message}; in float32 still {again.value:.2e} (tolerance "
                               f"{again.threshold:g})", value=check.value, threshold=check.threshold,
                               level="numeric")
        rechecked.append(check)
    return rechecked


def _names(agreement: list[Check]) -> str:
    return ", ".join(c.name for c in agreement if c.status == "fail")


def _causality_checks(probes: dict, layer_causal: list[bool], probe_tol: float) -> list[Check]:
    """causality_behaviour.<name>: a causal layer's earlier slots do not move, a non-causal one's do."""
    uniform = len(set(layer_causal)) == 1
    mode = ", ".join(f"{i}:{'causal' if c else 'non-causal'}" for i, c in enumerate(layer_causal))
    checks = []
    for name, changes in probes.items():
        wrong = []
        for i, change in enumerate(changes):
            what = "the draft" if uniform else f"layer {i}"
            if layer_causal[i] and not change <= probe_tol:
                wrong.append(f"{what} is declared causal but earlier block slots changed by {change:.1e} when the "
                             "last slot changed")
            if not layer_causal[i] and not change > probe_tol:
                wrong.append(f"{what} is declared non-causal but earlier block slots did not see the last slot "
                             f"(change {change:.1e})")
        checks.append(make_check(f"causality_behaviour.{name}", not wrong, f"{name}: " + "; ".join(wrong) if wrong else
                             f"{name}: block attention behaves as declared ({mode})", value=changes,
                             threshold=probe_tol, level="numeric"))
    return checks
