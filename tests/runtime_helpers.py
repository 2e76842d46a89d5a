"""Shared pieces of the runtime tests: extra tiny drafts (built once per process), an HF/z-lab-format
draft written straight from docs/formats.md section 2, and an independent transcription of the z-lab
draft math (docs/formats.md section 1) to compare the runtime against."""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

_ROOT = Path(tempfile.mkdtemp(prefix="dflash-runtime-tests-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


CUDA = torch.cuda.is_available()
ON_CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device"))
# Every runtime equality test runs on each device present: cpu always, cuda on a GPU machine (where
# scripts/gpu-check.sh runs the tests whose ids name cuda).
DEVICES = ["cpu", ON_CUDA]
# Tolerances against an fp32 reference, relative to its largest magnitude: fp32 on a GPU differs from
# the CPU in summation order only; bf16 keeps 8 mantissa bits through every layer.
REL_TOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}


def close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> bool:
    """out within REL_TOL[dtype] x max |ref| of ref, where ref is finite (-inf outside a pruned vocab
    must stay -inf in out)."""
    out, ref = out.float().cpu(), ref.float().cpu()
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(out)):
        return False
    scale = ref[finite].abs().max().clamp_min(1e-6)
    return bool((out[finite] - ref[finite]).abs().max() <= REL_TOL[dtype] * scale)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models run several times faster on one thread (no thread hand-offs on a shared 2-core box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.lru_cache(maxsize=None)
def speculators_draft(target: Path, name: str, **kwargs) -> Path:
    """A speculators-saved draft for `target`, built once per process per (name, kwargs)."""
    from factories import make_speculators_draft

    return make_speculators_draft(_ROOT / name, target, **kwargs)


@functools.lru_cache(maxsize=None)
def target_dir(name: str, **kwargs) -> Path:
    from factories import make_target

    return make_target(_ROOT / name, **kwargs)


def write_hf_draft(path: Path, *, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, inter=96, vocab=512,
                   target_ids=(0, 3, 7), n_target=8, block_size=6, mask=511, bias=True, causal=None,
                   seed=3) -> Path:
    """An HF / z-lab-format draft with random weights: flat Qwen3 config + dflash_config, no prefix."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.05, offset=0.0):
        return torch.randn(*shape, generator=g) * scale + offset

    t = {"fc.weight": rnd(hidden, len(target_ids) * hidden), "hidden_norm.weight": rnd(hidden, scale=0.1, offset=1),
         "norm.weight": rnd(hidden, scale=0.1, offset=1)}
    for i in range(layers):
        p = f"layers.{i}."
        t.update({p + "self_attn.q_proj.weight": rnd(heads * head_dim, hidden),
                  p + "self_attn.k_proj.weight": rnd(kv_heads * head_dim, hidden),
                  p + "self_attn.v_proj.weight": rnd(kv_heads * head_dim, hidden),
                  p + "self_attn.o_proj.weight": rnd(hidden, heads * head_dim),
                  p + "self_attn.q_norm.weight": rnd(head_dim, scale=0.1, offset=1),
                  p + "self_attn.k_norm.weight": rnd(head_dim, scale=0.1, offset=1),
                  p + "mlp.gate_proj.weight": rnd(inter, hidden), p + "mlp.up_proj.weight": rnd(inter, hidden),
                  p + "mlp.down_proj.weight": rnd(hidden, inter),
                  p + "input_layernorm.weight": rnd(hidden, scale=0.1, offset=1),
                  p + "post_attention_layernorm.weight": rnd(hidden, scale=0.1, offset=1)})
        if bias:
            t.update({p + "self_attn.q_proj.bias": rnd(heads * head_dim, scale=0.5),
                      p + "self_attn.k_proj.bias": rnd(kv_heads * head_dim, scale=0.5),
                      p + "self_attn.v_proj.bias": rnd(kv_heads * head_dim, scale=0.5),
                      p + "self_attn.o_proj.bias": rnd(hidden, scale=0.5)})
    dflash = {"mask_token_id": mask, "target_layer_ids": list(target_ids), "block_size": block_size}
    if causal is not None:
        dflash["causal"] = causal
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": vocab, "rms_norm_eps": 1e-6,
              "hidden_act": "silu", "attention_bias": bias, "rope_theta": 10000.0, "max_position_embeddings": 256,
              "layer_types": ["full_attention"] * layers, "block_size": block_size, "num_target_layers": n_target,
              "dflash_config": dflash}
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in t.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rot(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def zlab_reference_logits(path: Path, features: torch.Tensor, block_ids: torch.Tensor, embed: torch.Tensor,
                          lm_head: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """Direct transcription of the z-lab draft math in float64, no cache: context features of
    positions 0..s-1, block at s..s+B-1; returns logits of block slots 1..B-1 [B-1, V]."""
    from safetensors.torch import load_file

    cfg = json.loads((Path(path) / "config.json").read_text())
    w = {k: v.double() for k, v in load_file(str(Path(path) / "model.safetensors")).items()}
    eps, nH, nKV, d = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    s, B = features.shape[0], block_ids.shape[0]
    ctx = _rms(features.double() @ w["fc.weight"].T, w["hidden_norm.weight"], eps)  # [s, H]
    x = embed.double()[block_ids]  # [B, H]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.arange(s + B, dtype=torch.float64)[:, None] * inv_freq[None]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]  # [s+B, 1, d]
    key_idx = torch.arange(s + B)[None]
    query_idx = torch.arange(B)[:, None] + s
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."

        def lin(inp, name):
            out = inp @ w[p + name + ".weight"].T
            return out + w[p + name + ".bias"] if p + name + ".bias" in w else out

        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = _rms(lin(h, "self_attn.q_proj").view(B, nH, d), w[p + "self_attn.q_norm.weight"], eps)
        kv_in = torch.cat([ctx, h])  # [s+B, H]
        k = _rms(lin(kv_in, "self_attn.k_proj").view(s + B, nKV, d), w[p + "self_attn.k_norm.weight"], eps)
        v = lin(kv_in, "self_attn.v_proj").view(s + B, nKV, d)
        q = q * cos[s:] + _rot(q) * sin[s:]
        k = k * cos + _rot(k) * sin
        k, v = k.repeat_interleave(nH // nKV, 1), v.repeat_interleave(nH // nKV, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * d ** -0.5
        if causal:
            scores = scores.masked_fill(key_idx > query_idx, float("-inf"))
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(B, nH * d)
        x = x + lin(o, "self_attn.o_proj")
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + lin(torch.nn.functional.silu(lin(h, "mlp.gate_proj")) * lin(h, "mlp.up_proj"), "mlp.down_proj")
    y = _rms(x, w["norm.weight"], eps)
    return y[1:] @ lm_head.double().T


def our_block_logits(draft, target, features: torch.Tensor, block_ids: torch.Tensor, start: int | None = None):
    """The runtime's logits [B, V] for one block after context `features` (positions 0..s-1)."""
    draft.reset()
    draft.add_context(features, 0)
    start = features.shape[0] if start is None else start
    return draft.logits(draft.block_hidden(target.embed(block_ids), start), target.lm_head)


def target_context(target, draft, n: int, *, seed: int, anchor: int = -1):
    """n random token ids (seeded), the target's features of them for the draft's layers [n, A*H] (the target
    reset first), and a block [ids[anchor], MASK * (B-1)] of the draft's size."""
    target.set_capture(draft.target_layer_ids)
    target.reset()
    ids = torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(seed))
    _, features = target.forward(ids, 0)
    block = torch.full((draft.block_size,), draft.mask_token_id)
    block[0] = ids[anchor]
    return ids, features, block


def speculators_logits(path, features, ids, anchor):
    """speculators' own _backbone_forward for one anchor: context = positions < anchor, block at anchor.
    Uses its dense-mask SDPA path (its default flex path compiles its mask builder)."""
    from speculators.model import SpeculatorModel
    from torch.nn.attention.flex_attention import create_mask

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SpeculatorModel.from_pretrained(str(path)).eval()
    model.config.transformer_layer_config._attn_implementation = "sdpa"
    model._create_mask_fn = create_mask
    T = ids.shape[0]
    assert anchor < T - model.block_size  # speculators never anchors in the last block
    loss_mask = torch.zeros(1, T)
    loss_mask[0, anchor] = 1  # the only valid anchor
    with torch.no_grad():
        _, logits, *_ = model._backbone_forward(features[None], ids[None], loss_mask, torch.zeros(1, T, 64),
                                                torch.zeros(1, T, dtype=torch.long), max_anchors=1)
    return logits[0], model  # [B, draft vocab]


def bf16_logits_against_speculators(path: Path, device: str, runtime_target, target_path: Path, anchor: int = 13):
    """(ours, theirs): the block logits of the draft at `path` with draft and target in bf16 on `device`, and
    speculators' own fp32 forward on the CPU from the same context features (the CPU fp32 target's)."""
    from dflash_runtime import load_draft, load_target

    ids, features, block = target_context(runtime_target, load_draft(path), 30, seed=0, anchor=anchor)
    theirs, _ = speculators_logits(path, features, ids, anchor)
    draft = load_draft(path, device=device, dtype=torch.bfloat16)
    target = load_target(target_path, device=device, dtype=torch.bfloat16)
    ours = our_block_logits(draft, target, features[:anchor], block)
    if draft.draft_to_target is not None:
        ours = ours[:, draft.draft_to_target.to(ours.device)]
    return ours.float().cpu(), theirs


def record_calls(monkeypatch, module, name: str) -> list[dict]:
    """Wrap module.name so every call's keyword arguments are recorded (the call still runs)."""
    calls, original = [], getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)
    monkeypatch.setattr(module, name, spy)
    return calls


def stand_in_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             **unused):
    """flash_attn.flash_attn_func's masking contract in plain torch: q [b, sq, h, d], k/v [b, sk, hk, d];
    query i sits at key position i + sk - sq (bottom-right aligned); causal sees keys <= that
    position; window_size (left, right) keeps keys within [pos - left, pos + right] (-1: unlimited)."""
    sq, h, d = q.shape[1:]
    sk, hk = k.shape[1:3]
    k, v = k.repeat_interleave(h // hk, dim=2), v.repeat_interleave(h // hk, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * (softmax_scale or d ** -0.5)
    pos = torch.arange(sq)[:, None] + (sk - sq)
    key = torch.arange(sk)[None, :]
    left, right = window_size
    right = 0 if causal else right
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        ok &= key >= pos - left
    if right >= 0:
        ok &= key <= pos + right
    probs = scores.masked_fill(~ok, float("-inf")).softmax(-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v.float()).to(q.dtype)


def assert_decode_alike(draft_a, draft_b, target) -> None:
    """Two drafts decode the trained pair's target alike, greedy: the same tokens and the same acceptance at every
    step, on two prompts where the pair accepts a lot (tau > 2: the comparison is about real acceptances)."""
    from dflash_runtime import speculative_generate

    for prompt in ([5, 6, 7, 8], [40, 41, 42, 43, 44, 45]):
        a = speculative_generate(draft_a, target, prompt, max_new_tokens=48)
        b = speculative_generate(draft_b, target, prompt, max_new_tokens=48)
        assert a.tokens == b.tokens
        assert (a.stats.accepted, a.stats.num_drafts, a.stats.per_position_rates) == \
            (b.stats.accepted, b.stats.num_drafts, b.stats.per_position_rates)
        assert a.stats.tau > 2


@dataclass
class BiasedHead:
    """A test-only runtime head: the plain head with `bias` [V] added to every proposing slot's logits (inside
    the compiled step); greedy picks, so the decode loop samples each slot from the biased logits."""

    bias: torch.Tensor
    anchor_predicts = False
    embed_scale = 1.0
    walks = False

    def outputs(self, rows: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits + self.bias
        return logits.argmax(dim=-1), logits

    def pick(self, anchor, outputs, *, temperature=0.0, generator=None):
        ids, logits = outputs
        return ids, logits, None


def first_proposals(draft, target, prompt: list[int], *, room: int = 32):
    """-> (ids [P], logits [P, V]) the draft proposes for its first block after `prompt` (anchor: token 9)."""
    target.set_capture(draft.target_layer_ids)
    target.reset(room, draft.block_size)
    _, features = target.forward(torch.tensor(prompt), 0)
    draft.reset(room, draft.block_size)
    draft.add_context(features, 0)
    return draft.propose(9, len(prompt), embed=target.embed, lm_head=target.lm_head)


def greedy_or_near_tie(target, prompt: list[int], gen, ref: list[int], *, proposals: int,
                       max_new_tokens: int) -> tuple[bool, str]:
    """Whether the speculative generation `gen` is transformers' greedy output `ref`, or parts from it only at a
    near-tie of the target's own two computations (validate's rule, dflash_convert.validate.partings: the verify
    block and the one-token decode recomputed teacher-forced, the gap within the noise measured between them).
    The message names the first parting with both tokens' logits in each path and the measured noise: on a GPU
    the kernels of a block (flash-linear-attention's chunked Gated DeltaNet, say) and of one token differ, and
    that is how a rollback defect is told from the target's rounding."""
    from dflash_convert.validate.partings import PathParting
    from dflash_runtime.paths import one_token_logits, verify_logits

    if gen.tokens == ref:
        return True, ""
    k = next((i for i, (a, b) in enumerate(zip(gen.tokens, ref)) if a != b), min(len(gen.tokens), len(ref)))
    if k >= min(len(gen.tokens), len(ref)):
        return False, f"{len(gen.tokens)} tokens where transformers' generate gives {len(ref)}"
    dtype = str(target.dtype).removeprefix("torch.")
    one = one_token_logits(target, prompt, gen.tokens, max_new_tokens=max_new_tokens)  # [N, V]
    verify = verify_logits(target, prompt, gen.tokens, gen.accepted_per_step, proposals=proposals,
                           max_new_tokens=max_new_tokens)  # [N, V]
    taken, other = ref[k], gen.tokens[k]
    parting = PathParting(k, taken, other, dtype, float(one[k, taken]), float(one[k, other]),
                          verify_taken=float(verify[k, taken]), verify_other=float(verify[k, other]))
    where = f"token {k + 1} of prompt {prompt[:4]}...: "
    if int(one[k].argmax()) != taken:
        return False, where + (f"transformers' generate takes {taken} where the runtime's one-token decode takes "
                               f"{int(one[k].argmax())}; " + parting.describe())
    return parting.near_tie and not parting.beyond_rounding, where + parting.describe()


def plant_verify_one_position_too_far(monkeypatch, *, only=lambda prompt: True) -> None:
    """The planted defect validate must fail: the decode loop's verify blocks run at positions one too far (the
    target's own recomputation of its paths, outside the loop, stays right), for the prompts `only` picks."""
    from dflash_convert.validate import end_to_end
    from dflash_runtime.target import Target

    real_forward, real_speculative = Target.forward, end_to_end.Decode.speculative

    class Shifted:
        def __init__(self, model):
            self.model = model

        def __call__(self, **kw):
            return self.model(**{**kw, "position_ids": kw["position_ids"] + 1})

    def shifted_forward(self, ids, start, *, last_logits_only=False):
        if ids.shape[0] < 2 or start == 0:
            return real_forward(self, ids, start, last_logits_only=last_logits_only)
        model, self.model = self.model, Shifted(self.model)
        try:
            return real_forward(self, ids, start, last_logits_only=last_logits_only)
        finally:
            self.model = model

    def speculative(self, prompt, **over):  # the defect lives in the loop's verify calls only
        if not only(prompt):
            return real_speculative(self, prompt, **over)
        monkeypatch.setattr(Target, "forward", shifted_forward)
        try:
            return real_speculative(self, prompt, **over)
        finally:
            monkeypatch.setattr(Target, "forward", real_forward)

    monkeypatch.setattr(end_to_end.Decode, "speculative", speculative)
