"""The target adapter: features are the right layers' outputs (the last one before the final norm),
the KV cache crops back exactly, and pairs that cannot run together are refused with a clear line."""

from __future__ import annotations

import pytest
import torch

from dflash_convert.errors import DFlashError
from dflash_runtime import check_pair, load_draft, load_target
from runtime_helpers import ON_CUDA, close, one_torch_thread, target_dir, write_hf_draft  # noqa: F401 (autouse fixture)


def test_features_are_layer_outputs_and_the_last_is_pre_norm(runtime_target):
    ids = torch.randint(0, 500, (9,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # 9 entries for 8 layers
        hs = runtime_target.model(input_ids=ids[None], output_hidden_states=True).hidden_states
    runtime_target.set_capture([0, 3, 6, 7])
    runtime_target.reset()
    _, features = runtime_target.forward(ids, 0)
    parts = features.split(runtime_target.hidden_size, dim=-1)
    for layer_id, part in zip([0, 3, 6], parts[:3]):
        assert torch.allclose(part, hs[layer_id + 1][0], atol=1e-6), layer_id
    last = parts[3]
    assert not torch.allclose(last, hs[8][0], atol=1e-2)  # hidden_states[-1] is after the final norm ...
    final_norm = runtime_target.model.get_decoder().norm
    assert torch.allclose(final_norm(last), hs[8][0], atol=1e-5)  # ... of exactly this layer output


def test_post_norm_capture_is_what_output_hidden_states_returns(runtime_target):
    """feed_after_final_norm (z-lab's reading of a last-layer id): the feature is transformers' hidden_states[-1]."""
    ids = torch.randint(0, 500, (9,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hs = runtime_target.model(input_ids=ids[None], output_hidden_states=True).hidden_states
    runtime_target.set_capture([3, 7])
    runtime_target.feed_after_final_norm({7})
    try:
        runtime_target.reset()
        _, features = runtime_target.forward(ids, 0)
    finally:
        runtime_target.feed_after_final_norm(())
    mid, last = features.split(runtime_target.hidden_size, dim=-1)
    assert torch.equal(mid, hs[4][0]) and torch.equal(last, hs[8][0])


def test_capture_follows_id_order_and_repeats(runtime_target):
    ids = torch.arange(6)
    runtime_target.set_capture([5, 2, 5])
    runtime_target.reset()
    _, f = runtime_target.forward(ids, 0)
    a, b, c = f.split(runtime_target.hidden_size, dim=-1)
    assert torch.equal(a, c) and not torch.equal(a, b)


@pytest.mark.parametrize("static", [False, True])
def test_cache_crops_back_exactly(static, runtime_target, tiny_target):
    """Dynamic cache, and the static one of compile=True (cropping sets its length; these sizes run
    eagerly on it, so nothing compiles here)."""
    if static:
        from transformers import StaticCache

        runtime_target = load_target(tiny_target, compile=True)
        runtime_target.set_capture([3])
        runtime_target.reset(20)
        assert isinstance(runtime_target.cache, StaticCache)
    g = torch.Generator().manual_seed(1)
    # more rejected than accepted rows: a static cache keeps rows 15-16 after the crop, masked
    prefix, rejected, accepted = (torch.randint(0, 500, (n,), generator=g) for n in (10, 7, 5))
    runtime_target.set_capture([3])
    runtime_target.reset()
    full_logits, full_feats = runtime_target.forward(torch.cat([prefix, accepted]), 0)
    runtime_target.reset()
    runtime_target.forward(prefix, 0)
    runtime_target.forward(rejected, 10)
    runtime_target.crop(10)
    assert runtime_target.cache_len == 10
    logits, feats = runtime_target.forward(accepted, 10)
    assert torch.allclose(logits, full_logits[10:], atol=1e-5) and torch.allclose(feats, full_feats[10:], atol=1e-5)
    with pytest.raises(DFlashError, match="target cache holds 15 positions, forward asked to start at 12"):
        runtime_target.forward(accepted, 12)


@pytest.mark.parametrize("device", [ON_CUDA])
@pytest.mark.parametrize("static", [False, True])
def test_bf16_target_on_a_gpu_crops_back_within_the_stated_tolerance(device, static, runtime_target, tiny_target):
    """The target in bf16 on the GPU, its dynamic cache and compile=True's static one: after a rejected block
    is cropped, logits and features are the CPU fp32 target's one forward within REL_TOL[bf16]."""
    target = load_target(tiny_target, device=device, dtype=torch.bfloat16, compile=static)
    g = torch.Generator().manual_seed(1)
    prefix, rejected, accepted = (torch.randint(0, 500, (n,), generator=g) for n in (10, 7, 5))
    runtime_target.set_capture([3])
    runtime_target.reset()
    want_logits, want_feats = runtime_target.forward(torch.cat([prefix, accepted]), 0)
    target.set_capture([3])
    target.reset(20)
    target.forward(prefix, 0)
    target.forward(rejected, 10)
    target.crop(10)
    logits, feats = target.forward(accepted, 10)
    assert close(logits, want_logits[10:], torch.bfloat16) and close(feats, want_feats[10:], torch.bfloat16)


def test_target_from_a_model_object_and_its_own_attention(tiny_target):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_target), dtype=torch.float32)
    t = load_target(model, attn_implementation="eager")
    assert t.model.config._attn_implementation == "eager" and t.num_layers == 8 and t.vocab_size == 512


def test_not_a_model_directory(tmp_path):
    with pytest.raises(DFlashError, match="not a model directory"):
        load_target(tmp_path)


@pytest.fixture(scope="session")
def hf_draft(tmp_path_factory):
    return load_draft(write_hf_draft(tmp_path_factory.mktemp("pair") / "d", target_ids=(0, 3, 7)))


def test_pair_checks(hf_draft, runtime_target):
    check_pair(hf_draft, runtime_target)  # ids 0, 3, 7 on an 8-layer target with hidden 64, vocab 512
    with pytest.raises(DFlashError, match=r"hidden32 has hidden_size 32; the draft's fc takes 3 ids x target hidden "
                                          r"64 = 192 inputs; the draft's hidden size is 64"):
        check_pair(hf_draft, load_target(target_dir("hidden32", hidden=32)))
    with pytest.raises(DFlashError, match=r"target_layer_ids \[7\] are not layers of target .*layers6 "
                                          r"\(6 layers: 0..5\)"):
        check_pair(hf_draft, load_target(target_dir("layers6", layers=6)))
    with pytest.raises(DFlashError, match=r"draft vocab_size 512; target .*vocab600 has vocab_size 600"):
        check_pair(hf_draft, load_target(target_dir("vocab600", vocab=600)))
    spec = hf_draft.spec.model_copy(update={"mask_token_id": 512})
    with pytest.raises(DFlashError, match=r"mask_token_id 512 is outside the embedding table of target .* "
                                          r"\(512 rows\)"):
        check_pair(spec, runtime_target)


def test_capture_of_a_missing_layer_is_refused(runtime_target):
    with pytest.raises(DFlashError, match=r"target_layer_ids \[8\] are not layers of the target \(8 layers"):
        runtime_target.set_capture([1, 8])


def test_device_and_dtype_options(speculators_drafts):
    from dflash_convert.errors import UsageError
    from dflash_runtime import resolve_device, resolve_dtype

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("bfloat16") is torch.bfloat16 and resolve_dtype("fp16") is torch.float16
    with pytest.raises(UsageError, match="--dtype 'int8': choose float32, bfloat16 or float16"):
        resolve_dtype("int8")
    with pytest.raises(UsageError, match="--device 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA is not available"):
            resolve_device("cuda")
        with pytest.raises(DFlashError, match="CUDA is not available"):
            load_draft(speculators_drafts["full"], device="cuda")
