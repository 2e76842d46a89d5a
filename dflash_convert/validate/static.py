"""The static level of validate: checks of a DFlash checkpoint and its target's config, no weights run, one per
complaint users have (docs/formats.md section 9).

`checkpoint_checks` reads config.json and safetensors headers (plus the bytes of the small int
tensors `d2t` / `t2d`, through numpy); `scan=True` also reads every float tensor's bit patterns,
one chunk at a time, with numpy (NaN/Inf, all-zero, constant). torch is never imported. `target_checks` compares a draft with its target's config.json, no weights: a
Qwen3-8B-sized pair is checked in milliseconds. Every check names the tensor or field it is about.
"""

from __future__ import annotations

from dflash_convert.format import catalogue, compat, keys, kinds, mapping
from dflash_convert.format.catalogue import TensorProblem
from dflash_convert.io.checkpoint import Checkpoint
from dflash_convert.format.compat import Check, Level, Status  # noqa: F401 - the report rows, re-exported
from dflash_convert.format.compat import make_check
from dflash_convert.validate.quantized_checks import catalogue_shapes, quantized_checks, quantized_tensor_names
from dflash_convert.format.configs import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, DraftSpec
from dflash_convert.format.dtypes import DTYPES


def first_difference(a: list[int], b: list[int]) -> int:
    """Index of the first token where two outputs differ (the shorter one's length when one extends the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _first(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" (+{len(items) - n} more)" if len(items) > n else "")


FC, LM_HEAD, D2T, T2D = (catalogue.name(k) for k in ("fc", "lm_head", "d2t", "t2d"))


# ----------------------------------------------------------------------------- checkpoint (config + headers)

def checkpoint_checks(ckpt: Checkpoint, *, scan: bool = False) -> list[Check]:
    """Every problem docs/formats.md section 9 lists that a checkpoint alone can show."""
    spec = ckpt.spec
    problems = catalogue.tensor_problems(spec, catalogue_shapes(ckpt))
    checks = [
        _block_size(spec),
        *_legacy_speculative_tokens(spec),
        *_mask_token(spec),
        *_layer_ids(spec),
        _fc_width(ckpt),
        _attention_shapes(spec, problems),
        *_tensor_set(ckpt, problems),
        *_family(spec, problems),
        *_vocab_map(ckpt),
        _dtypes(ckpt),
        *quantized_checks(ckpt),
        _causality(spec),
        _verifier(spec),
        *_misspelled_keys(ckpt),
    ]
    if scan:
        checks += scan_checks(ckpt)
    return checks


def _misspelled_keys(ckpt: Checkpoint) -> list[Check]:
    """A warning for each config key no reader knows that is a letter or two from one that is absent: no engine
    reads it, so the draft is served as if the key were not there."""
    typos = mapping.misspelled_keys(ckpt.raw_config)
    return [make_check("config_keys", False, "; ".join(f"`{found}` is a key no engine reads: did you mean `{meant}`?"
                                                       for found, meant in typos.items()),
                       value=sorted(typos), bad="warn")] if typos else []


def _block_size(spec: DraftSpec) -> Check:
    """Present (its range, MIN_BLOCK_SIZE..MAX_BLOCK_SIZE, is enforced when the config is parsed)."""
    b, bounds = spec.block_size, f"[{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}]"
    if b is None:
        return make_check("block_size", False, "config has no block_size: engines fall back to their own default "
                          "(16 in SGLang), which may not be what the draft was trained for", threshold=bounds)
    return make_check("block_size", True, f"field `block_size` = {b}", value=b, threshold=bounds)


def _legacy_speculative_tokens(spec: DraftSpec) -> list[Check]:
    """A warning, only on configs in speculators' pre-2026-04-21 convention (speculative_tokens = block_size)."""
    note = mapping.legacy_speculative_tokens_warning(spec)
    return [make_check("speculative_tokens", False, note, value=spec.legacy_speculative_tokens,
                       threshold=f"block_size - 1 = {(spec.block_size or 1) - 1}", bad="warn")] if note else []


def _mask_token(spec: DraftSpec) -> list[Check]:
    m, vocab = spec.mask_token_id, spec.vocab_size
    if m is None:
        return [make_check("mask_token_id", False, "config has no mask_token_id: engines cannot fill the block "
                       "(pass --mask-token-id when converting)", threshold=f"< {vocab}")]
    pad, eos = mapping.special_ids(spec.decoder.get("pad_token_id"), spec.decoder.get("eos_token_id"))
    return [compat.mask_range_check(m, vocab, source="the draft config"),
            compat.mask_special_check(m, pad, eos, source="the draft config")]


def _layer_ids(spec: DraftSpec) -> list[Check]:
    ids = spec.target_layer_ids
    if ids is None:
        return [make_check("target_layer_ids", False, "config has no target layer ids; engines would guess them "
                       "(acceptance collapses when the guess is wrong: sglang #37475, z-lab/dflash #156)")]
    problems = []
    if any(i < 0 for i in ids):
        problems.append("negative ids")
    if len(set(ids)) != len(ids):
        problems.append("duplicate ids")
    if list(ids) != sorted(ids):
        problems.append("not in increasing order (engines capture target layers in layer order, so features "
                        "reach fc in a different order than listed)")
    checks = [make_check("target_layer_ids", not problems and len(ids) > 0,
                     f"target layer ids {ids}: " + ("; ".join(problems) if problems else
                                                   "non-empty, unique, increasing" if ids else "empty"),
                     value=list(ids), threshold="unique, increasing, >= 0")]
    n = spec.num_target_layers
    if n is None:
        checks.append(make_check("target_layer_ids_range", None, "num_target_layers unknown: pass --target to check "
                             "the ids against the target's layers", value=list(ids)))
    else:
        checks.append(compat.layer_ids_check(ids, n, "the target (num_target_layers)", name="target_layer_ids_range"))
    return checks


def _fc_width(ckpt: Checkpoint) -> Check:
    spec, fc = ckpt.spec, catalogue_shapes(ckpt).get(FC)  # a quantized fc by its unquantized shape
    if fc is None:
        return make_check("fc_width", False, f"tensor `{FC}` is missing", threshold=spec.context_width)
    if spec.context_width is None:
        return make_check("fc_width", None, f"no target layer ids: the width of `{FC}` cannot be checked",
                      value=list(fc))
    target_h = spec.target_hidden
    want = (spec.hidden_size, spec.context_width)
    n_ids = len(spec.target_layer_ids)
    ok = tuple(fc) == want
    msg = f"tensor `{FC}` is {list(fc)}; {n_ids} target ids x target hidden {target_h} -> {list(want)}"
    if not ok and len(fc) == 2 and fc[1] % target_h == 0 and fc[1] != spec.context_width:
        msg += f" (the weight was made for {fc[1] // target_h} ids)"
    return make_check("fc_width", ok, msg, value=list(fc), threshold=list(want))


def _attention_shapes(spec: DraftSpec, problems: list[TensorProblem]) -> Check:
    bad = [f"{p.tensor} {list(p.have)} != {list(p.want)}" for p in problems
           if p.kind == "shape" and p.check == "attention_shapes"]
    dims = f"heads {spec.num_heads}, kv heads {spec.num_kv_heads}, head_dim {spec.head_dim}, hidden {spec.hidden_size}"
    return make_check("attention_shapes", not bad, ("tensor " + _first(bad) + f" (config: {dims})") if bad else
                  f"q/k/v/o projections of {spec.num_layers} layers match {dims}",
                  value=bad[:5] or None, threshold=f"q/o {spec.num_heads * spec.head_dim}, k/v {spec.num_kv_heads * spec.head_dim}")


def _tensor_set(ckpt: Checkpoint, problems: list[TensorProblem]) -> list[Check]:
    """The catalogue's tensor-set problems that no more specific check (fc_width, attention_shapes,
    vocab_map, t2d_consistency) reports, and the tensors that should not ship."""
    spec, have = ckpt.spec, ckpt.tensors
    missing = [p.tensor for p in problems if p.check == "missing_tensors"]
    wrong = [f"{p.tensor} {list(p.have)} != {list(p.want)}" for p in problems if p.check == "tensor_shapes"]
    unknown = [p.tensor for p in problems if p.check == "unexpected_tensors"]
    expected = catalogue.expected_shapes(spec)
    checks = [
        make_check("missing_tensors", not missing, ("tensor " + _first(missing) + " missing") if missing else
               f"all {len(expected)} expected tensors present", value=missing or None),
        make_check("tensor_shapes", not wrong, ("tensor " + _first(wrong)) if wrong else
               "norms, MLP and other tensors have the shapes the config implies", value=wrong[:5] or None),
        make_check("unexpected_tensors", not unknown, ("tensor " + _first(unknown) + " is not part of a "
               f"{spec.variant} draft; engines' loaders refuse unknown weights") if unknown else
               "no unknown tensors", value=unknown or None),
    ]
    leftovers = sorted(n for n in have if catalogue.is_leftover(n, spec))
    checks.append(make_check("training_only_tensors", not leftovers, ("tensor " + _first(leftovers)
                         + " should not be shipped (training-only or a copy of the target's; "
                         "`dflash-convert convert` drops it)") if leftovers else "no training-only tensors",
                         value=leftovers or None, bad="warn"))
    return checks



def _family(spec: DraftSpec, problems: list[TensorProblem]) -> list[Check]:
    """A family draft's own keys against their rules, and its convolution / selector tensors against the keys."""
    if not kinds.of(spec.variant).modules:  # the plain backbone: no keys or modules of its own
        return []
    broken = keys.family_problems(spec.variant, spec.variant_fields, hidden=spec.hidden_size, vocab=spec.vocab_size,
                                  block=spec.block_size, pruned=spec.is_pruned_vocab)
    wrong = [f"{p.tensor} {list(p.have)} != {list(p.want)}" if p.kind == "shape" else p.message.removeprefix("tensor ")
             for p in problems if p.check == "family_shapes"]
    return [
        make_check("family_config", not broken, "; ".join(broken) if broken else
               f"{spec.variant} keys: " + ", ".join(f"{k}={v!r}" for k, v in sorted(spec.variant_fields.items())),
               value=spec.variant_fields or None),
        make_check("family_shapes", not wrong, ("tensor " + _first(wrong)) if wrong else
               f"{spec.variant} {kinds.of(spec.variant).modules} tensors match their keys", value=wrong[:5] or None),
    ]

def _vocab_map(ckpt: Checkpoint) -> list[Check]:
    """Pruned drafts need their lm_head AND d2t; d2t must map into the target vocab; t2d must agree."""
    spec, have = ckpt.spec, ckpt.tensors
    vocab = spec.vocab_size
    head = have.get(LM_HEAD)
    rows = head.shape[0] if head is not None and head.shape else None
    pruned_head = rows is not None and rows != vocab
    checks: list[Check] = []
    if spec.is_pruned_vocab or pruned_head:
        vd = spec.draft_vocab_size if spec.is_pruned_vocab else rows
        problems = []
        if head is None:
            problems.append(f"tensor `{LM_HEAD}` missing for draft_vocab_size {vd}")
        elif rows != vd:
            problems.append(f"tensor `{LM_HEAD}` has {rows} rows, config draft_vocab_size is "
                            f"{spec.draft_vocab}")
        if D2T not in have:
            problems.append(f"tensor `{D2T}` missing while lm_head is pruned: draft ids would be read as target ids "
                            "and acceptance collapses (vllm-ascend #9795)")
        elif tuple(have[D2T].shape) != (vd,):
            problems.append(f"tensor `{D2T}` is {list(have[D2T].shape)}, expected [{vd}]")
        checks.append(make_check("vocab_map", not problems, "; ".join(problems) if problems else
                             f"pruned vocab: lm_head [{vd}, {spec.hidden_size}] with d2t [{vd}]",
                             value={"draft_vocab": vd, "d2t": D2T in have}, threshold="lm_head rows == d2t size"))
    else:
        checks.append(make_check("vocab_map", True, f"full vocab ({vocab}): the target's lm_head is used",
                             value={"draft_vocab": vocab}))
    checks += _d2t_values(ckpt, vocab)
    return checks


def _int_tensor(ckpt: Checkpoint, name: str) -> str | None:
    """Why a tensor cannot be read as a 1-D integer / bool array, or None."""
    info = ckpt.tensors[name]
    if DTYPES[info.dtype].is_float or len(info.shape) != 1:
        return f"tensor `{name}` is {info.dtype} {list(info.shape)}; expected a 1-D integer tensor"
    return None


def _d2t_values(ckpt: Checkpoint, vocab: int) -> list[Check]:
    have = ckpt.tensors
    if D2T not in have and T2D not in have:
        return []  # full-vocab draft: nothing to read

    checks: list[Check] = []
    target_ids = None
    if D2T in have:
        bad = _int_tensor(ckpt, D2T) or (None if DTYPES[have[D2T].dtype].kind == "int" else
                                          f"tensor `{D2T}` is {have[D2T].dtype}; expected integers")
        if bad:
            checks.append(make_check("d2t_range", False, bad, value=have[D2T].dtype))
        else:
            target_ids = catalogue.d2t_target_ids(ckpt.int_values(D2T))
            lo, hi, dup = catalogue.target_id_span(target_ids)
            ok = lo >= 0 and hi < vocab
            msg = (f"tensor `{D2T}` maps draft ids to target ids [{lo}, {hi}]" +
                   ("" if ok else f", outside the target vocab [0, {vocab})") +
                   (f"; {dup} target ids repeated" if dup else ""))
            checks.append(make_check("d2t_range", ok and not dup, msg, value=[lo, hi], threshold=f"[0, {vocab})",
                                 bad="fail" if not ok else "warn"))
    if T2D in have:
        info = have[T2D]
        bad = _int_tensor(ckpt, T2D)
        if bad:
            checks.append(make_check("t2d_consistency", False, bad, value=info.dtype))
            return checks
        t2d = ckpt.int_values(T2D).astype(bool).reshape(-1)
        problems = []
        if tuple(info.shape) != (vocab,):
            problems.append(f"tensor `{T2D}` is {list(info.shape)}, expected [{vocab}]")
        vd = ckpt.spec.draft_vocab
        if int(t2d.sum()) != vd:
            problems.append(f"tensor `{T2D}` marks {int(t2d.sum())} ids, draft vocab is {vd}")
        if target_ids is not None and len(t2d) == vocab and target_ids.min(initial=0) >= 0 \
                and target_ids.max(initial=0) < vocab and not t2d[target_ids].all():
            problems.append(f"tensor `{T2D}` disagrees with `{D2T}` (a draft id maps to a target id t2d excludes)")
        checks.append(make_check("t2d_consistency", not problems, "; ".join(problems) if problems else
                             f"t2d marks the {vd} target ids d2t maps to", value=int(t2d.sum()), threshold=vd))
    return checks


def _shipped_float(ckpt: Checkpoint, name: str) -> bool:
    """A float tensor engines load (not a training-only copy conversion drops anyway)."""
    rule = catalogue.rule_for(name)
    quantized = name in quantized_tensor_names(ckpt)  # their dtypes: the scheme's
    return DTYPES[ckpt.tensors[name].dtype].is_float and not (rule and rule.never_shipped) and not quantized


def _dtypes(ckpt: Checkpoint) -> Check:
    counts: dict[str, int] = {}
    for name, info in ckpt.tensors.items():
        if _shipped_float(ckpt, name):
            counts[info.dtype] = counts.get(info.dtype, 0) + info.numel
    if not counts:
        return make_check("dtype", False, "no floating-point tensors", value=None)
    main = max(counts, key=counts.get)
    if len(counts) > 1:
        odd = sorted(n for n, i in ckpt.tensors.items() if _shipped_float(ckpt, n) and i.dtype != main)
        return make_check("dtype", False, f"mixed float dtypes {sorted(counts)}: tensor {_first(odd)} is not {main}",
                      value=sorted(counts), threshold="one float dtype", bad="warn")
    half = "/".join(c for c, d in DTYPES.items() if d.cast_target and d.itemsize == 2)
    if DTYPES[main].itemsize > 2:
        return make_check("dtype", False, f"all weights are {main}: drafts are served in bf16/fp16, this doubles the "
                      "download (speculators #136; convert with --dtype bfloat16)", value=main,
                      threshold=half, bad="warn")
    return make_check("dtype", True, f"all weights {main}", value=main)


def _causality(spec: DraftSpec) -> Check:
    causal = list(spec.layer_causal)
    mixed = len(set(causal)) > 1
    desc = ", ".join(f"{i}:{'causal' if c else 'non-causal'}" for i, c in enumerate(causal))
    return make_check("causality", not mixed, f"per-layer block causality {desc}" + (
        "; mixed drafts run wrongly on vLLM versions that apply one flag to every layer (vLLM #47745/#56692)"
        if mixed else ""), value=causal, bad="warn")


def _verifier(spec: DraftSpec) -> Check:
    if spec.verifier is not None:
        return make_check("verifier", True, f"verifier {spec.verifier.name_or_path}", value=spec.verifier.name_or_path)
    if spec.source_format == "speculators":
        return make_check("verifier", False, "speculators config names no verifier: vLLM needs "
                      "verifier.name_or_path to find the target (pass --verifier when converting)", bad="warn")
    return make_check("verifier", None, "no verifier recorded (HF configs need none)")


def verifier_against(spec: DraftSpec, given: str, target_dir=None) -> Check | None:
    """`verifier` with --target: a warning when the draft names another target than the one given (a model of
    the same shape passes every config check, then accepts almost nothing and parts from its greedy output).
    The same target: the same string, the same directory, the Hub cache's folder of that id, or the same last
    path component (a local copy of a Hub model). None when the draft names no verifier."""
    from pathlib import Path

    named = spec.verifier.name_or_path if spec.verifier is not None else None
    if not named:
        return None
    here = [Path(given)] + ([Path(target_dir)] if target_dir is not None else [])
    same = (named == given or any(_same_dir(Path(named), p) for p in here)
            or any(f"models--{named.replace('/', '--')}" in p.parts for p in here)
            or any(named.rstrip("/").rsplit("/", 1)[-1].lower() == p.name.lower() for p in here if p.name))
    if same:
        return make_check("verifier", True, f"verifier {named}, the --target given", value=named)
    return make_check("verifier", False, f"the draft names its target {named}, but --target is {given}: a target "
                      "the draft was not trained against of the same shape passes the config checks, then accepts "
                      "almost nothing", value=named, threshold=given, bad="warn")


def _same_dir(a, b) -> bool:
    try:
        return a.exists() and b.exists() and a.resolve() == b.resolve()
    except OSError:
        return False


# ----------------------------------------------------------------------------- values (numpy, from the bit patterns)

SCAN_CHUNK = 1 << 25  # elements read at a time: memory stays flat however big the tensor


def _as_float(bits: int, code: str) -> float:
    import numpy as np

    d = DTYPES[code]
    if d.numpy:
        return float(np.array([bits], dtype=d.bits).view(d.numpy)[0])
    if d.upper_half_of:
        wide = DTYPES[d.upper_half_of]
        shifted = bits << (8 * (wide.itemsize - d.itemsize))
        return float(np.array([shifted], dtype=wide.bits).view(wide.numpy)[0])
    return float("nan")  # float8: numpy has no such type (the bit pattern is still reported as constant)


def _scan_tensor(ckpt: Checkpoint, name: str) -> tuple[int, bool, int | None]:
    """(NaN/Inf count, all zero, constant bit pattern or None) of one float tensor, read in chunks."""
    import numpy as np

    info = ckpt.tensors[name]
    d = DTYPES[info.dtype]
    utype = d.bits
    if name in ckpt.pickled:  # torch is loaded already for pickle checkpoints
        import torch

        same_width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[d.itemsize]
        chunks = [ckpt.pickled[name].contiguous().view(-1).view(same_width).cpu().numpy().view(utype)]
    else:
        chunks = (np.fromfile(info.file, dtype=utype, count=min(SCAN_CHUNK, info.numel - i),
                              offset=info.start + i * d.itemsize) for i in range(0, info.numel, SCAN_CHUNK))
    nonfinite, zero, first, constant = 0, d.zero_mask is not None, None, True
    for a in chunks:
        nonfinite += int(np.count_nonzero((a & d.nan_mask) == d.nan_value))
        zero = zero and not np.any(a & d.zero_mask)  # +0 or -0 everywhere
        if first is None and len(a):
            first = int(a[0])
        constant = constant and bool(np.all(a == first))
    return nonfinite, zero, first if constant and info.numel > 1 else None


def scan_checks(ckpt: Checkpoint) -> list[Check]:
    """NaN/Inf and all-zero / constant tensors (speculators #1114, #617, #962), from the raw bits of one
    tensor at a time: no torch, and no float conversion of a 2 GB checkpoint."""
    nonfinite, zero, constant_mat, constant_vec = [], [], [], []
    for name in sorted(ckpt.tensors):
        info = ckpt.tensors[name]
        if info.numel == 0 or not _shipped_float(ckpt, name):
            continue
        bad, all_zero, const = _scan_tensor(ckpt, name)
        if bad:
            nonfinite.append(f"{name} ({bad} of {info.numel})")
        elif all_zero:
            zero.append(name)
        elif const is not None:
            (constant_mat if len(info.shape) > 1 else constant_vec).append(
                f"{name} (= {_as_float(const, info.dtype):g})")
    return [
        make_check("finite_values", not nonfinite, ("tensor " + _first(nonfinite) + " has NaN/Inf values")
               if nonfinite else "every float tensor is finite", value=nonfinite or None, threshold=0,
               level="numeric"),
        make_check("degenerate_values", not (zero or constant_mat),
               ("tensor " + _first(zero + constant_mat) + " is all zeros or constant: untrained or lost weights")
               if zero or constant_mat else "no all-zero or constant weight matrices",
               value=(zero + constant_mat) or None, level="numeric"),
        make_check("constant_norms", not constant_vec, ("tensor " + _first(constant_vec) +
               " is constant: a norm that was never trained?") if constant_vec else "no constant 1-D tensors",
               value=constant_vec or None, level="numeric", bad="warn"),
    ]


# ----------------------------------------------------------------------------- draft vs target config

def target_checks(spec: DraftSpec, target: mapping.TargetInfo, *, ckpt: Checkpoint | None = None) -> list[Check]:
    """The draft against its target's config.json (compat.compatibility_checks). With `ckpt`, d2t values too."""
    checks = compat.compatibility_checks(spec, target)
    if ckpt is not None and D2T in ckpt.tensors and not _int_tensor(ckpt, D2T):
        lo, hi, _ = catalogue.target_id_span(catalogue.d2t_target_ids(ckpt.int_values(D2T)))
        checks.append(make_check("target_d2t_range", lo >= 0 and hi < target.vocab_size,
                             f"tensor `{D2T}` maps into target ids [{lo}, {hi}]; target {target.name_or_path} vocab "
                             f"{target.vocab_size}", value=[lo, hi], threshold=f"[0, {target.vocab_size})"))
    return checks


def duplicate_tensors_check(path) -> Check:
    """Tensor names stored twice across shards (or as `x` and `model.x`): loaders keep one copy at random.
    open_checkpoint refuses such a checkpoint, so this reads the headers itself and names the duplicates."""
    from pathlib import Path

    from dflash_convert.io.checkpoint import find_weight_files
    from dflash_convert.io.safetensors import read_header

    path = Path(path)
    if path.is_file():
        path = path.parent
    if not path.is_dir():
        return make_check("duplicate_tensors", None, f"{path} is not a directory")
    files = find_weight_files(path, allow_pickle=True).files
    seen: dict[str, str] = {}
    dups = []
    for f in files:
        if f.suffix != ".safetensors":
            continue
        for name in read_header(f)[0]:
            canon = catalogue.canonical_name(name)
            if canon in seen:
                dups.append(f"{name} ({seen[canon]} and {f.name})")
            seen.setdefault(canon, f.name)
    return make_check("duplicate_tensors", not dups, ("tensor " + _first(dups) + " is stored twice") if dups else
                  f"no tensor stored twice across {len(files)} file(s)", value=dups or None)
