"""`predict`'s inputs: a K past the draft's block and a tau out of range refused (exit 2), a config the cost model
cannot read refused naming the file and the field (exit 1) while published configs still read, whether the
deployment fits in the GPU's memory, and validate --predict-gpu reading the configs before any work."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dflash_convert.errors import DFlashError
from dflash_convert.predict import calibration
from dflash_convert.predict.facts import target_facts
from dflash_convert.predict.gpus import GPU, gpu
from dflash_convert.predict.memory import target_weight_bytes
from dflash_convert.predict.prediction import Inputs, predict
from factories import draft_config as draft_for

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
DRAFT_CONFIG = PAIR / "draft" / "config.json"
PAIR_TARGET = json.loads((PAIR / "target" / "config.json").read_text())

# Published config.json dimensions (the fields the cost model reads), as their model repositories state them.
QWEN3_8B = {**calibration.QWEN3_8B, "tie_word_embeddings": False}
DEEPSEEK_V3 = {"hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
               "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
               "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3, "q_lora_rank": 1536,
               "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "vocab_size": 129280, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
               "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                       "weight_block_size": [128, 128]}}
DEEPSEEK_V2_LITE = {"hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
                    "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64,
                    "num_experts_per_tok": 6, "n_shared_experts": 2, "first_k_dense_replace": 1, "q_lora_rank": None,
                    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                    "vocab_size": 102400, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
GPT_OSS_20B = {"hidden_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
               "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
               "experts_per_token": 4, "vocab_size": 201088, "sliding_window": 128,
               "layer_types": ["sliding_attention", "full_attention"] * 12, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "mxfp4"}}
QWEN3_NEXT_80B = {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
                  "head_dim": 256, "intermediate_size": 5120, "moe_intermediate_size": 512,
                  "shared_expert_intermediate_size": 512, "num_experts": 512, "num_experts_per_tok": 10,
                  "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                  "linear_key_head_dim": 128, "linear_value_head_dim": 128, "vocab_size": 151936,
                  "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
QWEN3_235B = {"hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
              "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_experts": 128,
              "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16"}


# ----------------------------------------------------------------------------- --tau

@pytest.mark.parametrize("tau, line", [
    ("16=3", f"--tau 16=3: K 16 is past the draft's block: {DRAFT_CONFIG} has block_size 16, which proposes at "
             "most 15 tokens per step (K 1 to 15)"),
    ("7=4,31=9", f"--tau 7=4,31=9: K 31 is past the draft's block: {DRAFT_CONFIG} has block_size 16, which "
                 "proposes at most 15 tokens per step (K 1 to 15)"),
    ("0=1", "--tau 0=1: K must be at least 1, got 0"),
    ("-2=1", "--tau -2=1: K must be at least 1, got -2"),
    ("7=0.5", "--tau 7=0.5: tau of K=7 must be in [1, 8] (tokens per step), got 0.5"),
    ("7=8.01", "--tau 7=8.01: tau of K=7 must be in [1, 8] (tokens per step), got 8.01"),
    ("7=nan", "--tau 7=nan: tau of K=7 must be in [1, 8] (tokens per step), got nan"),
    ("7=inf", "--tau 7=inf: tau of K=7 must be in [1, 8] (tokens per step), got inf"),
])
def test_a_tau_the_draft_cannot_reach_is_refused_in_one_line_exit_2(cli, tau, line):
    r = cli("predict", "--target", PAIR / "target", "--draft", DRAFT_CONFIG, "--gpu", "H200", f"--tau={tau}")
    assert r.code == 2, (r.code, r.err)
    assert r.err.strip().splitlines() == [f"Error: {line}"], r.err


def test_the_draft_block_s_last_proposal_is_accepted(cli):
    r = cli("predict", "--target", PAIR / "target", "--draft", DRAFT_CONFIG, "--gpu", "H200", "--tau", "15=9,1=2",
            "--json")
    assert r.code == 0, r.err
    assert set(r.json()["taus"]) == {"1", "15"}


def test_a_draft_whose_anchor_slot_proposes_reaches_its_whole_block(cli, tmp_path):
    """DSpark with sample_from_anchor: every slot of the block of 16 proposes, so K 16 is within it."""
    config = json.loads(DRAFT_CONFIG.read_text())
    config.update(speculators_model_type="dspark", markov_rank=16, sample_from_anchor=True,
                  architectures=["DSparkDraftModel"])
    config["speculators_config"]["algorithm"] = "dspark"
    config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 16
    (tmp_path / "config.json").write_text(json.dumps(config))
    ok = cli("predict", "--target", PAIR / "target", "--draft", tmp_path, "--gpu", "H200", "--tau", "16=9", "--json")
    assert ok.code == 0 and set(ok.json()["taus"]) == {"16"}, ok.err
    past = cli("predict", "--target", PAIR / "target", "--draft", tmp_path, "--gpu", "H200", "--tau", "17=9")
    assert past.code == 2 and past.err.strip().splitlines() == [
        f"Error: --tau 17=9: K 17 is past the draft's block: {tmp_path / 'config.json'} has block_size 16, which "
        "proposes at most 16 tokens per step (K 1 to 16)"], past.err


# ----------------------------------------------------------------------------- config.json sizes

@pytest.mark.parametrize("config, fields", [
    (QWEN3_8B, dict(layers=36, experts=0, mla_kv_per_token=0, linear_layers=0, sliding_layers=0)),
    (calibration.QWEN3_30B_A3B, dict(layers=48, experts=128, top_k=8, expert_intermediate=768)),
    (DEEPSEEK_V3, dict(experts=256, top_k=8, dense_layers=3, mla_kv_per_token=576, shared_intermediate=2048,
                       compute="fp8")),
    (DEEPSEEK_V2_LITE, dict(experts=64, mla_kv_per_token=576, shared_intermediate=2 * 1408)),
    (GPT_OSS_20B, dict(experts=32, top_k=4, sliding_layers=12, sliding_window=128, expert_intermediate=2880)),
    (QWEN3_NEXT_80B, dict(experts=512, top_k=10, linear_layers=36, shared_intermediate=512)),
    (calibration.QWEN3_5_4B, dict(layers=32, linear_layers=24, attention_gate=True)),
    (PAIR_TARGET, dict(layers=8, kv_heads=1, head_dim=32, tied_embeddings=False)),
])
def test_published_configs_read(config, fields):
    facts = target_facts(config)
    assert {k: getattr(facts, k) for k in fields} == fields


@pytest.mark.parametrize("config, published_gb, rel", [
    (QWEN3_8B, 8.19 * 2, 0.01),  # 8.19 B parameters in bf16
    (calibration.QWEN3_30B_A3B, 30.5 * 2, 0.02),  # 30.5 B (this config leaves its lm_head tied: a lower bound)
    (QWEN3_NEXT_80B, 80 * 2, 0.03),  # 80 B
    (GPT_OSS_20B, 13.8, 0.03),  # the mxfp4 checkpoint's 13.8 GB of safetensors
    (QWEN3_235B, 235 * 2, 0.01),
])
def test_stored_weights_match_the_published_sizes(config, published_gb, rel):
    assert target_weight_bytes(target_facts(config)) / 1e9 == pytest.approx(published_gb, rel=rel)


def _target(tmp_path: Path, **changes) -> Path:
    config = {k: v for k, v in {**PAIR_TARGET, **changes}.items() if v is not ...}  # ...: the field removed
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path / "config.json"


MLA = dict(kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=96)
HYBRID = dict(layer_types=..., full_attention_interval=4, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=32, linear_value_head_dim=32)


@pytest.mark.parametrize("changes, says", [
    (dict(num_hidden_layers=10 ** 12, layer_types=...), "`num_hidden_layers` is 1000000000000, not an integer in "
                                                         "[1, 1024]"),
    (dict(MLA, kv_lora_rank=-512), "`kv_lora_rank` is -512, not an integer in [1, 1048576]"),
    (dict(MLA, q_lora_rank=-1), "`q_lora_rank` is -1, not an integer in [1, 1048576]"),
    (dict(MLA, qk_rope_head_dim=-64), "`qk_rope_head_dim` is -64, not an integer in [0, 1024]"),
    (dict(MLA, v_head_dim=0), "`v_head_dim` is 0, not an integer in [1, 1024]"),
    (dict(MOE, num_experts_per_tok=9), "`num_experts_per_tok` is 9, not an integer in [1, num_experts (8)]"),
    (dict(MOE, num_experts_per_tok=...), "`num_experts_per_tok` is missing: a prediction needs it"),
    (dict(MOE, num_experts=10 ** 9), "`num_experts` is 1000000000, not an integer in [0, 65536]"),
    (dict(MOE, n_shared_experts="2"), "`n_shared_experts` is '2', not an integer in [0, 65536]"),
    (dict(MOE, first_k_dense_replace=9), "`first_k_dense_replace` is 9, not an integer in [0, num_hidden_layers (8)]"),
    (dict(HYBRID, full_attention_interval=0), "`full_attention_interval` is 0, not an integer in [1, 1024]"),
    (dict(layer_types=["full_attention"] * 3), "`layer_types` is ['full_attention', 'full_attention', "
                                               "'full_attention'], not a list of num_hidden_layers (8) layer type "
                                               "names"),
    (dict(hidden_size=True), "`hidden_size` is True, not an integer in [1, 131072]"),
    (dict(hidden_size=64.0), "`hidden_size` is 64.0, not an integer in [1, 131072]"),
    (dict(hidden_size=...), "`hidden_size` is missing: a prediction needs it"),
    (dict(num_key_value_heads=0), "`num_key_value_heads` is 0, not an integer in [1, num_attention_heads (2)]"),
    (dict(intermediate_size=...), "`intermediate_size` is missing or 0: a prediction needs the MLP width"),
    (dict(attn_output_gate="yes"), "`attn_output_gate` is 'yes', not true or false"),
    (dict(max_position_embeddings=0), "`max_position_embeddings` is 0, not an integer in [1, 1073741824]"),
    (dict(quantization_config={"quant_method": "gptq", "bits": True}),
     "`quantization_config.bits` is True, not an integer in [1, 16]"),
    (dict(quantization_config={"quant_method": "awq", "bits": 4, "group_size": -7}),
     "`quantization_config.group_size` is -7, not an integer in [-1, 1048576]"),
])
def test_a_config_the_cost_model_cannot_read_is_one_line_naming_the_file_and_field_exit_1(cli, tmp_path, changes,
                                                                                          says):
    config = _target(tmp_path, **changes)
    r = cli("predict", "--target", config, "--draft", DRAFT_CONFIG, "--gpu", "H200", "--tau", "7=4")
    assert r.code == 1, (r.code, r.err)
    assert r.err.strip().splitlines() == [f"Error: {config}: field {says}"], r.err


def test_a_non_finite_size_is_refused_by_the_reader_and_by_the_model(cli, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**PAIR_TARGET, "hidden_size": math.nan}))  # Python writes the NaN literal
    r = cli("predict", "--target", config, "--draft", DRAFT_CONFIG, "--gpu", "H200", "--tau", "7=4")
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1 and str(config) in r.err, r.err
    assert "NaN" in r.err and "Traceback" not in r.err, r.err
    for value in (math.nan, math.inf):  # a library caller's dict: the model's own check
        with pytest.raises(DFlashError, match=r"t.json: field `hidden_size` is (nan|inf), not an integer"):
            target_facts({**PAIR_TARGET, "hidden_size": value}, "t.json")


# ----------------------------------------------------------------------------- memory

def test_a_target_that_does_not_fit_gets_no_figures_and_the_recommendation_says_why(cli, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_235B))
    draft = draft_for(QWEN3_235B, tmp_path / "draft")
    r = cli("predict", "--target", tmp_path, "--draft", draft, "--gpu", "L4", "--tau", "7=4", "--json")
    assert r.code == 0, r.err
    out = r.json()
    (row,) = out["predictions"]
    assert row["fits"] is False and row["baseline_fits"] is False
    assert row["baseline_tokens_per_s"] is row["speculative_tokens_per_s"] is row["speedup"] is None
    # 235 B bf16 weights plus the KV cache of 1536 positions, against 90 % of the L4's 24 GB (24 x 2^30 bytes)
    assert row["baseline_memory_per_gpu_gb"] == pytest.approx(470.5, abs=0.1)
    assert row["baseline_bound"] == ("does not fit: needs 470.5 GB per GPU, has 23.2 (90% of 25.8 GB: the nominal GB "
                                     "as GiB)")
    (rec,) = out["recommendation"]
    assert rec["num_speculative_tokens"] is None and rec["speedup"] is None and rec["launch"] is None
    assert rec["target_fits"] is False
    assert rec["reason"].startswith("the target alone does not fit: needs 470.5 GB per GPU")
    text = cli("predict", "--target", tmp_path, "--draft", draft, "--gpu", "L4", "--tau", "7=4")
    assert "concurrency 1: does not fit: the target alone does not fit" in text.out, text.out
    tp8 = cli("predict", "--target", tmp_path, "--draft", draft, "--gpu", "H200", "--tp", "8", "--tau", "7=4",
              "--json").json()
    assert tp8["predictions"][0]["fits"] is True and tp8["predictions"][0]["speedup"] > 0
    assert tp8["predictions"][0]["baseline_memory_per_gpu_gb"] == pytest.approx(470.5 / 8, abs=0.1)


def test_a_target_that_fits_alone_but_not_with_its_draft_is_served_without_speculation():
    target = target_facts(QWEN3_8B)
    inputs = Inputs(target, calibration.QWEN3_8B_DFLASH, "t", "d")
    plain = predict(inputs, [gpu("H200")], {7: 4.0}, concurrency=[1], input_len=1024, output_len=512)
    need = plain.predictions[0]
    assert need.fits is True and need.memory_per_gpu_gb > need.baseline_memory_per_gpu_gb + 1.5  # the draft's
    # room for the target alone, in the GPU table's unit (nominal GB, read as GiB)
    between = (need.memory_per_gpu_gb + need.baseline_memory_per_gpu_gb) / 2 / 0.9 * 1e9 / 2 ** 30
    card = GPU("card", 4800, 989, 1979, between, 450)
    (row,) = predict(inputs, [card], {7: 4.0}, concurrency=[1], input_len=1024, output_len=512).predictions
    assert (row.baseline_fits, row.fits) == (True, False)
    assert row.baseline_tokens_per_s == plain.predictions[0].baseline_tokens_per_s
    assert row.speculative_tokens_per_s is None and row.speedup is None
    assert row.bound.startswith(f"does not fit: needs {row.memory_per_gpu_gb:.1f} GB per GPU")
    rec = predict(inputs, [card], {7: 4.0}, concurrency=[1], input_len=1024, output_len=512).recommendation[0]
    assert rec.num_speculative_tokens is None and rec.target_fits
    assert rec.reason.startswith(f"the target alone fits ({row.baseline_memory_per_gpu_gb:.1f} GB per GPU) but not "
                                 "with the draft")


def test_the_kv_cache_grows_with_concurrency_and_context_until_it_does_not_fit():
    inputs = Inputs(target_facts(QWEN3_8B), calibration.QWEN3_8B_DFLASH, "t", "d")
    rows = predict(inputs, [gpu("H100-SXM")], {7: 4.0}, concurrency=[1, 64], input_len=8192,
                   output_len=1024).predictions
    # Qwen3-8B caches 36 layers x 2 x 8 heads x 128 x 2 bytes = 147,456 bytes a position: 64 x 9216 positions
    # are 87 GB on top of 16.4 GB of weights
    assert rows[0].fits and not rows[1].fits
    assert rows[1].baseline_memory_per_gpu_gb - rows[0].baseline_memory_per_gpu_gb == pytest.approx(
        63 * 9216 * 147_456 / 1e9, abs=0.02)


def test_a_gpu_without_a_stated_memory_is_not_checked(cli):
    r = cli("predict", "--target", PAIR / "target", "--draft", DRAFT_CONFIG, "--gpu-spec", "name=x,bw=100,bf16=10",
            "--tau", "7=4", "--json")
    assert r.code == 0, r.err
    assert r.json()["predictions"][0]["fits"] is None and r.json()["predictions"][0]["speedup"] > 0
    assert any("memory not given" in n for n in r.json()["notes"])


# ----------------------------------------------------------------------------- validate --predict-gpu

def test_validate_reads_the_configs_for_the_prediction_before_any_work(cli, tmp_path, monkeypatch):
    """A target config the cost model cannot read fails validate --predict-gpu at once (it used to fail after the
    whole run): no level starts."""
    from dflash_convert.validate import run

    target = tmp_path / "target"
    target.mkdir()
    for f in (PAIR / "target").iterdir():
        (target / f.name).symlink_to(f)
    (target / "config.json").unlink()
    _target(target, **dict(MOE, num_experts_per_tok=9))  # the runtime's Qwen3 ignores the MoE keys; the cost model not
    started = []
    for level in ("_static_level", "_numeric_level", "_end_to_end_level"):
        monkeypatch.setattr(run, level, lambda *a, _name=level, **k: started.append(_name))
    r = cli("validate", PAIR / "draft", "--target", target, "--predict-gpu", "H200")
    assert r.code == 1, (r.code, r.err)
    assert r.err.strip().splitlines() == [f"Error: {target / 'config.json'}: field `num_experts_per_tok` is 9, "
                                          "not an integer in [1, num_experts (8)]"], r.err
    assert started == []


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3", "qwen3_next", "qwen3_5",
                                  "qwen3_5_conditional", "qwen3_5_moe", "kimi_k25"])
def test_every_architecture_as_transformers_writes_its_config_reads(kind):
    """The configs as transformers' own classes serialize them (their nulls, layer_types, nested text_config)."""
    import target_zoo

    config_cls, _, kwargs = target_zoo._classes(kind)
    facts = target_facts(json.loads(config_cls(**kwargs).to_json_string()), f"{kind}/config.json")
    assert facts.layers == target_zoo.LAYERS and facts.hidden == target_zoo.HIDDEN
    assert (facts.linear_layers > 0) == (kind in target_zoo.HYBRID)
    assert (facts.mla_kv_per_token > 0) == (kind in ("deepseek_v3", "kimi_k25"))


def test_a_prediction_written_before_the_memory_check_still_reads(cli):
    """validate --baseline and push's model card read earlier reports: their rows have no memory fields."""
    from dflash_convert.predict.prediction import PredictionReport, markdown_lines

    r = cli("predict", "--target", PAIR / "target", "--draft", DRAFT_CONFIG, "--gpu", "H200", "--tau", "7=4", "--json")
    old = r.json()
    for row in old["predictions"]:
        for key in ("memory_per_gpu_gb", "baseline_memory_per_gpu_gb", "fits", "baseline_fits"):
            del row[key]
    for rec in old["recommendation"]:
        del rec["target_fits"]
    lines = markdown_lines(PredictionReport.model_validate(old))
    assert any(line.startswith("| H200 | 7 | 1 | 4.00 |") and line.count(" | - | ") == 1 for line in lines), lines
