"""Quantized drafts (issue 38): made from the bundled draft by compressed-tensors (tests/quantized_drafts.py) and a
ModelOpt FP8 copy built by hand; read, inspected, converted both ways byte for byte, dequantized by the library's own
decompression in the runtime, and validated against the unquantized source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dflash_convert.convert.conversion import ConvertOptions, convert
from dflash_convert.errors import DFlashError, NotRunnable
from dflash_convert.format import catalogue, quantization
from dflash_convert.io.checkpoint import open_checkpoint
from dflash_convert.validate.inspect import inspect_checkpoint
from processes import VLLM_PYTHON, needs_vllm
from quantized_drafts import SCHEMES, make_modelopt_fp8, quantize_draft

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
SOURCE = PAIR / "draft"
ALL = (*SCHEMES, "modelopt")


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantized")
    made = {name: quantize_draft(SOURCE, root / name, name) for name in SCHEMES}
    made["modelopt"] = make_modelopt_fp8(SOURCE, root / "modelopt")
    return made


def _copy_with(src: Path, dest: Path, edit) -> Path:
    """A copy of the draft at `src` whose tensors `edit` changes (in place on the dict)."""
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    dest.mkdir()
    save_file(tensors, dest / "model.safetensors")
    (dest / "config.json").write_text((src / "config.json").read_text())
    return dest


@pytest.mark.parametrize("name", ALL)
def test_scheme_read_and_companions_checked_against_the_unquantized_shapes(drafts, name):
    ckpt = open_checkpoint(drafts[name])
    q = ckpt.quantization
    modules = ckpt.quantized_modules()
    # every linear module of the bundled draft is quantized (lm_head is ignored; the bundled draft has none)
    assert sorted(f"{m.module}.weight" for m in modules) == sorted(
        n for n, s in open_checkpoint(SOURCE).logical_shapes().items() if len(s) == 2)
    assert ckpt.logical_shapes() == open_checkpoint(SOURCE).logical_shapes()
    label = q.schemes[0].label
    assert label.startswith({"fp8_dynamic": "W8A8", "w4a16": "W4A16", "w8a8_int8": "W8A8", "w8a16_int8": "W8A16",
                             "modelopt": "W8A8"}[name])
    ckpt.check_tensors()  # no unexpected tensors


def test_inspect_names_the_scheme_and_each_engines_handling(drafts):
    report = inspect_checkpoint(drafts["w4a16"])
    checks = {c.name: c for c in report.checks}
    assert "unexpected_tensors" not in {c.name for c in report.problems}
    assert checks["dtype"].status == "pass", checks["dtype"].message  # no "mixed float dtypes"
    assert "W4A16 (weights INT4 group 32; pack-quantized)" in checks["quantization"].message
    assert checks["quantized_serving.vllm"].status == "pass"
    assert "UnquantizedLinearMethod" in checks["quantized_serving.vllm"].message
    # SGLang 0.5.23 builds fc as a plain nn.Linear: a quantized fc is misloaded there
    assert checks["quantized_serving.sglang"].status == "warn"
    assert "fc" in checks["quantized_serving.sglang"].message
    assert report.parameters == inspect_checkpoint(SOURCE).parameters  # packed weights by their unquantized shape
    roles = {t.name: t.role for t in report.tensors}
    assert roles["fc.weight_packed"] == "weight_packed (quantization)"
    modelopt = {c.name: c for c in inspect_checkpoint(drafts["modelopt"]).checks}
    assert modelopt["quantized_serving.zlab"].status == "warn"  # transformers skips quant_method modelopt


def test_an_fp8_weight_without_its_scale_is_named_and_a_float_one_is_not_a_linear_module(drafts, tmp_path):
    bad = _copy_with(drafts["fp8_dynamic"], tmp_path / "bad", lambda t: t.pop("fc.weight_scale"))
    with pytest.raises(DFlashError, match=r"tensor `fc\.weight_scale` is missing"):
        open_checkpoint(bad).check_tensors()
    # a module the `Linear` class target matches but that is stored in float, without companions, was not an
    # nn.Linear where the draft was quantized (an embedding, say): it is left as it is
    source = load_file(SOURCE / "model.safetensors")
    kept = _copy_with(drafts["fp8_dynamic"], tmp_path / "kept", lambda t: (
        t.pop("fc.weight_scale"), t.__setitem__("fc.weight", source["fc.weight"])))
    ckpt = open_checkpoint(kept)
    assert "fc" not in {m.module for m in ckpt.quantized_modules()}
    ckpt.check_tensors()


@pytest.mark.parametrize("edit, named", [
    (lambda t: t.__setitem__("fc.weight_scale", t["fc.weight_scale"][:32]), "fc.weight_scale"),
    (lambda t: t.pop("layers.1.mlp.up_proj.weight_scale"), "layers.1.mlp.up_proj.weight_scale"),
    (lambda t: t.__setitem__("layers.0.self_attn.q_proj.weight_packed",
                             t["layers.0.self_attn.q_proj.weight_packed"].to(torch.int64)),
     "layers.0.self_attn.q_proj.weight_packed"),
    (lambda t: t.__setitem__("norm.weight_scale", torch.ones(1)), "norm.weight_scale"),
], ids=["scale_shape", "scale_missing", "packed_dtype", "scale_of_nothing"])
def test_a_companion_that_disagrees_with_the_config_is_named(drafts, tmp_path, edit, named):
    bad = _copy_with(drafts["w4a16"], tmp_path / "bad", edit)
    with pytest.raises(DFlashError, match=named.replace(".", r"\.")) as info:
        open_checkpoint(bad).check_tensors()
    assert "model.safetensors" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["fp8_dynamic", "w4a16", "w8a8_int8", "modelopt"])
def test_convert_carries_a_quantized_draft_both_ways_byte_for_byte(drafts, tmp_path, name):
    src = drafts[name]
    hf = tmp_path / "hf"
    convert(src, hf, ConvertOptions(to="hf"))
    back = tmp_path / "back"
    convert(hf, back, ConvertOptions(to="speculators", verifier=str(PAIR / "target")))
    want = json.loads((src / "config.json").read_text())["quantization_config"]
    for out in (hf, back):
        assert json.loads((out / "config.json").read_text())["quantization_config"] == want
        with safe_open(src / "model.safetensors", "pt") as a, safe_open(out / "model.safetensors", "pt") as b:
            assert set(a.keys()) == set(b.keys())
            for key in a.keys():
                x, y = a.get_tensor(key), b.get_tensor(key)
                assert x.dtype == y.dtype and x.shape == y.shape
                assert x.reshape(-1).view(torch.uint8).equal(y.reshape(-1).view(torch.uint8)), key


def test_what_a_quantized_draft_cannot_become_is_refused_by_name(drafts, tmp_path):
    with pytest.raises(DFlashError, match=r"--dtype float32 would cast tensor `fc\.weight_scale`"):
        convert(drafts["fp8_dynamic"], tmp_path / "cast", ConvertOptions(to="hf", dtype="float32"))
    non_causal = tmp_path / "nc"
    convert(drafts["fp8_dynamic"], non_causal, ConvertOptions(to="hf", causal=False))
    with pytest.raises(DFlashError, match="not written in transformers' layout"):
        convert(non_causal, tmp_path / "tf", ConvertOptions(to="transformers"))


@pytest.mark.parametrize("name", ALL)
def test_the_runtime_dequantizes_as_the_library_does(drafts, name):
    from dflash_runtime import load_draft

    draft = load_draft(drafts[name], dtype=torch.float32)
    source = load_file(SOURCE / "model.safetensors")
    if name == "modelopt":
        stored = load_file(drafts[name] / "model.safetensors")
        want = {n: stored[n].float() * stored[n.replace(".weight", ".weight_scale")]  # per tensor, by hand
                if stored[n].dtype == torch.float8_e4m3fn else stored[n] for n in stored}
    else:
        from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer

        # the library's own model-free dequantizer over the whole checkpoint
        want = CompressedTensorsDequantizer(str(drafts[name]), dtype=torch.float32).process(
            load_file(drafts[name] / "model.safetensors"))
    for tensor in catalogue.expected_shapes(draft.spec):
        got = draft.tensors[tensor].float()
        assert torch.equal(got, want[tensor].float()), tensor
        err = (got - source[tensor].float()).abs().max() / source[tensor].float().abs().max()
        assert err < (0.2 if name == "w4a16" else 0.05), (tensor, float(err))  # close to the bf16 weights


def test_the_memory_plan_counts_the_weights_the_runtime_holds(drafts):
    q = open_checkpoint(drafts["w4a16"])
    src = open_checkpoint(SOURCE)
    names = catalogue.expected_shapes(q.spec)
    planned = quantization.memory_plan_tensors(q.quantized_modules(), q.tensors, names)
    assert sorted((t.name, t.shape) for t in planned) == sorted((n, src.tensors[n].shape) for n in names)


def test_a_quantized_kv_cache_is_not_run_as_if_it_were_float(drafts, tmp_path):
    from dflash_runtime import load_draft

    dest = tmp_path / "kv"
    dest.mkdir()
    (dest / "model.safetensors").write_bytes((drafts["fp8_dynamic"] / "model.safetensors").read_bytes())
    config = json.loads((drafts["fp8_dynamic"] / "config.json").read_text())
    config["quantization_config"]["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                        "dynamic": False, "symmetric": True}
    (dest / "config.json").write_text(json.dumps(config))
    with pytest.raises(NotRunnable, match="kv_cache_scheme"):
        load_draft(dest)


@pytest.mark.parametrize("name", ["fp8_dynamic", "w4a16"])
def test_compare_to_reports_the_tau_lost_to_quantization(drafts, name):
    """The check's figures on a short run (docs/quantization.md has the longer measurement per scheme); the
    tolerance is validate/compare.py's, by the draft's weight bits."""
    from dflash_convert.validate.compare import tau_tolerance
    from dflash_convert.validate.options import ValidateOptions
    from dflash_convert.validate.run import validate

    opts = ValidateOptions(target=PAIR / "target", prompts=PAIR / "prompts.txt", levels=["end_to_end"],
                           max_new_tokens=64, dtype="float32", compare_to=SOURCE, timing_rounds=1)
    report = validate(drafts[name], opts)
    check = next(c for c in report.checks if c.name == "compare_to")
    assert check.status == "pass", check.message
    assert tau_tolerance(drafts[name]) == {"fp8_dynamic": 0.03, "w4a16": 0.10}[name]
    assert 0 <= check.value["tau_lost"] <= check.threshold
    assert len(check.value["position_rates_lost"]) == len(report.acceptance.per_position_rates)


@pytest.mark.parametrize("name", ["w8a16_int8", "w4a16"])
def test_a_quantized_drafts_bf16_rounding_is_not_a_backend_failure(drafts, name):
    """The numeric level in bf16 (the default on CPU for a bf16 draft): the dequantized weights spread the
    rounding past the fixed tolerance, the float32 re-run clears it, and the run passes."""
    from dflash_convert.validate.options import ValidateOptions
    from dflash_convert.validate.run import validate

    report = validate(drafts[name], ValidateOptions(levels=["static", "numeric"], dtype="bfloat16"))
    agreement = [c for c in report.checks if c.name.startswith("backend_agreement.")]
    assert agreement and all(c.status == "pass" for c in agreement), [c.message for c in agreement]
    assert report.passed


def test_an_integer_tensor_outside_a_quantized_module_is_still_refused(drafts, tmp_path):
    bad = _copy_with(drafts["w8a8_int8"], tmp_path / "bad",
                     lambda t: t.__setitem__("norm.weight", t["norm.weight"].to(torch.int8)))
    with pytest.raises(DFlashError, match=r"tensor `norm\.weight` is I8; it must be float"):
        open_checkpoint(bad)


@pytest.mark.parametrize("kind", ["dflash2_k3", "dspark"])
def test_speculators_saved_family_drafts_quantize_convert_and_dequantize(family_drafts, tmp_path, kind):
    """dflash2 and DSpark drafts saved by speculators, their decoder layers and fc quantized (FP8), the family
    heads left in float: read without problems, carried both ways byte for byte, dequantized as the library does."""
    from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer

    from dflash_runtime import load_draft
    from quantized_drafts import FAMILY_IGNORE

    q = quantize_draft(family_drafts[kind], tmp_path / "q", "fp8_dynamic", FAMILY_IGNORE)
    report = inspect_checkpoint(q)
    assert not {"unexpected_tensors", "missing_tensors", "family_shapes"} & {c.name for c in report.problems}
    modules = {m.module for m in open_checkpoint(q).quantized_modules()}
    assert "fc" in modules and not any("conv" in m or "head" in m or "selector" in m for m in modules)
    convert(q, tmp_path / "hf", ConvertOptions(to="hf"))
    convert(tmp_path / "hf", tmp_path / "back", ConvertOptions(to="speculators", verifier=str(PAIR / "target")))
    with safe_open(q / "model.safetensors", "pt") as a, safe_open(tmp_path / "back" / "model.safetensors", "pt") as b:
        assert set(a.keys()) == set(b.keys())
        assert all(a.get_tensor(k).reshape(-1).view(torch.uint8).equal(b.get_tensor(k).reshape(-1).view(torch.uint8))
                   for k in a.keys())
    draft = load_draft(q, dtype=torch.float32)
    want = CompressedTensorsDequantizer(str(q), dtype=torch.float32).process(load_file(q / "model.safetensors"))
    for tensor in catalogue.expected_shapes(draft.spec):
        assert torch.equal(draft.tensors[tensor].float(), want[tensor].float()), tensor


def test_an_engine_that_quantizes_activations_is_no_acceptance_verdict(drafts):
    """W8A8: vLLM quantizes the activations, the runtime does not, so a step where their acceptance differs warns
    instead of failing; weight-only schemes keep the comparison's verdict."""
    from dflash_convert.format.compat import make_check
    from dflash_convert.validate.quantized_checks import activation_caveat

    checks = [make_check("engine_acceptance_agrees", False, "vLLM: 65 drafts"),
              make_check("engine_outputs_equal", False, "outputs differ")]
    w8a8 = {c.name: c for c in activation_caveat(open_checkpoint(drafts["w8a8_int8"]), checks)}
    assert w8a8["engine_acceptance_agrees"].status == "warn"
    assert "quantizes its activations" in w8a8["engine_acceptance_agrees"].message
    assert w8a8["engine_outputs_equal"].status == "fail"  # the target's outputs must still be equal
    w4a16 = activation_caveat(open_checkpoint(drafts["w4a16"]), checks)
    assert [c.status for c in w4a16] == ["fail", "fail"]


@needs_vllm
def test_vllm_cpu_serves_an_int8_w8a8_draft(drafts):
    """vLLM 0.32's CPU build serves the INT8 W8A8 copy (its CPUInt8ScaledMM kernels): the outputs are the
    target's, and the acceptance comparison is run (a step the activation quantization moves only warns)."""
    from dflash_convert.validate.options import ValidateOptions
    from dflash_convert.validate.run import validate

    opts = ValidateOptions(target=PAIR / "target", prompts=PAIR / "prompts.txt", levels=["static", "end_to_end"],
                           sampling="greedy", max_new_tokens=48, engine="vllm", engine_python=VLLM_PYTHON,
                           engine_args={"enforce_eager": True}, timing_rounds=1)
    report = validate(drafts["w8a8_int8"], opts)
    status = {c.name: c for c in report.checks}
    assert status["engine_outputs_equal"].status == "pass", status["engine_outputs_equal"].message
    agrees = status["engine_acceptance_agrees"]
    assert agrees.status == "pass" or (agrees.status == "warn" and "quantizes its activations" in agrees.message)
    assert report.engine_run.counts.num_drafts > 0


def test_diff_names_the_quantization_a_copy_adds(drafts, tmp_path):
    from dflash_convert.convert.diff import diff_checkpoints

    against_source = diff_checkpoints(drafts["w4a16"], SOURCE)
    assert against_source.config_differences["quantization_config"].a == [
        "W4A16 (weights INT4 group 32; pack-quantized)"]
    assert not any(c.key.startswith("quantization_config") for c in against_source.informational)  # engines read it
    convert(drafts["w4a16"], tmp_path / "hf", ConvertOptions(to="hf"))
    assert not diff_checkpoints(drafts["w4a16"], tmp_path / "hf").config_differences


def test_inspect_fails_a_companion_that_disagrees_with_the_config(drafts, tmp_path, cli):
    bad = _copy_with(drafts["fp8_dynamic"], tmp_path / "bad",
                     lambda t: t.__setitem__("fc.weight_scale", t["fc.weight_scale"][:32]))
    checks = {c.name: c for c in inspect_checkpoint(bad).problems}
    assert checks["quantization"].status == "fail" and "`fc.weight_scale` has shape [32, 1]" in \
        checks["quantization"].message
    assert "unexpected_tensors" not in checks  # the one defect, reported once
    assert cli("inspect", bad).code == 3


def test_sglang_matches_the_config_against_bare_projection_names(drafts, tmp_path):
    """SGLang 0.5.23 builds a DFlash draft's layers without their `layers.N.` names: an ignore entry that names one
    layer selects no module there (it quantizes the layer the checkpoint left in float)."""
    ignore = ["lm_head", "fc", r"re:layers\.0\.mlp\..*"]  # fc kept in float, as SGLang needs
    q = quantize_draft(SOURCE, tmp_path / "q", "fp8_dynamic", ignore)
    checks = {c.name: c for c in inspect_checkpoint(q).checks}
    assert checks["quantized_serving.sglang"].status == "warn"
    assert r"re:layers\.0\.mlp\..*" in checks["quantized_serving.sglang"].message
    assert checks["quantized_serving.vllm"].status == "pass"
    # an entry naming the projection in every layer means the same with or without the layer names
    assert "bare projection" not in {c.name: c for c in inspect_checkpoint(drafts["fp8_dynamic"]).checks}[
        "quantized_serving.sglang"].message


@pytest.mark.parametrize("config", [[1, 2], {}, {"quant_method": "compressed-tensors", "config_groups": {"g": {
    "targets": "Linear", "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}],
    ids=["list", "empty", "targets_str"])
def test_a_malformed_quantization_config_is_one_line_naming_config_json(drafts, tmp_path, cli, config):
    """Not the weights file: the field is in config.json (a wrap that named model.safetensors first did)."""
    bad = _copy_with(drafts["fp8_dynamic"], tmp_path / "bad", lambda t: None)
    raw = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(raw, quantization_config=config)))
    result = cli("convert", str(bad), "-o", str(tmp_path / "out"))
    assert result.code == 1 and not (tmp_path / "out").exists()
    line = result.err.strip().splitlines()[-1]
    assert line.startswith(f"Error: {bad / 'config.json'}: field `quantization_config`"), line
    assert "model.safetensors" not in line


def _library_dequantized(q: Path) -> dict[str, torch.Tensor]:
    """compressed-tensors' own model-free dequantizer over the whole checkpoint (float32)."""
    from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer

    return CompressedTensorsDequantizer(str(q), dtype=torch.float32).process(load_file(q / "model.safetensors"))


def test_a_mixed_precision_draft_dequantizes_each_group_with_its_own_format(tmp_path):
    """Two config groups of different formats (FP8 attention and fc, packed INT4 MLPs; the model-level format
    `mixed-precision`, as llm-compressor writes it): each module is read with its group's scheme and dequantized
    exactly as the library does."""
    from dflash_runtime import load_draft
    from quantized_drafts import quantize_draft_groups

    q = quantize_draft_groups(SOURCE, tmp_path / "mixed", {"attention": ("fp8_dynamic", [r"re:.*self_attn\..*", "fc"]),
                                                             "mlp": ("w4a16", [r"re:.*mlp\..*"])})
    assert json.loads((q / "config.json").read_text())["quantization_config"]["format"] == "mixed-precision"
    groups = {m.module: m.scheme.group for m in open_checkpoint(q).quantized_modules()}
    assert groups["fc"] == groups["layers.1.self_attn.q_proj"] == "attention"
    assert groups["layers.0.mlp.down_proj"] == "mlp" and len(groups) == 15  # every linear module, in its group
    draft = load_draft(q, dtype=torch.float32)
    want = _library_dequantized(q)
    for tensor in catalogue.expected_shapes(draft.spec):
        assert torch.equal(draft.tensors[tensor].float(), want[tensor].float()), tensor


def test_an_ignore_pattern_naming_a_quantized_module_is_refused(drafts, tmp_path):
    """A `re:` ignore entry that names modules stored with quantization tensors: those tensors belong to no
    quantized module (the library would keep the stored FP8 values as the weight): refused, naming the tensor."""
    bad = _copy_with(drafts["fp8_dynamic"], tmp_path / "bad", lambda t: None)
    raw = json.loads((bad / "config.json").read_text())
    raw["quantization_config"]["ignore"] = ["lm_head", r"re:layers\.1\.mlp\..*"]
    (bad / "config.json").write_text(json.dumps(raw))
    with pytest.raises(DFlashError, match=r"tensor `layers\.1\.mlp\.(down|gate|up)_proj\.weight_scale` is a "
                                          r"quantization tensor, but `quantization_config` quantizes no module"):
        open_checkpoint(bad).quantized_modules()


def test_a_bare_projection_name_in_the_ignore_list_names_no_layer_as_the_library_matches(tmp_path):
    """compressed-tensors matches a name that is no `re:` pattern exactly: `down_proj` ignores no
    `layers.N.mlp.down_proj`, which llm-compressor then quantizes; the runtime dequantizes them as the library does."""
    from dflash_runtime import load_draft

    q = quantize_draft(SOURCE, tmp_path / "q", "fp8_dynamic", ["lm_head", "down_proj"])
    assert "layers.0.mlp.down_proj.weight_scale" in load_file(q / "model.safetensors")  # the library quantized it
    modules = {m.module for m in open_checkpoint(q).quantized_modules()}
    assert {"layers.0.mlp.down_proj", "layers.1.mlp.down_proj"} <= modules
    draft = load_draft(q, dtype=torch.float32)
    want = _library_dequantized(q)
    for tensor in catalogue.expected_shapes(draft.spec):
        assert torch.equal(draft.tensors[tensor].float(), want[tensor].float()), tensor
