"""The runtime draft computes what the references compute: speculators 0.9.0's own DFlash forward on
the same weights and inputs, and the z-lab math (docs/formats.md section 1) on an HF/z-lab-format draft."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_convert.errors import DFlashError
from dflash_runtime import load_draft
from dflash_runtime.rope import apply_rope, rope_tables
from runtime_helpers import one_torch_thread  # noqa: F401 (autouse fixture)
from runtime_helpers import (our_block_logits, speculators_draft, speculators_logits, target_context, write_hf_draft,
                             zlab_reference_logits)


@pytest.fixture(scope="session")
def runtime_drafts(speculators_drafts, tiny_target):
    """speculators-saved drafts: the lead's set plus a sliding window shorter than the context."""
    drafts = dict(speculators_drafts)
    drafts["window4"] = speculators_draft(tiny_target, "window4", sliding_window=4, draft_vocab=200)
    return drafts


@pytest.mark.parametrize("name", ["full", "pruned", "mixed", "non_causal", "window4", "last_layer"])
def test_logits_equal_speculators_forward(name, runtime_drafts, runtime_target):
    draft = load_draft(runtime_drafts[name])
    target = runtime_target
    anchor = 13
    ids, features, block = target_context(target, draft, 30, seed=0, anchor=anchor)  # features [T, A*H]
    theirs, model = speculators_logits(runtime_drafts[name], features, ids, anchor)
    ours = our_block_logits(draft, target, features[:anchor], block)  # [B, V]
    if draft.draft_to_target is not None:  # pruned: compare in the draft vocab, -inf elsewhere
        assert torch.isinf(ours).sum() == ours.shape[0] * (ours.shape[1] - len(draft.draft_to_target))
        ours = ours[:, draft.draft_to_target]
    assert torch.allclose(ours, theirs, atol=2e-5, rtol=1e-5), (ours - theirs).abs().max()
    assert torch.equal(ours[1:].argmax(-1), theirs[1:].argmax(-1))
    assert draft.layer_causal == [i in model.sliding_window_indices and not model.sliding_window_non_causal
                                  for i in range(len(model.layers))]


def test_trainer_default_draft_is_causal_and_windowed(runtime_drafts):
    draft = load_draft(runtime_drafts["full"])
    assert draft.layer_causal == [True, True] and all(l.sliding_window == 2048 for l in draft.layers)
    assert load_draft(runtime_drafts["non_causal"]).layer_causal == [False, False]
    assert load_draft(runtime_drafts["mixed"]).layer_causal == [False, True]
    assert load_draft(runtime_drafts["mixed"], causal=True).layer_causal == [True, True]


@pytest.fixture(scope="session")
def hf_drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_drafts")
    return {"non_causal": write_hf_draft(root / "non_causal"),
            "causal": write_hf_draft(root / "causal", causal=True, block_size=5)}


@pytest.mark.parametrize("causal", [False, True])
def test_logits_equal_zlab_math_on_hf_draft(causal, hf_drafts, runtime_target):
    """Attention biases, GQA, legacy rope_theta key, a target id equal to the target's last layer."""
    path = hf_drafts["causal" if causal else "non_causal"]
    draft = load_draft(path)
    assert draft.layer_causal == [causal] * 3 and draft.layers[0].q_bias is not None
    target = runtime_target
    s = 11
    ids, features, block = target_context(target, draft, 17, seed=1, anchor=s)
    ours = our_block_logits(draft, target, features[:s], block)[1:]
    ref = zlab_reference_logits(path, features[:s], block, target.embed_tokens.weight, target.lm_head.weight,
                                causal=causal)
    assert torch.allclose(ours.double(), ref, atol=5e-5, rtol=1e-5), (ours.double() - ref).abs().max()


def test_context_cache_is_equivalent_to_recomputing(hf_drafts, runtime_target):
    """Context added in pieces (as the decode loop does) gives the same block as all at once."""
    draft = load_draft(hf_drafts["non_causal"])
    target = runtime_target
    _, features, block = target_context(target, draft, 15, seed=2)
    whole = our_block_logits(draft, target, features, block)
    draft.reset()
    for a, b in ((0, 6), (6, 7), (7, 15)):
        draft.add_context(features[a:b], a)
    pieces = draft.logits(draft.block_hidden(target.embed(block), 15), target.lm_head)
    assert torch.allclose(whole, pieces, atol=1e-5)


def test_bf16_draft_close_to_fp32(hf_drafts, runtime_target):
    target = runtime_target
    d32, d16 = load_draft(hf_drafts["non_causal"]), load_draft(hf_drafts["non_causal"], dtype=torch.bfloat16)
    assert d16.fc.dtype == torch.bfloat16
    target.set_capture(d32.target_layer_ids)
    target.reset()
    ids = torch.randint(0, 500, (12,), generator=torch.Generator().manual_seed(3))
    _, features = target.forward(ids, 0)
    block = torch.full((6,), 511)
    block[0] = 5
    a, b = our_block_logits(d32, target, features, block), our_block_logits(d16, target, features, block)
    assert (a - b).abs().max() < 0.05 * a.abs().max()


# ----------------------------------------------------------------------------- refusals

def test_dspark_is_refused_clearly(runtime_drafts):
    from dflash_runtime.draft_load import _check_runnable

    spec = load_draft(runtime_drafts["dflash2"]).spec.model_copy(update={"variant": "xpress"})
    with pytest.raises(DFlashError, match="xpress drafts are not supported by the runtime"):
        _check_runnable(spec, "config.json")


def test_fc_width_not_matching_ids_is_refused(tmp_path):
    path = write_hf_draft(tmp_path / "d")
    cfg = json.loads((path / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [0, 3]  # fc was built for 3 ids
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DFlashError, match=r"model.safetensors: tensor `fc.weight` has shape \[64, 192\].*128"):
        load_draft(path)


def test_mask_id_outside_vocab_is_refused(tmp_path):
    path = write_hf_draft(tmp_path / "d", mask=512)
    with pytest.raises(DFlashError, match=r"config.json: field `dflash_config.mask_token_id` is 512, outside the vocabulary"):
        load_draft(path)


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    path = write_hf_draft(tmp_path / "d")
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(DFlashError, match="tensor `layers.1.mlp.up_proj.weight` is missing"):
        load_draft(path)


def test_scaled_rope_equals_transformers_and_an_unknown_type_is_refused(tmp_path):
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    path = write_hf_draft(tmp_path / "d")
    cfg = json.loads((path / "config.json").read_text())
    del cfg["rope_theta"]
    cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 64}
    (path / "config.json").write_text(json.dumps(cfg))
    draft = load_draft(path)
    decoder = {k: v for k, v in cfg.items() if k not in ("dflash_config", "architectures", "block_size",
                                                         "num_target_layers")}
    ref = Qwen3RotaryEmbedding(Qwen3Config(**decoder))
    assert torch.allclose(draft.inv_freq, ref.inv_freq) and draft.rope_scale == pytest.approx(ref.attention_scaling)
    x = torch.randn(1, 2, 5, 16)
    cos, sin = ref(x, torch.arange(20, 25)[None])
    half = torch.cat((-x[..., 8:], x[..., :8]), dim=-1)
    ours = apply_rope(x, *rope_tables(torch.arange(20, 25), draft.inv_freq, draft.rope_scale, x.dtype))
    assert torch.allclose(ours, x * cos[:, None] + half * sin[:, None], atol=1e-6)
    cfg["rope_parameters"] = {"rope_type": "proportional", "rope_theta": 10000.0, "factor": 4.0}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DFlashError, match="config.json: RoPE type 'proportional' is not supported by the runtime"):
        load_draft(path)


@pytest.mark.parametrize("name", ["pruned", "mixed", "last_layer"])
def test_converted_hf_draft_runs_identically(name, runtime_drafts, runtime_target, cli, tmp_path):
    """The same draft in both formats (converted by dflash-convert) gives bit-identical logits."""
    assert cli("convert", runtime_drafts[name], "-o", tmp_path / "hf").code == 0
    original, converted = load_draft(runtime_drafts[name]), load_draft(tmp_path / "hf")
    assert converted.spec.source_format == "hf" and converted.layer_causal == original.layer_causal
    target = runtime_target
    _, features, block = target_context(target, original, 14, seed=4)
    assert torch.equal(our_block_logits(original, target, features, block),
                       our_block_logits(converted, target, features, block))


def test_non_qwen3_scalings_are_refused(speculators_drafts, tmp_path):
    """Keys such as final_logit_softcapping change the math; running without them would be silently wrong."""
    import json
    import shutil

    from dflash_convert.errors import DFlashError
    from dflash_runtime.draft_load import load_draft

    src = tmp_path / "d"
    shutil.copytree(speculators_drafts["full"], src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["transformer_layer_config"]["final_logit_softcapping"] = 30.0
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DFlashError, match="final_logit_softcapping=30.0"):
        load_draft(src)
    cfg["transformer_layer_config"]["final_logit_softcapping"] = None
    (src / "config.json").write_text(json.dumps(cfg))
    load_draft(src)
