"""Every family config key an engine reads survives a conversion or stops it by name; none is lost with
exit 0, and `diff` counts a difference in any of them (dflash_convert/format/keys.py is the table)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factories import copy_with_config, read_config
from dflash_convert import regenerate
from dflash_convert.format import keys

ROOT = Path(__file__).resolve().parents[2]
PAIR_DRAFT = ROOT / "examples" / "pair" / "draft"

# a value that changes the computation, per key (the table says what is neutral)
SET = {"input_embedding_scale": 2.0, "output_multiplier": 0.196, "final_logit_softcapping": 20.0,
       "sample_from_anchor": True, "use_swa": True, "swa_window_size": 64, "attention_sink_bias": True,
       "attention_value_scale": 0.5, "projector_type": "domino", "shift_label": 1, "pure_draft_prefix_len": 2,
       "gru_hidden_dim": 32, "emb_dim": 16}


def with_dflash_config(src: Path, dst: Path, **values) -> Path:
    shutil.copytree(src, dst)
    cfg = read_config(dst)
    cfg["dflash_config"].update(values)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    (dst / "conversion.json").unlink(missing_ok=True)
    return dst


@pytest.fixture(scope="module")
def hf_dflash2(family_drafts, tmp_path_factory) -> Path:
    from dflash_convert.convert.conversion import convert

    out = tmp_path_factory.mktemp("hf2") / "dflash2-hf"
    convert(family_drafts["dflash2"], out)
    return out


@pytest.fixture(scope="module")
def hf_dflash(tmp_path_factory) -> Path:
    from dflash_convert.convert.conversion import convert

    out = tmp_path_factory.mktemp("hf1") / "dflash-hf"
    convert(PAIR_DRAFT, out)
    return out


def test_every_key_an_engine_reads_has_a_value_here():
    assert set(SET) == {k.name for k in keys.config_keys() if not k.required and "dflash" in k.kinds}
    assert all(not keys.by_name()[k].is_neutral(v) for k, v in SET.items())


def test_zlab_dflash2_logit_maps_survive_or_stop_the_conversion(cli, hf_dflash2, tmp_path):
    """z-lab's DFlash2 fixture values: HF -> HF carries both; HF -> speculators has no field an engine reads
    for them, so it is refused naming the key, and nothing is written; `diff` with and without them: 3."""
    src = with_dflash_config(hf_dflash2, tmp_path / "src", output_multiplier=0.196, final_logit_softcapping=20.0)
    r = cli("convert", src, "-o", tmp_path / "hf", "--to", "hf")
    assert r.code == 0, r.err
    dc = read_config(tmp_path / "hf")["dflash_config"]
    assert (dc["output_multiplier"], dc["final_logit_softcapping"]) == (0.196, 20.0)
    r = cli("convert", src, "-o", tmp_path / "spec")
    assert r.code == 1 and "dflash_config.output_multiplier" in r.err and "Traceback" not in r.err, r.err
    assert not (tmp_path / "spec").exists()
    r = cli("diff", hf_dflash2, src, "--json")
    assert r.code == 3, r.err
    assert {"output_multiplier", "final_logit_softcapping"} <= set(r.json()["config_differences"])
    # the neutral values change nothing: converted, and equivalent
    neutral = with_dflash_config(hf_dflash2, tmp_path / "neutral", output_multiplier=1.0,
                                 final_logit_softcapping=None)
    assert cli("convert", neutral, "-o", tmp_path / "spec2").code == 0
    assert cli("diff", hf_dflash2, tmp_path / "spec2").code == 0


@pytest.mark.parametrize("name", sorted(SET))
def test_each_key_is_carried_or_refused_by_name(cli, hf_dflash, tmp_path, name):
    src = with_dflash_config(hf_dflash, tmp_path / "src", **{name: SET[name]})
    r = cli("convert", src, "-o", tmp_path / "hf", "--to", "hf")
    assert r.code == 0, r.err
    assert read_config(tmp_path / "hf")["dflash_config"][name] == SET[name]
    assert cli("diff", hf_dflash, src).code == 3
    r = cli("convert", src, "-o", tmp_path / "spec")
    if r.code == 0:  # carried: the speculators format has a field for it, and it comes back
        assert keys.by_name()[name].speculators and read_config(tmp_path / "spec")[name] == SET[name]
        assert cli("convert", tmp_path / "spec", "-o", tmp_path / "back").code == 0
        assert read_config(tmp_path / "back")["dflash_config"][name] == SET[name]
    else:
        assert r.code == 1 and name in r.err.strip().splitlines()[-1] and "Traceback" not in r.err, r.err
        assert not (tmp_path / "spec").exists()


def test_a_key_speculators_ignores_is_not_turned_on_by_converting(cli, tmp_path):
    """At a speculators config's top level, output_multiplier is a field nobody applies (training did not
    use it); an HF reader would apply dflash_config.output_multiplier, so conversion to HF is refused."""
    src = tmp_path / "src"
    shutil.copytree(PAIR_DRAFT, src)
    cfg = read_config(src)
    cfg["output_multiplier"] = 0.5
    (src / "config.json").write_text(json.dumps(cfg))
    r = cli("convert", src, "-o", tmp_path / "hf")
    assert r.code == 1 and "output_multiplier" in r.err and not (tmp_path / "hf").exists(), r.err
    cfg["output_multiplier"] = 1.0
    (src / "config.json").write_text(json.dumps(cfg))
    assert cli("convert", src, "-o", tmp_path / "hf").code == 0


def test_unknown_dflash_config_keys_go_hf_to_hf_and_are_named_when_left_out(cli, hf_dflash, tmp_path):
    src = with_dflash_config(hf_dflash, tmp_path / "src", my_note="kept")
    assert cli("convert", src, "-o", tmp_path / "hf", "--to", "hf").code == 0
    assert read_config(tmp_path / "hf")["dflash_config"]["my_note"] == "kept"
    r = cli("convert", src, "-o", tmp_path / "spec")
    assert r.code == 0 and "my_note" in r.err, r.err


def test_the_runtime_refuses_a_key_it_does_not_apply(cli, tmp_path):
    """validate cannot run output_multiplier: it says so (exit 1), never a verdict on the draft."""
    from dflash_convert.convert.conversion import convert

    convert(PAIR_DRAFT, tmp_path / "hf")
    src = with_dflash_config(tmp_path / "hf", tmp_path / "src", output_multiplier=0.5)
    r = cli("validate", src, "--target", ROOT / "examples" / "pair" / "target", "--levels", "numeric")
    assert r.code == 1 and "dflash_config.output_multiplier=0.5" in r.err, (r.code, r.err[-1500:])


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.floats(-100, 100, allow_nan=False),
                   st.sampled_from(["domino", "x"]))


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(sorted(SET)), value=VALUES)
def test_a_round_trip_keeps_what_engines_act_on_or_stops_by_name(hf_dflash, tmp_path_factory, name, value):
    """Any value of any table key: HF -> speculators -> HF keeps the value an engine acts on (absent and
    neutral are the same), or a conversion stops naming the key."""
    from dflash_convert.convert.conversion import convert
    from dflash_convert.errors import DFlashError
    from dflash_convert.io.checkpoint import open_checkpoint

    tmp = tmp_path_factory.mktemp("rt")
    src = with_dflash_config(hf_dflash, tmp / "src", **{name: value})
    try:
        convert(src, tmp / "spec")
        convert(tmp / "spec", tmp / "back")
    except DFlashError as exc:
        assert name in str(exc), str(exc)
        return
    before = keys.effective("dflash", open_checkpoint(src).spec.variant_fields)
    after = keys.effective("dflash", open_checkpoint(tmp / "back").spec.variant_fields)
    assert before == after


def test_the_docs_table_is_current():
    text = (ROOT / "docs" / "formats.md").read_text()
    assert keys.render_into(text) == text, f"docs/formats.md's key table is stale: run {regenerate.COMMAND}"


# ----------------------------------------------------------------------------- inspect sees the family

FAMILY_TENSORS = [f"layers.{i}.{part}_conv.{leaf}" for i in range(2) for part in ("attention", "mlp")
                  for leaf in ("base_kernel", "kernel_projection.weight")] + \
                 [f"candidate_selector.{leaf}" for leaf in ("predecessor_codebook", "successor_codebook",
                                                            "hidden_projection.weight")]


def test_every_saved_family_draft_inspects_clean_with_its_keys(cli, family_drafts):
    for name in family_drafts:  # dflash2 and DSpark, each shape speculators saves
        r = cli("inspect", family_drafts[name], "--json")
        failed = r.failed_checks()  # only engines that do not serve the family as trained
        assert all(c.startswith("engine_view.") for c in failed), (name, r.out[-2000:])
        assert r.code == (3 if failed else 0), (name, r.out[-2000:])
        checks = {c["name"]: c for c in r.json()["checks"]}
        assert checks["family_config"]["status"] == "pass" and checks["family_shapes"]["status"] == "pass"


def test_a_dflash2_without_its_convolutions_and_selector_names_them(cli, family_drafts, tmp_path):
    from factories import copy_draft

    def drop(tensors):
        for n in FAMILY_TENSORS:
            del tensors[n]
    assert len(FAMILY_TENSORS) == 11
    bad = copy_draft(family_drafts["dflash2"], tmp_path / "bad", edit_tensors=drop)
    r = cli("inspect", bad, "--json")
    assert r.code == 3, r.err
    assert "missing_tensors" in r.failed_checks() and "layers.0.attention_conv.base_kernel" in r.failed_checks()["missing_tensors"]


@pytest.mark.parametrize("update, check, needle", [
    ({"conv_kernel_size": 3}, "family_shapes", "base_kernel"),  # the tensors were saved with 2 taps
    ({"conv_group_size": 24}, "family_config", "conv_group_size divides hidden_size"),  # hidden 64
    ({"selector_rank": 7}, "family_shapes", "codebook"),
    ({"conv_kernel_size": 9}, "family_config", "at most block_size"),  # block 8
    ({"selector_top_k": 600}, "family_config", "at most the vocabulary"),  # vocab 512
])
def test_a_dflash2_whose_keys_disagree_with_its_tensors_fails_naming_both(cli, family_drafts, tmp_path, update,
                                                                          check, needle):
    src = copy_with_config(family_drafts["dflash2"], tmp_path / "src", lambda c: c.update(update))
    r = cli("inspect", src, "--json")
    assert r.code == 3, (r.code, r.err)
    assert check in r.failed_checks() and needle in r.failed_checks()[check], r.failed_checks()


def test_inspect_says_vllm_needs_its_v2_runner_for_dflash2(cli, family_drafts):
    r = cli("inspect", family_drafts["dflash2"], "--engine", "vllm")
    assert r.code == 0, r.err
    assert "vLLM (speculators format), by 0.33.0's rules: as trained (V2 model runner only)" in r.out, r.out
    assert "Model Runner V1 does not support: DFlash candidate-head drafts" in r.out


# ----------------------------------------------------------------------------- drafts of other layouts

def laguna_draft(path: Path, hidden: int = 64, layers: int = 1, ids=(1, 3)) -> Path:
    """A tiny checkpoint in the layout vLLM's laguna_dflash.py loads: fused qkv_proj, g_proj gate,
    aux_hidden_norms; the architecture as published (LagunaForCausalLM, served as DFlashLagunaForCausalLM)."""
    import torch
    from safetensors.torch import save_file

    path.mkdir()
    cfg = {"architectures": ["LagunaForCausalLM"], "model_type": "laguna", "hidden_size": hidden,
           "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 128, "vocab_size": 512, "rms_norm_eps": 1e-6, "block_size": 8,
           "dflash_config": {"mask_token_id": 511, "target_layer_ids": list(ids)}}
    (path / "config.json").write_text(json.dumps(cfg))
    t = {"fc.weight": torch.randn(hidden, hidden * len(ids)), "hidden_norm.weight": torch.ones(hidden),
         "norm.weight": torch.ones(hidden),
         **{f"aux_hidden_norms.{i}.weight": torch.ones(hidden) for i in range(len(ids))}}
    for i in range(layers):
        t[f"layers.{i}.self_attn.qkv_proj.weight"] = torch.randn(64 + 2 * 32, hidden)
        t[f"layers.{i}.self_attn.g_proj.weight"] = torch.randn(4, hidden)
        t[f"layers.{i}.self_attn.o_proj.weight"] = torch.randn(hidden, 64)
    save_file(t, path / "model.safetensors")
    return path


@pytest.mark.parametrize("arch", ["LagunaForCausalLM", "DFlashLagunaForCausalLM"])
@pytest.mark.parametrize("command", ["inspect", "convert", "validate"])
def test_a_laguna_draft_is_named_never_an_unexpected_tensor(cli, tmp_path, arch, command):
    src = laguna_draft(tmp_path / "laguna")
    cfg = read_config(src)
    cfg["architectures"] = [arch]
    (src / "config.json").write_text(json.dumps(cfg))
    args = {"inspect": ["inspect", src], "convert": ["convert", src, "-o", tmp_path / "out"],
            "validate": ["validate", src, "--levels", "static"]}[command]
    r = cli(*args)
    lines = r.err.strip().splitlines()
    assert r.code == 1 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert arch in lines[0] and "Laguna DFlash draft" in lines[0] and "aux_hidden_norms" in lines[0]
    assert "unexpected tensor" not in r.err + r.out and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, value", [("dspark_draft_topk", 8), ("logit_scale", 0.5)])
def test_dspark_keys_vllm_reads_at_the_top_level_are_carried_or_refused(cli, family_drafts, tiny_target, tmp_path,
                                                                         name, value):
    """vLLM's qwen3_dspark.py reads dspark_draft_topk and logit_scale from the top of an HF config: HF -> HF
    keeps them, HF -> speculators (no field an engine reads) refuses them by name, and the runtime, which
    applies neither, says it cannot run the draft (exit 1) instead of a verdict."""
    from dflash_convert.convert.conversion import convert

    convert(family_drafts["dspark"], tmp_path / "hf")
    src = tmp_path / "src"
    shutil.copytree(tmp_path / "hf", src)
    cfg = read_config(src)
    cfg[name] = value
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "conversion.json").unlink(missing_ok=True)
    assert cli("convert", src, "-o", tmp_path / "again", "--to", "hf").code == 0
    assert read_config(tmp_path / "again")[name] == value
    r = cli("convert", src, "-o", tmp_path / "spec")
    assert r.code == 1 and name in r.err and not (tmp_path / "spec").exists(), r.err
    assert cli("diff", tmp_path / "hf", src).code == 3
    r = cli("validate", src, "--target", tiny_target, "--levels", "numeric")
    assert r.code == 1 and name in r.err, (r.code, r.err[-1500:])
