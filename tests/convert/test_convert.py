"""Conversion both ways on drafts saved by the real speculators library: configs, tensors, round trips."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from factories import assert_bit_identical, assert_hf_round_trip_is_bit_exact, read_config, tensors_of


def zlab_style(src_hf: Path, dst: Path) -> Path:
    """An HF-format draft as z-lab publishes it: no causal flag, no verifier block."""
    shutil.copytree(src_hf, dst)
    cfg = read_config(dst)
    cfg["dflash_config"].pop("causal", None)
    cfg["dflash_config"].pop("verifier", None)
    cfg.pop("dtype", None)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    (dst / "conversion.json").unlink()
    return dst


# ----------------------------------------------------------------------------- speculators -> hf

def test_speculators_to_hf_config(cli, speculators_drafts, tiny_target, tmp_path):
    out = tmp_path / "hf"
    r = cli("convert", speculators_drafts["full"], "-o", out, "--verifier", tiny_target)
    assert r.code == 0, r.err
    src, cfg = read_config(speculators_drafts["full"]), read_config(out)
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == cfg["dflash_config"]["block_size"] == src["block_size"] == 8
    assert cfg["dflash_config"]["mask_token_id"] == src["mask_token_id"]
    assert cfg["dflash_config"]["target_layer_ids"] == [a - 1 for a in src["aux_hidden_state_layer_ids"]] == [0, 3, 5]
    assert cfg["num_target_layers"] == 8
    assert cfg["num_hidden_layers"] == 2 and cfg["hidden_size"] == 64
    # trainer default: every layer sliding + causal -> the all-layer flag is written
    assert cfg["dflash_config"]["causal"] is True
    assert cfg["layer_types"] == ["sliding_attention"] * 2
    assert "draft_vocab_size" not in cfg  # full vocab
    assert sorted(tensors_of(out)) == sorted(tensors_of(speculators_drafts["full"]))


def test_hf_output_reads_as_engines_read_it(cli, speculators_drafts, tmp_path):
    """transformers.AutoConfig loads it and exposes what vLLM / SGLang / z-lab read (docs/engines.md)."""
    from transformers import AutoConfig

    out = tmp_path / "hf"
    assert cli("convert", speculators_drafts["pruned"], "-o", out).code == 0
    cfg = AutoConfig.from_pretrained(out, trust_remote_code=False)
    assert cfg.architectures == ["DFlashDraftModel"]
    assert cfg.dflash_config["mask_token_id"] == 511
    assert cfg.dflash_config["target_layer_ids"] == [0, 3, 5]
    assert cfg.dflash_config["causal"] is True
    assert cfg.block_size == 8 and cfg.dflash_config["block_size"] == 8
    assert cfg.draft_vocab_size == 128 and cfg.vocab_size == 512
    with safe_open(out / "model.safetensors", "pt") as st:
        fc = st.get_tensor("fc.weight")
        assert list(fc.shape) == [cfg.hidden_size, len(cfg.dflash_config["target_layer_ids"]) * cfg.hidden_size]
        assert "d2t" in st.keys() and "lm_head.weight" in st.keys() and "t2d" not in st.keys()


def test_dropped_tensors_are_listed(cli, speculators_drafts, tmp_path):
    out = tmp_path / "hf"
    r = cli("convert", speculators_drafts["legacy_pruned"], "-o", out, "--json")
    assert r.code == 0, r.err
    dropped = r.json()["tensors_dropped"]
    assert set(dropped) == {"embed_tokens.weight", "t2d"}  # pruned lm_head and d2t are KEPT
    record = json.loads((out / "conversion.json").read_text())
    assert set(record["tensors_dropped"]) == {"embed_tokens.weight", "t2d"}
    assert {"lm_head.weight", "d2t"} <= set(record["tensors_kept"])
    out2 = tmp_path / "hf2"
    r = cli("convert", speculators_drafts["legacy"], "-o", out2, "--json")
    assert set(r.json()["tensors_dropped"]) == {"embed_tokens.weight", "lm_head.weight"}
    assert "copy of the verifier" in r.json()["tensors_dropped"]["lm_head.weight"]


def test_conversion_record(cli, speculators_drafts, tmp_path):
    out = tmp_path / "hf"
    assert cli("convert", speculators_drafts["full"], "-o", out, "--block-size", "8").code == 0
    record = json.loads((out / "conversion.json").read_text())
    src = speculators_drafts["full"]
    assert record["source_format"] == "speculators" and record["destination_format"] == "hf"
    for name in ("config.json", "model.safetensors"):
        assert record["input_files"][name] == hashlib.sha256((src / name).read_bytes()).hexdigest()
    assert record["options"]["block_size"] == 8
    assert record["tool_version"]


def test_mixed_draft_keeps_layer_types_and_warns(cli, speculators_drafts, tmp_path):
    out = tmp_path / "hf"
    r = cli("convert", speculators_drafts["mixed"], "-o", out)
    assert r.code == 0
    assert "mixed draft" in r.err
    cfg = read_config(out)
    assert "causal" not in cfg["dflash_config"]
    assert cfg["layer_types"] == ["full_attention", "sliding_attention"]


def test_non_causal_speculators_draft(cli, speculators_drafts, tmp_path):
    out = tmp_path / "hf"
    assert cli("convert", speculators_drafts["non_causal"], "-o", out).code == 0
    assert read_config(out)["dflash_config"]["causal"] is False


def test_last_layer_id_is_kept(cli, speculators_drafts, tiny_target, tmp_path):
    """aux id 8 on an 8-layer verifier = z-lab id 7 (the last layer): never dropped (speculators' converter bug)."""
    hf, back = tmp_path / "hf", tmp_path / "back"
    assert cli("convert", speculators_drafts["last_layer"], "-o", hf, "--verifier", tiny_target).code == 0
    assert read_config(hf)["dflash_config"]["target_layer_ids"] == [1, 4, 7]
    assert cli("convert", hf, "-o", back, "--verifier", tiny_target).code == 0
    assert read_config(back)["aux_hidden_state_layer_ids"] == [2, 5, 8]
    assert read_config(back)["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 15


# ----------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("name", ["full", "pruned", "legacy_pruned", "mixed", "non_causal", "all_full", "dflash2"])
def test_round_trip_speculators_hf_speculators(cli, speculators_drafts, tmp_path, name):
    src, hf, back = speculators_drafts[name], tmp_path / "hf", tmp_path / "back"
    assert cli("convert", src, "-o", hf).code == 0
    assert cli("convert", hf, "-o", back).code == 0
    a, b = tensors_of(src), tensors_of(back)
    dropped_by_design = {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}
    if name == "legacy_pruned":
        assert set(a) - set(b) == {"embed_tokens.weight"}
    else:
        assert set(a) == set(b)  # t2d comes back, rebuilt from d2t
    assert_bit_identical(a, b, set(a) - dropped_by_design)
    ca, cb = read_config(src), read_config(back)
    for key in ("aux_hidden_state_layer_ids", "mask_token_id", "block_size", "draft_vocab_size",
                "speculators_model_type", "sample_from_anchor", "speculators_config",
                "transformer_layer_config", "architectures"):
        assert ca[key] == cb[key], key
    # Same meaning; a draft without sliding layers gets `true` so vLLM keeps its full layers non-causal.
    no_sliding = "sliding_attention" not in ca["transformer_layer_config"]["layer_types"]
    assert cb["sliding_window_non_causal"] == (ca["sliding_window_non_causal"] or no_sliding)
    assert cli("diff", src, back).code == 0


@pytest.mark.parametrize("name", ["full", "pruned", "mixed"])
def test_round_trip_hf_speculators_hf(cli, speculators_drafts, tmp_path, name):
    assert_hf_round_trip_is_bit_exact(cli, speculators_drafts[name], tmp_path)


def test_speculators_output_loads_in_speculators(cli, speculators_drafts, tmp_path):
    """SpeculatorModel.from_pretrained loads our output and holds exactly our tensors."""
    import torch
    from speculators.model import SpeculatorModel

    for name in ("pruned", "mixed", "dflash2"):
        hf, spec = tmp_path / f"{name}-hf", tmp_path / f"{name}-spec"
        assert cli("convert", speculators_drafts[name], "-o", hf).code == 0
        z = zlab_style(hf, tmp_path / f"{name}-z") if name != "dflash2" else hf
        assert cli("convert", z, "-o", spec, "--no-verifier").code == 0  # z-lab configs name no verifier
        model = SpeculatorModel.from_pretrained(str(spec))
        assert type(model).__name__ == ("DFlash2DraftModel" if name == "dflash2" else "DFlashDraftModel")
        assert model.config.aux_hidden_state_layer_ids == [1, 4, 6]
        state = model.state_dict()
        for k, v in tensors_of(spec).items():
            assert torch.equal(state[k], v), k


def test_matches_speculators_own_converter(cli, speculators_drafts, tiny_target, tmp_path):
    """z-lab -> speculators gives the config and tensors speculators' DFlashConverter gives."""
    import warnings

    from speculators.convert.dflash.converter import DFlashConverter
    from speculators.models.dflash import DFlashSpeculatorConfig

    hf = tmp_path / "hf"
    assert cli("convert", speculators_drafts["all_full"], "-o", hf).code == 0
    z = zlab_style(hf, tmp_path / "z")
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    assert cli("convert", z, "-o", ours, "--verifier", tiny_target).code == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        DFlashConverter().convert(z, theirs, base_model=str(tiny_target), validate=False)
    a, b = tensors_of(ours), tensors_of(theirs)
    assert set(a) == set(b)
    assert_bit_identical(a, b)
    ca = DFlashSpeculatorConfig.from_pretrained(ours).to_dict()
    cb = DFlashSpeculatorConfig.from_pretrained(theirs).to_dict()
    for key in ("aux_hidden_state_layer_ids", "mask_token_id", "block_size", "draft_vocab_size", "speculators_config",
                "sample_from_anchor", "target_hidden_size", "speculators_model_type"):
        assert ca[key] == cb[key], key
    # Full layers only: the flag means nothing to speculators, and `true` keeps vLLM from serving them causally
    # (speculators' converter writes false, which vLLM 0.33.0 reads as "every layer causal").
    assert ca["sliding_window_non_causal"] is True and cb["sliding_window_non_causal"] is False
    ta, tb = ca["transformer_layer_config"], cb["transformer_layer_config"]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "vocab_size", "layer_types", "rms_norm_eps", "rope_parameters"):
        assert ta[key] == tb[key], key


# ----------------------------------------------------------------------------- options

def test_overrides(cli, speculators_drafts, tmp_path):
    out = tmp_path / "hf"
    r = cli("convert", speculators_drafts["full"], "-o", out, "--mask-token-id", "500", "--target-layer-ids", "1,2,3",
            "--block-size", "4", "--non-causal")
    assert r.code == 0, r.err
    cfg = read_config(out)
    assert cfg["dflash_config"] == {**cfg["dflash_config"], "mask_token_id": 500, "target_layer_ids": [1, 2, 3],
                                    "block_size": 4, "causal": False}
    assert cfg["block_size"] == 4


def test_missing_target_ids_refused_or_derived_loudly(cli, speculators_drafts, tiny_target, tmp_path):
    hf = tmp_path / "hf"
    assert cli("convert", speculators_drafts["all_full"], "-o", hf).code == 0
    cfg = read_config(hf)
    del cfg["dflash_config"]["target_layer_ids"]
    (hf / "config.json").write_text(json.dumps(cfg))
    r = cli("convert", hf, "-o", tmp_path / "x")
    assert r.code == 1 and "target_layer_ids" in r.err and "--target-layer-ids" in r.err
    assert not (tmp_path / "x").exists()
    # the 8-layer target with 2 draft layers: round(1 + i * 4 / 1) -> [1, 5] but fc needs 3 ids -> shape error
    r = cli("convert", hf, "-o", tmp_path / "y", "--derive-target-layer-ids", "--verifier", tiny_target)
    assert r.code == 1 and "fc.weight" in r.err
    r = cli("convert", hf, "-o", tmp_path / "y", "--target-layer-ids", "0,3,5")
    assert r.code == 0


def test_derived_ids_are_announced(cli, speculators_drafts, tiny_target, tmp_path):
    from dflash_convert.format.mapping import build_target_layer_ids

    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert build_target_layer_ids(28, 3) == [1, 13, 25]
    assert build_target_layer_ids(28, 1) == [14]


def test_dtype_cast(cli, speculators_drafts, tmp_path):
    import torch

    out = tmp_path / "bf16"
    assert cli("convert", speculators_drafts["pruned"], "-o", out, "--dtype", "bfloat16").code == 0
    a, b = tensors_of(speculators_drafts["pruned"]), tensors_of(out)
    assert b["fc.weight"].dtype == torch.bfloat16 and torch.equal(b["fc.weight"], a["fc.weight"].to(torch.bfloat16))
    assert b["d2t"].dtype == torch.int64 and torch.equal(b["d2t"], a["d2t"])
    assert read_config(out)["dtype"] == "bfloat16"


def test_sharded_output_and_input(cli, speculators_drafts, tmp_path):
    sharded, back = tmp_path / "sharded", tmp_path / "back"
    assert cli("convert", speculators_drafts["full"], "-o", sharded, "--max-shard-size", "100KB").code == 0
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and not (sharded / "model.safetensors").exists()
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    t = tensors_of(sharded)
    assert set(index["weight_map"]) == set(t)
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in t.values())
    with safe_open(shards[0], "pt") as st:
        assert st.metadata() == {"format": "pt"}  # source safetensors metadata kept
    assert cli("convert", sharded, "-o", back).code == 0
    assert_bit_identical(tensors_of(speculators_drafts["full"]), tensors_of(back))


def test_json_output_is_one_object(cli, speculators_drafts, tmp_path):
    r = cli("convert", speculators_drafts["full"], "-o", tmp_path / "o", "--json")
    assert r.code == 0
    data = json.loads(r.out)
    assert data["destination_format"] == "hf" and data["tensors_kept"] == 25


def test_overwrite(cli, speculators_drafts, tmp_path):
    out = tmp_path / "o"
    assert cli("convert", speculators_drafts["full"], "-o", out).code == 0
    r = cli("convert", speculators_drafts["pruned"], "-o", out)
    assert r.code == 1 and "--overwrite" in r.err
    assert cli("convert", speculators_drafts["pruned"], "-o", out, "--overwrite").code == 0
    assert "d2t" in tensors_of(out)
    assert [p.name for p in tmp_path.iterdir()] == ["o"]  # no staging leftovers


def test_hub_cache_blob_names_are_the_recorded_sha256(cli, speculators_drafts, tmp_path):
    """Hub-cache LFS files are links to blobs/<sha256>: the record uses the name and stays exact."""
    src = speculators_drafts["full"]
    blobs, snap = tmp_path / "cache" / "blobs", tmp_path / "cache" / "snapshots" / ("a" * 40)
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        digest = hashlib.sha256((src / name).read_bytes()).hexdigest()
        shutil.copy(src / name, blobs / digest)
        (snap / name).symlink_to(blobs / digest)
    out = tmp_path / "out"
    assert cli("convert", snap, "-o", out).code == 0
    record = json.loads((out / "conversion.json").read_text())
    for name in ("config.json", "model.safetensors"):
        assert record["input_files"][name] == hashlib.sha256((src / name).read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- speculators' pre-2026-04-21 convention

def old_speculative_tokens(src: Path, dst: Path) -> Path:
    """A draft as speculators wrote DFlash before its PR #456: speculative_tokens = block_size and no
    sample_from_anchor key (that key came later)."""
    shutil.copytree(src, dst)
    cfg = read_config(dst)
    cfg.pop("sample_from_anchor", None)
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = cfg["block_size"]
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def test_old_speculative_tokens_convention_round_trips(cli, speculators_drafts, tiny_target, tmp_path):
    """Accepted with a warning naming the convention and what vLLM would serve; the copy states block_size - 1
    and conversion.json records the rewrite; HF and back keeps the trained block."""
    src = old_speculative_tokens(speculators_drafts["full"], tmp_path / "old")
    out, hf, back = tmp_path / "spec", tmp_path / "hf", tmp_path / "back"
    r = cli("convert", src, "-o", out, "--to", "speculators", "--verifier", tiny_target, "--json")
    assert r.code == 0, r.err
    said = " ".join(r.json()["warnings"])
    assert "PR #456" in said and "would serve 8 speculative tokens, 9 slots" in said
    assert "num_speculative_tokens=7" in said
    assert read_config(out)["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7
    assert read_config(out)["block_size"] == 8
    changes = json.loads((out / "conversion.json").read_text())["config_changes"]
    tokens = [c for c in changes if c["key"] == "speculators_config.proposal_methods"]
    assert [(c["before"][0]["speculative_tokens"], c["after"][0]["speculative_tokens"]) for c in tokens] == [(8, 7)]
    assert cli("convert", src, "-o", hf, "--verifier", tiny_target).code == 0
    assert read_config(hf)["block_size"] == 8
    assert cli("convert", hf, "-o", back, "--verifier", tiny_target).code == 0
    assert read_config(back)["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7


def test_old_convention_needs_its_writer_shape(cli, speculators_drafts, tmp_path):
    """speculative_tokens = block_size beside an explicit sample_from_anchor: false is no writer's convention
    (speculators writes block_size - 1 since that key exists): still refused."""
    src = old_speculative_tokens(speculators_drafts["full"], tmp_path / "old")
    cfg = read_config(src)
    cfg["sample_from_anchor"] = False
    (src / "config.json").write_text(json.dumps(cfg))
    r = cli("convert", src, "-o", tmp_path / "out")
    assert r.code == 1 and "speculative_tokens" in r.err
