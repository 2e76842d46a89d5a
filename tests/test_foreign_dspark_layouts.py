"""DSpark drafts of other decoders: DeepSeek V4 / V4.1 (the draft is `mtp.*` tensors of the target checkpoint)
and the standalone Gemma 4, Kimi K3 and Muse Spark heads. Nothing converts them (docs/formats.md section 15):
each command refuses them in one line (exit 1) that names config.json and the field or architecture, and says
how vLLM and SGLang serve the draft instead. Checkpoints are tiny, built here, sharded where the real ones are."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from processes import VLLM_PYTHON, needs_vllm
from dflash_convert.format import foreign, kinds, mapping

HIDDEN = 32


def deepseek_target(path: Path, **config) -> Path:
    """A two-shard DeepSeek V4 checkpoint as DeepSeek ships it: target tensors, then the draft's mtp.* tensors
    (FP8 attention with its scale, an MXFP4 expert packed two to a byte with E8M0 scales) and an index."""
    path.mkdir()
    cfg = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": HIDDEN,
           "num_hidden_layers": 2, "vocab_size": 128, "hc_mult": 4, "n_routed_experts": 2, "expert_dtype": "fp4",
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
           "num_nextn_predict_layers": 1, "n_mtp_layers": 1, "dspark_block_size": 5, "dspark_markov_rank": 8,
           "dspark_noise_token_id": 127, "dspark_target_layer_ids": [0, 1], **config}
    (path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    shards = {
        "model-00001-of-00002.safetensors": {"embed.weight": torch.randn(128, HIDDEN),
                                             "layers.0.attn.wq_a.weight": torch.randn(16, HIDDEN)},
        "model-00002-of-00002.safetensors": {
            "mtp.0.main_proj.weight": torch.randn(HIDDEN, 2 * HIDDEN),
            "mtp.0.attn.wkv.weight": torch.randn(16, HIDDEN).to(torch.float8_e4m3fn),
            "mtp.0.attn.wkv.scale": torch.ones(1, 1),
            "mtp.0.ffn.experts.0.w1.weight": torch.randint(0, 255, (16, HIDDEN // 2), dtype=torch.uint8),
            "mtp.0.ffn.experts.0.w1.scale": torch.ones(16, 1).to(torch.float8_e8m0fnu),
            "mtp.0.markov_head.markov_w1.weight": torch.randn(128, 8)}}
    weight_map = {}
    for shard, tensors in shards.items():
        save_file(tensors, path / shard)
        weight_map.update(dict.fromkeys(tensors, shard))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def standalone_draft(path: Path, config: dict, tensors: dict) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, path / "model.safetensors")
    return path


def refusal(cli, src: Path, command: str, tmp_path: Path, plain: bool = False) -> str:
    """The one error line each command gives; nothing is written."""
    out = tmp_path / "out"
    args = {"inspect": ["inspect", src], "convert": ["convert", src, "-o", out],
            "validate": ["validate", src, "--levels", "static"]}[command]
    r = cli(*args)
    lines = r.err.strip().splitlines()
    assert r.code == 1 and len(lines) == 1 and "Traceback" not in r.err, (r.code, r.err)
    assert f"{src / 'config.json'}:" in lines[0] and not out.exists(), lines[0]
    assert "unexpected tensor" not in lines[0] and plain == ("not a DFlash checkpoint" in lines[0]), lines[0]
    return lines[0]


@pytest.mark.parametrize("command", ["inspect", "convert", "validate"])
def test_a_deepseek_target_carrying_its_dspark_draft_says_how_the_engines_serve_it(cli, tmp_path, command):
    src = deepseek_target(tmp_path / "dsv4")
    line = refusal(cli, src, command, tmp_path)
    assert "field `dspark_block_size` of a DeepseekV4ForCausalLM config" in line
    assert "mtp.*" in line and "MXFP4" in line
    assert """--speculative-config '{"method": "dspark", "num_speculative_tokens": 5}' (no model)""" in line
    assert "--speculative-algorithm DSPARK (no draft path)" in line and "nothing to convert" in line


def test_a_deepseek_v41_target_nesting_its_keys_in_text_config_is_found_as_sglang_merges_them(cli, tmp_path):
    """SGLang's V4.1 config lifts text_config's keys to the top level before it looks for dspark_* keys."""
    src = deepseek_target(tmp_path / "dsv41", architectures=["DeepseekV41ForCausalLM"], model_type="deepseek_v41",
                          dspark_block_size=None, dspark_markov_rank=None, dspark_noise_token_id=None,
                          dspark_target_layer_ids=None, text_config={"dspark_target_layer_ids": [0, 1],
                                                                     "dspark_block_size": 7})
    line = refusal(cli, src, "inspect", tmp_path)
    assert "field `dspark_block_size` of a DeepseekV41ForCausalLM config" in line
    assert '"num_speculative_tokens": 7}' in line and "DSPARK" in line


def test_a_deepseek_target_with_mtp_layers_only_is_served_by_each_engine_as_mtp(cli, tmp_path):
    src = deepseek_target(tmp_path / "mtp", dspark_block_size=None, dspark_markov_rank=None,
                          dspark_noise_token_id=None, dspark_target_layer_ids=None, num_nextn_predict_layers=2)
    line = refusal(cli, src, "convert", tmp_path)
    assert "field `num_nextn_predict_layers` of a DeepseekV4ForCausalLM config" in line
    assert """'{"method": "mtp", "num_speculative_tokens": 2}' (no model)""" in line
    assert "--speculative-algorithm EAGLE" in line and "DSpark" not in line


def test_a_deepseek_target_without_a_draft_is_not_a_dflash_checkpoint(cli, tmp_path):
    src = deepseek_target(tmp_path / "plain", dspark_block_size=None, dspark_markov_rank=None,
                          dspark_noise_token_id=None, dspark_target_layer_ids=None, num_nextn_predict_layers=0)
    r = cli("inspect", src)
    assert r.code == 1 and "not a DFlash checkpoint config" in r.err and "mtp" not in r.err, r.err


@pytest.mark.parametrize("value", ["5" * 100_000, 2 ** 40, True, -3], ids=["long", "large", "bool", "negative"])
def test_a_hostile_block_size_is_not_echoed(cli, tmp_path, value):
    src = deepseek_target(tmp_path / "hostile", dspark_block_size=value, text_config=[1, 2])
    line = refusal(cli, src, "inspect", tmp_path)
    assert len(line) < 1000 and '"num_speculative_tokens": <dspark_block_size>}' in line, line[:300]


def test_a_deepseek_target_by_hub_id_is_refused_before_any_weight_is_downloaded(cli, hub, hub_env, tmp_path):
    """The real ones are hundreds of GB: config.json is fetched and read first, the shards never."""
    src = deepseek_target(tmp_path / "dsv4")
    hub.seed_repo("deepseek-ai/tiny-v4", {p.name: p.read_bytes() for p in src.iterdir()})
    r = cli("inspect", "deepseek-ai/tiny-v4")
    assert r.code == 1 and "field `dspark_block_size`" in r.err and "nothing to convert" in r.err, r.err
    assert list(hub_env.rglob("config.json")) and not list(hub_env.rglob("*.safetensors"))


def test_a_target_shipping_its_dspark_draft_in_sglangs_subfolder_names_the_subfolder(cli, tiny_target, tmp_path):
    """SGLang takes a target's dspark/ subfolder as the draft path when none is given: pointed at the target,
    every command names that folder; a target without one keeps the plain line."""
    import shutil

    src = Path(shutil.copytree(tiny_target, tmp_path / "target"))
    plain = cli("inspect", src)
    assert plain.code == 1 and "not a DFlash checkpoint config" in plain.err and "dspark/" not in plain.err
    (src / "dspark").mkdir()
    (src / "dspark" / "config.json").write_text("{}")
    for command in ("inspect", "convert", "validate"):
        line = refusal(cli, src, command, tmp_path, plain=True)
        assert line.endswith(f"SGLang serves the DSpark draft in its dspark/ subfolder (--speculative-algorithm "
                             f"DSPARK with no draft path); to read that draft here, name the subfolder: "
                             f"{src / 'dspark'}"), line


@pytest.mark.parametrize("config", [{"model_type": ["deepseek_v4"]}, {"model_type": {"a": 1}},
                                    {"model_type": "deepseek_v4", "num_nextn_predict_layers": True}])
def test_a_hostile_model_type_or_layer_count_gets_the_plain_line(cli, tmp_path, config):
    src = standalone_draft(tmp_path / "odd", config, {"w": torch.zeros(1)})
    r = cli("inspect", src)
    assert r.code == 1 and "not a DFlash checkpoint config" in r.err and "Traceback" not in r.err, r.err


STANDALONE = {
    "Gemma4DSparkModel": ({"model_type": "gemma4_text", "attention_k_eq_v": True, "markov_rank": 8},
                          {"layers.0.self_attn.k_proj.weight": torch.randn(16, HIDDEN),
                           "lm_head.weight": torch.randn(128, HIDDEN)}),
    "K3DSparkModel": ({"model_type": "kimi_k3_dspark", "kv_lora_rank": 16, "markov_rank": 8},
                      {"context_proj.weight": torch.randn(HIDDEN, 2 * HIDDEN),
                       "layers.0.self_attn.kv_a_proj_with_mqa.weight": torch.randn(24, HIDDEN)}),
    "MuseSparkDSparkModel": ({"model_type": "muse_spark_dspark", "markov_rank": 8},
                             {"layers.0.self_attn.o_gate_proj.weight": torch.randn(HIDDEN, HIDDEN),
                              "lm_head.weight": torch.randn(64, HIDDEN), "d2t": torch.zeros(64, dtype=torch.long)}),
}


@pytest.mark.parametrize("arch", sorted(STANDALONE))
@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_a_standalone_dspark_head_of_another_decoder_is_served_as_it_is(cli, tmp_path, arch, command):
    config, tensors = STANDALONE[arch]
    src = standalone_draft(tmp_path / arch, {"architectures": [arch], **config}, tensors)
    line = refusal(cli, src, command, tmp_path)
    assert f"architectures naming {arch}" in line
    assert """'{"method": "dspark", "model": "<this directory>"}'""" in line
    assert "SGLang 0.5.23 has no loader for it" in line and "other than Qwen3's" in line


def test_a_muse_spark_draft_is_known_by_its_model_type_alone(cli, tmp_path):
    config, tensors = STANDALONE["MuseSparkDSparkModel"]
    line = refusal(cli, standalone_draft(tmp_path / "muse", config, tensors), "inspect", tmp_path)
    assert "model_type 'muse_spark_dspark'" in line and "Muse Spark DSpark draft" in line


@pytest.mark.parametrize("arch", ["DSparkDraftModel", "DSparkV41DraftModel"])
def test_vllms_names_for_a_deepseek_dspark_draft_point_to_the_target(cli, tmp_path, arch):
    """vLLM names a DeepSeek draft DSparkDraftModel / DSparkV41DraftModel once it has read it from the target;
    DSparkDraftModel with model_type qwen3 is a Qwen3DSparkModel (test_dspark.py)."""
    src = standalone_draft(tmp_path / arch, {"architectures": [arch], "model_type": "deepseek_v4"},
                           {"mtp.0.main_proj.weight": torch.randn(HIDDEN, 2 * HIDDEN)})
    line = refusal(cli, src, "inspect", tmp_path)
    assert f"architectures naming {arch}" in line and "mtp.*" in line and '"method": "dspark"' in line


@needs_vllm
def test_every_dspark_architecture_in_vllms_registry_is_read_or_refused_by_name():
    """The installed vLLM's speculative registry, read as source (no import): each DSpark architecture is one
    this tool reads, or one it refuses naming it (never 'not a DFlash checkpoint')."""
    where = subprocess.run([VLLM_PYTHON, "-c", "import importlib.util as u; "
                            "print(u.find_spec('vllm').submodule_search_locations[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    tree = ast.parse((Path(where) / "model_executor" / "models" / "registry.py").read_text())
    table = next(n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", None) == "_SPECULATIVE_DECODING_MODELS")
    names = {k.value for k in table.keys if "DSpark" in k.value}
    assert {"Qwen3DSparkModel", "DSparkDraftModel", "Gemma4DSparkModel", "K3DSparkModel"} <= names
    read = {kinds.of("dspark").hf_architecture}
    refused = set(mapping.REFUSED_ARCHITECTURES) | set(foreign.STANDALONE)
    assert names - read - refused == set()
