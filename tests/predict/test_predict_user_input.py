"""`predict` and `validate --predict-gpu` as a user types them: GPU names in the spellings users and drivers write,
flags given more than once, a draft given as the target, and a target model type whose config leaves a fact
unstated (Qwen3-Next's gated attention)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dflash_convert.cli._options import PARSERS
from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.predict.facts import target_facts
from dflash_convert.predict.gpus import gpu
from dflash_convert.validate.options import ValidateOptions

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"


@pytest.mark.parametrize("typed, part", [
    ("h100", "H100-SXM"), ("H100 SXM", "H100-SXM"), ("H100SXM", "H100-SXM"), ("RTX4090", "RTX-4090"),
    ("rtx 4090", "RTX-4090"), ("A100 80GB", "A100-80GB"), ("mi300x", "MI300X"), ("H100 PCIe", "H100-PCIe"),
    # what nvidia-smi and amd-smi report, pasted from the machine
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA GeForce RTX 4090", "RTX-4090"), ("AMD Instinct MI355X", "MI355X"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"), ("NVIDIA H20", "H20"), ("NVIDIA L4", "L4"),
])
def test_a_gpu_name_in_the_spellings_users_and_drivers_write_finds_its_part(typed, part):
    assert gpu(typed).name == part


@pytest.mark.parametrize("other", ["H100 NVL", "NVIDIA H200 NVL", "A100 80GB PCIe", "NVIDIA", "L40", "H2"])
def test_another_variant_of_a_part_is_unknown_not_read_as_its_sibling(other):
    """An H100 NVL (3.9 TB/s, 94 GB) or an A100 PCIe 80GB (1.9 TB/s) has other figures than the table's part."""
    with pytest.raises(UsageError, match="unknown GPU"):
        gpu(other)


def test_validate_s_predict_gpu_takes_the_names_predict_takes():
    """validate's list flag drops the spaces of each name ("rtx 4090" arrives as rtx4090): it named no GPU before."""
    names = PARSERS["names"]("rtx 4090,H100 SXM,NVIDIA A100-SXM4-80GB,AMD Instinct MI300X")
    assert ValidateOptions(predict_gpu=names).predict_gpu == ["RTX-4090", "H100-SXM", "A100-80GB", "MI300X"]


PAIR_ARGS = ("predict", "--target", PAIR / "target", "--draft", PAIR / "draft")


def test_gpu_tau_and_concurrency_given_twice_add_up_instead_of_the_last_one_winning(cli):
    r = cli(*PAIR_ARGS, "--gpu", "H100", "--gpu", "rtx 4090", "--gpu-spec", "name=a,bw=1000,bf16=100",
            "--gpu-spec", "name=b,bw=2000,bf16=200", "--tau", "3=2.5", "--tau", "7=3.5", "--concurrency", "1",
            "--concurrency", "4", "--json")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert [g["name"] for g in report["gpus"]] == ["H100-SXM", "RTX-4090", "a", "b"]
    assert report["taus"] == {"3": 2.5, "7": 3.5}
    assert sorted({(p["gpu"], p["num_speculative_tokens"], p["concurrency"]) for p in report["predictions"]}) == \
        sorted((g, k, c) for g in ("H100-SXM", "RTX-4090", "a", "b") for k in (3, 7) for c in (1, 4))


@pytest.mark.parametrize("args, line", [
    (("--gpu", "H100", "--tau", "3=2.5", "--tau", "3=2.6"), "--tau 3=2.5,3=2.6: K 3 is given twice"),
    (("--gpu", "H100", "--tau", "3=2.5", "--concurrency", "1,8", "--concurrency", "8"),
     "--concurrency 1,8,8: 8 is given twice"),
    (("--gpu-spec", "bw=1000,bf16=100", "--gpu-spec", "bw=2000,bf16=200", "--tau", "3=2.5"),
     "--gpu-spec bw=2000,bf16=200: name custom is another --gpu-spec's too (name it otherwise)"),
])
def test_a_value_given_twice_across_repeated_flags_is_one_line_exit_2(cli, args, line):
    r = cli(*PAIR_ARGS, *args)
    assert (r.code, r.err.strip().splitlines()) == (2, [f"Error: {line}"]), r.err


def test_a_draft_given_as_the_target_says_so_exit_2(cli):
    """Not "field `hidden_size` is missing": the speculators draft keeps it under transformer_layer_config."""
    target, draft = PAIR / "target", PAIR / "draft"
    swapped = cli("predict", "--target", draft, "--draft", target, "--gpu", "H100", "--tau", "3=2.5")
    assert (swapped.code, swapped.err.strip()) == (
        2, f"Error: the arguments look swapped: --target {draft} is a DFlash draft and --draft {target} is not; "
           f"write --target {target} --draft {draft}"), swapped.err
    both = cli("predict", "--target", draft / "config.json", "--draft", draft, "--gpu", "H100", "--tau", "3=2.5")
    assert (both.code, both.err.strip()) == (
        2, f"Error: --target {draft / 'config.json'} is a DFlash draft's config, not a target model's: give the model "
           "the draft was trained for (its verifier) as --target"), both.err


# Qwen/Qwen3-Next-80B-A3B-Instruct config.json, the fields the cost model reads: it states no attn_output_gate, yet
# transformers' Qwen3NextAttention projects q to num_attention_heads x head_dim x 2 (query and output gate)
QWEN3_NEXT = {"model_type": "qwen3_next", "hidden_size": 2048, "intermediate_size": 5120, "moe_intermediate_size": 512,
              "shared_expert_intermediate_size": 512, "num_experts": 512, "num_experts_per_tok": 10,
              "decoder_sparse_step": 1, "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
              "head_dim": 256, "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
              "linear_key_head_dim": 128, "linear_value_head_dim": 128, "vocab_size": 151936,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def test_qwen3_next_s_attention_is_gated_though_its_config_does_not_say_so():
    facts = target_facts(QWEN3_NEXT)
    assert facts.attention_gate
    # per full-attention layer: q 2048 x (16 x 256 x 2), k and v 2048 x (2 x 256) each, o (16 x 256) x 2048
    assert facts.attention_params == 2048 * 8192 + 2 * 2048 * 512 + 4096 * 2048 == 27_262_976
    assert not target_facts({**QWEN3_NEXT, "attn_output_gate": False}).attention_gate  # a stated value stands
    assert not target_facts({**QWEN3_NEXT, "model_type": "qwen3_moe"}).attention_gate
    # the whole model: 79.67 B parameters with the gates (80B published; 100.7 M fewer without them)
    assert facts.attention_params * facts.full_layers - target_facts(
        {**QWEN3_NEXT, "attn_output_gate": False}).attention_params * facts.full_layers == 12 * 2048 * 4096


def test_lengths_take_the_k_suffix_as_context_lengths_are_spoken_of(cli):
    """--input-len 64k (the recipes' "64k input") is 65536 tokens, as validate's --context-lengths and --max-model-len
    read it; a word is one line, exit 2."""
    r = cli(*PAIR_ARGS, "--gpu", "H200", "--tau", "3=2.5", "--input-len", "64k", "--output-len", "1K", "--json")
    assert r.code == 0, r.err
    assert (r.json()["input_len"], r.json()["output_len"], r.json()["context"]) == (65536, 1024, 65536 + 512)
    bad = cli(*PAIR_ARGS, "--gpu", "H200", "--tau", "3=2.5", "--input-len", "2 thousand")
    assert (bad.code, bad.err.strip()) == (
        2, "Error: --input-len 2 thousand: expected a token count (8192, 8k; k = 1024)"), bad.err


def test_inspect_answers_gpu_in_its_text_where_the_full_batch_stays_memory_bound(cli):
    """--gpu asks a question: a memory-bound launch was answered only in --json (the text showed problems only)."""
    r = cli("inspect", PAIR / "draft", "--engine", "vllm", "--num-speculative-tokens", "7", "--max-num-seqs", "4",
            "--gpu", "H100")
    assert r.code == 0, r.err
    # the ridge's figure follows the calibrated efficiencies (a refit moves it): the line, not the number, is tested
    assert re.search(r"verify_compute_bound: 4 sequences x \(K 7 \+ 1\) = 32 verify tokens per step; on H100-SXM a "
                     r"dense bf16 target's verify turns compute-bound past about \d+ tokens per step .*memory-bound at "
                     r"a full batch", " ".join(r.out.split())), r.out


def test_a_float32_checkpoint_is_counted_at_the_16_bits_the_engines_serve_it_in():
    """vLLM's dtype auto downcasts a float32 model (config/model.py _resolve_auto_dtype): its weights are read and held
    at 2 bytes, not the 4 its config states (which doubled the bytes per step and the memory)."""
    fp32 = target_facts({**QWEN3_NEXT, "torch_dtype": "float32"})
    assert (fp32.weight_bytes, fp32.expert_weight_bytes) == (2.0, 2.0)
    assert target_facts({**QWEN3_NEXT, "torch_dtype": "float16"}).weight_bytes == 2.0


@pytest.mark.parametrize("engine, line", [
    ("vllm", '--speculative-config \'{"method": "dspark", "model": "DRAFT", "num_speculative_tokens": 7}\''),
    ("sglang", "--speculative-algorithm DSPARK --speculative-draft-model-path DRAFT --speculative-num-draft-tokens 9"),
])
def test_a_dspark_draft_s_launch_line_serves_it_as_dspark(cli, family_drafts, tiny_target, engine, line):
    """Its launch line said method dflash / DFLASH at K+1 draft tokens: the engines would load it as another kind.
    DSpark: vLLM's method dspark; SGLang's DSPARK at gamma + 1 = 9 draft tokens (the model card's rule)."""
    from dflash_convert.hub.card import model_card
    from dflash_convert.io.checkpoint import open_checkpoint

    draft = family_drafts["dspark"]
    # a GPU this slow makes every step its weights' bytes: speculation pays, and a K is recommended
    r = cli("predict", "--target", tiny_target, "--draft", draft, "--gpu-spec", "name=slow,bw=1,bf16=0.1",
            "--tau", "7=4", "--engine", engine, "--json")
    assert r.code == 0, r.err
    (rec,) = r.json()["recommendation"]
    assert rec["num_speculative_tokens"] == 7 and line.replace("DRAFT", str(draft)) in rec["launch"], rec
    # the model card's prediction section, its launch lines naming the repo
    card = model_card(open_checkpoint(draft).spec, repo_id="org/d", validation={"prediction": r.json()})
    section = card[card.index("### Predicted throughput on GPUs"):]
    assert line.replace("DRAFT", "org/d") in section, section


@pytest.mark.parametrize("spec, name", [("name=,bw=1000,bf16=100", "''"), ("name=a\tb,bw=1000,bf16=100", "'a\\tb'")])
def test_a_gpu_spec_without_a_printable_name_is_refused_exit_2(cli, spec, name):
    """An empty name headed its table with nothing; a control character reached the terminal."""
    r = cli(*PAIR_ARGS, "--gpu-spec", spec, "--tau", "3=2.5")
    assert (r.code, r.err.strip().splitlines()) == (
        2, [f"Error: --gpu-spec name {name}: not a printable, non-empty name (the table's heading)"]), r.err


def test_mlp_only_layers_are_dense_layers():
    """Qwen3-MoE's mlp_only_layers (transformers' Qwen3MoeDecoderLayer gives them a dense MLP of intermediate_size) were
    read as MoE layers; an empty list (Qwen3-30B-A3B's) changes nothing."""
    qwen3_30b = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                 "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936}
    assert target_facts({**qwen3_30b, "mlp_only_layers": []}).dense_layers == 0
    two = target_facts({**qwen3_30b, "mlp_only_layers": [0, 47]})
    assert (two.dense_layers, two.moe_layers, two.intermediate) == (2, 46, 6144)
    # with decoder_sparse_step 2 (odd indices MoE): 24 dense by the step, and index 1 listed too
    assert target_facts({**qwen3_30b, "decoder_sparse_step": 2, "mlp_only_layers": [1, 2]}).dense_layers == 25
    with pytest.raises(DFlashError, match=r"field `mlp_only_layers` is \[48\], not a list of layer indices in "
                                          r"\[0, 47\]"):
        target_facts({**qwen3_30b, "mlp_only_layers": [48]})
