"""The measurements the cost model is calibrated on, as data, the fit of each engine's constants to them, and
the model's error on every one.

A case is a published engine measurement (plain and speculative tokens/s at a tau, K, concurrency and
tensor-parallel size; or plain only, which sets the plain step and counts its plain error) or one of the bundled
runtime's own step times on a lent GPU (docs/performance.md). A
direction case is a source that states only the pay-off (faster or slower than no speculation, or which K wins)
at a tau range: it counts in the directions, never in the error median. Targets that cannot be downloaded here
are written as the few config.json values the model reads (their published config.json, as the Hub card or
public code that validates the checkpoint states them); drafts as the dimensions the model reads.
docs/performance.md cites each case's source and numbers.

The fit (`fit`) is the same for every engine and never per case: a grid over the bandwidth efficiency shared
by the serving engines (they run the same kinds of kernels), and, at each, every engine's fixed step cost and plain
admission cost as the least-absolute line through what its cases leave unexplained of a plain step against the share
of plain steps that admit a request, and its speculative step and admission costs the same line through each case's
speculative residual less that case's own plain residual (`fixed_costs_from_residuals`; without admissions, medians).
The fixed and admission costs come from the TP 1 cases; the TP > 1 cases set the all-reduce extra, one per-all-reduce
cost shared by the serving engines (`_allreduce_extra`), on top of the measured ALLREDUCE_LATENCY_S.
The compute efficiency is not fitted (no case is compute-bound): ASSUMED_COMPUTE_EFFICIENCY of the datasheet peak,
as large GEMMs reach.
`ENGINES` holds the result; a test checks that fitting again gives it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Any

from dflash_convert.predict.cost import (EngineConstants, draft_pass, mixed_share, plain_step, speculative_step,
                                         target_pass)
from dflash_convert.predict.facts import ModelFacts, target_facts
from dflash_convert.predict.gpus import gpu

ASSUMED_COMPUTE_EFFICIENCY = 0.6

QWEN3_8B = {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936, "torch_dtype": "bfloat16"}
QWEN3_30B_A3B = {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
                 "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                 "num_experts_per_tok": 8, "vocab_size": 151936, "torch_dtype": "bfloat16"}
QWEN3_5_4B = {"text_config": {
    "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
    "head_dim": 256, "intermediate_size": 9216, "vocab_size": 248320, "full_attention_interval": 4,
    "attn_output_gate": True, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "dtype": "bfloat16"}}
# https://huggingface.co/Qwen/Qwen3-32B-FP8 config.json: block-wise fp8 weights (the lm_head kept in bf16)
QWEN3_32B_FP8 = {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
                 "head_dim": 128, "intermediate_size": 25600, "vocab_size": 151936, "torch_dtype": "bfloat16",
                 "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                         "weight_block_size": [128, 128]}}
# https://huggingface.co/Qwen/Qwen3.5-35B-A3B config.json text_config: 40 layers, every 4th full attention, the
# rest Gated DeltaNet; 256 experts, 8 routed and one shared per token
QWEN3_5_35B_A3B = {"text_config": {
    "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "vocab_size": 248320, "full_attention_interval": 4,
    "attn_output_gate": True, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "dtype": "bfloat16"}}
# Qwen/Qwen3.8-27B-FP8 config.json text_config (the Qwen3.5-27B layout: 64 layers, every 4th full attention), as
# public loaders of Qwen3.8-27B check it; the block-wise fp8 quantization_config of Qwen's -FP8 checkpoints
QWEN3_8_27B_FP8 = {"text_config": {
    "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4,
    "head_dim": 256, "intermediate_size": 17408, "vocab_size": 248320, "full_attention_interval": 4,
    "attn_output_gate": True, "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "dtype": "bfloat16"},
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]}}

# Qwen/Qwen3.6-35B-A3B: the Qwen3.5-35B-A3B layout above, as its model card's architecture list states it (40 layers,
# 10 x (3 Gated DeltaNet + 1 gated attention), DeltaNet 16 QK / 32 V heads of 128, attention 16 / 2 KV heads of 256,
# 256 experts of 512, 8 routed + 1 shared, vocabulary 248,320) and copies of its config.json show it; served with
# `--quantization fp8` (online, dynamic: every linear layer's weights stored in fp8, the lm_head in bf16)
QWEN3_6_35B_A3B_FP8 = {**QWEN3_5_35B_A3B, "quantization_config": {"activation_scheme": "dynamic", "quant_method": "fp8"}}


def _draft(hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, vocab: int,
           features: int, window: int = 0) -> ModelFacts:
    return ModelFacts(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                      intermediate=intermediate, vocab=vocab, context_features=features * hidden,
                      sliding_layers=layers if window else 0, sliding_window=window)


# z-lab's Qwen3-8B-DFlash-b16: 5 layers at the target's width, reading 5 target layers (its config.json)
QWEN3_8B_DFLASH = _draft(4096, 5, 32, 8, 128, 12288, 151936, 5)
# the drafts of the other cases are not named with their dimensions in their sources: z-lab's layout (5 layers
# at the target's width, its MLP width, 5 target layers read) is assumed
QWEN3_30B_A3B_DFLASH = _draft(2048, 5, 32, 4, 128, 6144, 151936, 5)
QWEN3_5_4B_DFLASH = _draft(2560, 5, 32, 8, 128, 9216, 248320, 5)
QWEN3_5_35B_A3B_DFLASH = _draft(2048, 5, 32, 4, 128, 6144, 248320, 5)  # assumed as the Qwen3-30B-A3B draft's
# chutesai/Qwen3-32B-FP8-DFLASH (its card's architecture table): 5 layers at 5120, 32 heads (8 KV) of 128, MLP 9728,
# 5 target layers read, the target's embeddings and lm_head
QWEN3_32B_FP8_DFLASH = _draft(5120, 5, 32, 8, 128, 9728, 151936, 5)
# incoai/Qwen3.8-27B-DFlash2 config.json (z-lab's byte-identical): 5 sliding-window (2048) layers at 5120, 32 heads
# (8 KV) of 128, MLP 17408, 5 target layers read, block 8; its candidate selector (rank 256) is not counted
QWEN3_8_27B_DFLASH2 = _draft(5120, 5, 32, 8, 128, 17408, 248320, 5, window=2048)
# z-lab/Qwen3.6-35B-A3B-DFlash config.json (revision 42d3b34, as a public loader's test asserts it): 8 layers at
# 2048, 32 heads (4 KV) of 128, MLP 6144, vocabulary 248,320, block 16, 5 target layers read; the B200 runs loaded
# revision f181eece, whose dimensions are taken as the same
QWEN3_6_35B_A3B_DFLASH = _draft(2048, 8, 32, 4, 128, 6144, 248320, 5)

# Tomas Ruiz's B200 DFlash report: one B200, TP 1, aiperf on GSM8K (about 60 tokens in, 256 out), no prefix cache, up
# to 32 sequences; Qwen/Qwen3.6-35B-A3B with `--quantization fp8` and bf16 Gated DeltaNet states, the z-lab draft. Each
# run's figures are its summary.json's output tokens/s (the measured phase's, time to first token included) and
# acceptance length; docs/performance.md names each file. (engine, title, K, concurrency, tau, plain, speculative)
# https://huggingface.co/deepseek-ai/DeepSeek-R1-0528 config.json (DeepSeek-V3's layout): 61 layers, the first 3
# dense, MLA (q_lora_rank 1536, kv_lora_rank 512, rope 64), 256 routed experts (8 per token) and one shared; block-wise
# fp8 weights
DEEPSEEK_R1 = {"hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
               "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
               "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3, "moe_layer_freq": 1,
               "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
               "v_head_dim": 128, "vocab_size": 129280, "torch_dtype": "bfloat16",
               "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                       "weight_block_size": [128, 128]}}

# InferenceX's concurrency sweep of DeepSeek-R1 on H200 under SGLang (a run its CI made and posted to the issue):
# (concurrency, output tokens/s per GPU, mean TPOT ms)
INFERENCEX_870 = "https://github.com/SemiAnalysisAI/InferenceX/issues/870"
INFERENCEX_870_RUNS = ((8, 74.6, 12.8), (16, 111.9, 17.2), (32, 151.1, 25.6), (64, 223.6, 34.6))

B200_REPORT = "https://tomasruizt.github.io/reports/b200-dflash"
B200_RUNS = (
    ("vllm", "vLLM", 7, 2, 5.176, 429.5, 840.4),
    ("vllm", "vLLM", 7, 16, 5.210, 2309.3, 3055.1),
    ("vllm", "vLLM", 15, 1, 6.453, 241.6, 596.7),
    ("vllm", "vLLM", 15, 4, 6.636, 807.9, 1584.7),
    ("sglang", "SGLang", 7, 2, 5.358, 546.3, 1272.1),
    ("sglang", "SGLang", 7, 4, 5.211, 998.0, 1901.1),
    ("sglang", "SGLang", 15, 4, 6.341, 998.0, 1913.5),
    ("sglang", "SGLang", 15, 32, 6.586, 4121.8, 6711.0),
)
B200_NOTES = {
    "vllm": "vLLM 0.30.0, V2 model runner, drafter attention TRITON_ATTN; tau: 1 + accepted / draft steps",
    "sglang": "SGLang 0.5.20, --moe-runner-backend triton; tau: SGLang's sampled acceptance-length gauge",
}


@dataclass(frozen=True)
class Setting:
    """What a source measured on: the engine, GPU, target config values, draft dimensions, K and concurrency."""

    name: str
    source: str
    engine: str
    gpu: str
    target: dict[str, Any]
    draft: ModelFacts | None  # None: a plain-only case (no speculation measured)
    k: int
    concurrency: int


@dataclass(frozen=True)
class Case(Setting):
    """One measurement. kind "throughput": tokens/s plain and speculative; "draft step" / "verify step": the
    seconds of that one pass (the runtime's, compiled with CUDA graphs)."""

    tau: float
    context: float
    kind: str = "throughput"
    baseline_tokens_per_s: float | None = None
    speculative_tokens_per_s: float | None = None
    step_s: float | None = None
    notes: str = ""
    tp: int = 1  # tensor-parallel size: bytes and FLOPs split over tp GPUs, plus the all-reduces
    # each request's output tokens (a throughput case's admissions: a = concurrency x t / output_len per step); 0 for
    # a pass timed alone, where no request arrives
    output_len: int = 0
    # each request's prompt tokens: the prefill each admission runs (cost.prefill_pass); where the source states none,
    # the context the case assumes
    input_len: int = 0

    @property
    def measured_speedup(self) -> float | None:
        if self.baseline_tokens_per_s and self.speculative_tokens_per_s:
            return self.speculative_tokens_per_s / self.baseline_tokens_per_s
        return None

    @property
    def plain_only(self) -> bool:
        """A throughput case measured without speculation (no speculative figure): it calibrates the plain step (the
        efficiency, the fixed and plain admission costs, the all-reduces at its TP) and counts its plain error."""
        return self.kind == "throughput" and self.speculative_tokens_per_s is None


CASES: tuple[Case, ...] = (
    Case("Qwen3-8B on A800, SGLang, batch 1", "https://github.com/sgl-project/sglang/issues/29244", "sglang",
         "A800", QWEN3_8B, QWEN3_8B_DFLASH, k=15, concurrency=1, tau=2.8, context=300,
         baseline_tokens_per_s=88, speculative_tokens_per_s=162, output_len=512, input_len=300,
         notes="SGLang 0.5.13, CUDA graphs; block 16 (K 15); context: the log's few hundred tokens; output length "
         "not stated, assumed 512 (the log shows a request still decoding past 424 cached tokens)"),
    Case("Qwen3-30B-A3B on A800, SGLang, batch 1", "https://github.com/sgl-project/sglang/issues/29244", "sglang",
         "A800", QWEN3_30B_A3B, QWEN3_30B_A3B_DFLASH, k=15, concurrency=1, tau=2.0, context=300,
         baseline_tokens_per_s=146, speculative_tokens_per_s=93, output_len=512, input_len=300,
         notes="the same setup as the Qwen3-8B case; the MoE target slows down; output length assumed 512 as there"),
    Case("Qwen3.5-4B on H100, vLLM, batch 1", "https://github.com/vllm-project/vllm/issues/49730", "vllm",
         "H100-SXM", QWEN3_5_4B, QWEN3_5_4B_DFLASH, k=15, concurrency=1, tau=5.602, context=300,
         baseline_tokens_per_s=285, speculative_tokens_per_s=347, output_len=256, input_len=300,
         notes="vLLM nightly 0.23.1rc1, GSM8K; K 15 as z-lab's card launches it (assumed); hybrid target; output "
         "length from its table, (E2E p50 941 ms - TTFT p50 47 ms) / ITL p50 3.5 ms + 1 = 256; input length not stated, "
         "taken as the context assumed (300)"),
    Case("Qwen3-32B-FP8 on RTX PRO 6000, SGLang, concurrency 8", "https://huggingface.co/chutesai/Qwen3-32B-FP8-DFLASH",
         "sglang", "RTX-PRO-6000", QWEN3_32B_FP8, QWEN3_32B_FP8_DFLASH, k=15, concurrency=8, tau=2.46, context=512,
         baseline_tokens_per_s=229.1, speculative_tokens_per_s=423.0, output_len=1024, input_len=512,
         notes="SGLang 0.5.13.post1, ShareGPT, 200 prompts, up to 1,024 out (taken as 1,024: a cap, so the fewest "
         "admissions the source allows); block 16 (K 15); context assumed 512, and so the input length"),
    *(Case(f"Qwen3.6-35B-A3B-FP8 on B200, {title}, K {k}, concurrency {b}", B200_REPORT, engine, "B200",
           QWEN3_6_35B_A3B_FP8, QWEN3_6_35B_A3B_DFLASH, k=k, concurrency=b, tau=tau, context=60 + 256 / 2,
           baseline_tokens_per_s=plain, speculative_tokens_per_s=spec, output_len=256, input_len=60,
           notes=B200_NOTES[engine] + "; aiperf GSM8K, 256 out")
      for engine, title, k, b, tau, plain, spec in B200_RUNS),
    Case("DeepSeek-R1 on 8x H200, vLLM, TP 8, batch 1, plain only",
         "https://github.com/vllm-project/recipes/blob/main/DeepSeek/DeepSeek-V3.md", "vllm", "H200",
         DEEPSEEK_R1, None, k=0, concurrency=1, tau=1.0, context=7902 + 1000 / 2, tp=8,
         baseline_tokens_per_s=61.00, output_len=1000, input_len=7902,
         notes="vLLM's DeepSeek-V3/R1 recipe, its expected output: deepseek-ai/DeepSeek-R1-0528, --tensor-parallel-size "
         "8 --enable_expert_parallel, benchmark_serving random 7,902 tokens in / 1,000 out, one request (TTFT 560 ms, "
         "TPOT 15.85 ms); vLLM version not stated; no speculative run. Expert parallel places whole experts on GPUs, "
         "the model splits their bytes evenly over the 8"),
    *(Case(f"DeepSeek-R1 on 8x H200, SGLang, TP 8, concurrency {b}, plain only", INFERENCEX_870, "sglang", "H200",
           DEEPSEEK_R1, None, k=0, concurrency=b, tau=1.0, context=1024 + 1024 / 2, tp=8,
           baseline_tokens_per_s=round(8 * per_gpu, 1), output_len=1024, input_len=1024,
           notes=f"SGLang v0.5.7, deepseek-ai/DeepSeek-R1-0528 fp8, TP 8, EP 1, random 1,024 in / 1,024 out; "
           f"the table's output throughput per GPU {per_gpu} tok/s x 8 (mean TPOT {tpot} ms); no speculative run")
      for b, per_gpu, tpot in INFERENCEX_870_RUNS),
    Case("runtime draft step, Qwen3-8B-DFlash-b16 shape, H100", "docs/performance.md (scripts/gpu-check.sh)",
         "runtime", "H100-SXM", QWEN3_8B, QWEN3_8B_DFLASH, k=15, concurrency=1, tau=1.0, context=512,
         kind="draft step", step_s=2.07e-3, notes="compiled with CUDA graphs, block 16 after 512 positions"),
    Case("runtime verify step, Qwen3-8B shape, H100", "docs/performance.md (scripts/gpu-check.sh)", "runtime",
         "H100-SXM", QWEN3_8B, QWEN3_8B_DFLASH, k=15, concurrency=1, tau=1.0, context=512, kind="verify step",
         step_s=10.6e-3, notes="compiled, 16 tokens after 512 cached"),
)


@dataclass(frozen=True)
class DirectionCase(Setting):
    """A source that states the pay-off without a full table: speculation `faster` or slower than none, or (with
    `versus_k`) K `k` faster than K `versus_k`. tau as the source gives it, a range (low, high); the model is right
    only where it holds over the whole range (for a ranking: `k` at its lowest tau against `versus_k` at its
    highest). Counted in the pay-off directions, never in the error median (no figures to compare)."""

    tau: tuple[float, float]
    context: float
    faster: bool = True
    versus_k: int | None = None
    versus_tau: tuple[float, float] | None = None
    tp: int = 1
    notes: str = ""
    # each request's output tokens, a range (low, high) where the source states none: right only where the
    # direction holds over the whole of it too
    output_len: tuple[int, int] = (0, 0)
    input_len: int = 0  # each request's prompt tokens (the admissions' prefills)


# vllm#42505 ran `evalscope perf` with its output length cut off in the stored text: 256 to 2,048, from a short
# benchmark answer (evalscope's and the engines' benchmarks commonly cap at 256-1,024) to a long reasoning one (the
# target thinks by default); a range, so that the case is right only where it holds over all of it
EVALSCOPE_OUTPUT_RANGE = (256, 2048)

DIRECTION_CASES: tuple[DirectionCase, ...] = (
    DirectionCase("Qwen3.5-35B-A3B on RTX PRO 6000, vLLM, K 4, concurrency 16",
                  "https://github.com/vllm-project/vllm/issues/42505", "vllm", "RTX-PRO-6000", QWEN3_5_35B_A3B,
                  QWEN3_5_35B_A3B_DFLASH, k=4, concurrency=16, tau=(2.0, 3.0), context=1024, faster=False,
                  output_len=EVALSCOPE_OUTPUT_RANGE, input_len=1024,
                  notes="vLLM 0.20.1, --max-num-seqs 16: 'slower than the baseline at concurrency > 8'; tau 2-3 from "
                  "the same reporter's z-lab/dflash#118 (K 4 or 16); context assumed 1,024; output length not "
                  "stated: EVALSCOPE_OUTPUT_RANGE"),
    DirectionCase("Qwen3.5-35B-A3B on RTX PRO 6000, vLLM, K 4, concurrency 1",
                  "https://github.com/vllm-project/vllm/issues/42505", "vllm", "RTX-PRO-6000", QWEN3_5_35B_A3B,
                  QWEN3_5_35B_A3B_DFLASH, k=4, concurrency=1, tau=(2.0, 3.0), context=1024, faster=True,
                  output_len=EVALSCOPE_OUTPUT_RANGE, input_len=1024,
                  notes="the same report: at concurrency 1 'the speedup is much lower than reported' (a speedup, "
                  "smaller than the paper's)"),
    DirectionCase("Qwen3.8-27B-FP8 on H20, vLLM, DFlash2 K 5 against K 7, 64k in",
                  "https://github.com/vllm-project/recipes/pull/839", "vllm", "H20", QWEN3_8_27B_FP8,
                  QWEN3_8_27B_DFLASH2, k=5, concurrency=10, tau=(2.6, 2.7), context=64000 + 1500, versus_k=7,
                  versus_tau=(2.5, 2.7), output_len=(3000, 3000), input_len=64000,
                  notes="vllm bench serve, random 64,000 in / 3,000 out, 10 prompts at 10 req/s: decode median 304.1 "
                  "tok/s at K 5 against 255.5 at K 7; no run without speculation"),
)

# The result of fit(CASES), rounded as printed; tests/predict checks fit(CASES) still gives it.
ENGINES: dict[str, EngineConstants] = {
    # (fixed, speculative, admission plain / speculative: a mixed step's extra, ADMISSIONS "split"; each TP all-reduce's
    # extra, shared by the serving engines: _allreduce_extra)
    "sglang": EngineConstants(0.77, ASSUMED_COMPUTE_EFFICIENCY, 2.827e-3, 2.222e-3, 0.0, 18.715e-3, 48.137e-6),
    "vllm": EngineConstants(0.77, ASSUMED_COMPUTE_EFFICIENCY, 3.520e-3, 3.732e-3, 4.756e-3, 39.964e-3,  # its own 5 at TP 1
                            48.137e-6),
    "runtime": EngineConstants(0.46, ASSUMED_COMPUTE_EFFICIENCY, 0.0, 0.0),
}


# ----------------------------------------------------------------------------- evaluating a case

@dataclass(frozen=True)
class CaseResult:
    case: Case
    predicted: dict[str, float]  # baseline_tokens_per_s, speculative_tokens_per_s, speedup; or step_s
    errors: dict[str, float]  # |predicted / measured - 1| per measured figure

    @property
    def direction_right(self) -> bool | None:
        measured = self.case.measured_speedup
        if measured is None:
            return None
        return (self.predicted["speedup"] > 1.0) == (measured > 1.0)


def evaluate(case: Case, constants: EngineConstants) -> CaseResult:
    target, g = target_facts(case.target, f"calibration case {case.name!r}"), gpu(case.gpu)
    if case.kind != "throughput":
        if case.kind == "draft step":
            p = draft_pass(case.draft, target, batch=case.concurrency, k=case.k, tau=case.tau, context=case.context,
                           gpu=g, constants=constants, tp=1)
        else:
            p = target_pass(target, batch=case.concurrency, tokens_per_seq=case.k + 1, context=case.context, gpu=g,
                            constants=constants, tp=1)
        seconds = p.seconds + constants.fixed_step_s
        return CaseResult(case, {"step_s": seconds}, {"step_s": abs(seconds / case.step_s - 1)})
    b = case.concurrency
    plain = plain_step(target, batch=b, context=case.context, gpu=g, constants=constants, tp=case.tp,
                       output_len=case.output_len, input_len=case.input_len)
    if case.plain_only:
        base = b / plain.seconds
        return CaseResult(case, {"baseline_tokens_per_s": base},
                          {"baseline_tokens_per_s": abs(base / case.baseline_tokens_per_s - 1)})
    spec = speculative_step(target, case.draft, batch=b, k=case.k, tau=case.tau, context=case.context, gpu=g,
                            constants=constants, tp=case.tp, output_len=case.output_len, input_len=case.input_len)
    base, fast = b / plain.seconds, b * case.tau / spec.seconds
    predicted = {"baseline_tokens_per_s": base, "speculative_tokens_per_s": fast, "speedup": fast / base}
    errors = {"baseline_tokens_per_s": abs(base / case.baseline_tokens_per_s - 1),
              "speculative_tokens_per_s": abs(fast / case.speculative_tokens_per_s - 1),
              "speedup": abs(predicted["speedup"] / case.measured_speedup - 1)}
    return CaseResult(case, predicted, errors)


@dataclass(frozen=True)
class ErrorBand:
    """The model's error over the calibration set: median and worst |predicted / measured - 1| of every
    measured figure (tokens/s plain and speculative, step times), and whether every pay-off direction is right."""

    median: float
    worst: float
    cases: int
    directions_right: int
    directions: int
    results: list[CaseResult] = field(default_factory=list)
    stated: list[DirectionResult] = field(default_factory=list)  # the direction-only cases

    def line(self) -> str:
        return (f"model error on {self.cases} calibration cases: median {self.median:.0%}, worst {self.worst:.0%}; "
                f"pay-off direction right in {self.directions_right} of {self.directions}"
                + (f" ({len(self.stated)} stated without figures)" if self.stated else ""))

    def speedup(self, engine: str) -> SpeedupError:
        """The error of the predicted speedup (the figure a user acts on) on `engine`'s own throughput cases, or,
        where it has fewer than MIN_OWN_CASES, on the serving engines' cases pooled (its own among them)."""
        serving = [r for r in self.results if "speedup" in r.errors and r.case.engine != "runtime"]
        own = [r for r in serving if r.case.engine == engine]
        pooled = len(own) < MIN_OWN_CASES
        errors = [r.errors["speedup"] for r in (serving if pooled else own)]
        if not errors:
            return SpeedupError(engine, pooled, 0, 0.0, 0.0)
        return SpeedupError(engine, pooled, len(errors), median(errors), max(errors))


@dataclass(frozen=True)
class SpeedupError:
    """The speedup's |predicted / measured - 1| over an engine's cases (`pooled`: the serving engines' together)."""

    engine: str
    pooled: bool
    cases: int
    median: float
    worst: float

    def line(self) -> str:
        if not self.cases:
            return f"speedup error: no measured case for {self.engine}"
        whose = (f"{self.engine}'s own {self.cases} cases" if not self.pooled else
                 f"the serving engines' {self.cases} cases pooled ({self.engine} has fewer than {MIN_OWN_CASES} "
                 "of its own)")
        return f"speedup error on {whose}: median {self.median:.0%}, worst {self.worst:.0%}"


@dataclass(frozen=True)
class DirectionResult:
    case: DirectionCase
    predicted: dict[str, float]  # the speedups (or, for a ranking, K's over versus_k's throughput) at each tau end
    right: bool


def evaluate_direction(case: DirectionCase, constants: EngineConstants) -> DirectionResult:
    """The speedups at each end of the tau range and of the output-length range (each monotone over such ranges), or
    for a ranking K's throughput over versus_k's at each output-length end; right only where every one agrees."""
    target, g = target_facts(case.target, f"calibration case {case.name!r}"), gpu(case.gpu)
    b = case.concurrency
    lengths = sorted(set(case.output_len))
    at = (lambda n: f" and {n} out") if len(lengths) > 1 else (lambda n: "")

    def tokens_per_s(k: int, tau: float, n: int) -> float:
        step = speculative_step(target, case.draft, batch=b, k=k, tau=tau, context=case.context, gpu=g,
                                constants=constants, tp=case.tp, output_len=n, input_len=case.input_len)
        return b * tau / step.seconds

    if case.versus_k is not None:
        versus = case.versus_tau or case.tau
        ratios = {f"ratio{at(n)}": tokens_per_s(case.k, case.tau[0], n) / tokens_per_s(case.versus_k, versus[1], n)
                  for n in lengths}
        return DirectionResult(case, ratios, all(r > 1.0 for r in ratios.values()))
    speedups = {}
    for n in lengths:
        plain = b / plain_step(target, batch=b, context=case.context, gpu=g, constants=constants, tp=case.tp,
                               output_len=n, input_len=case.input_len).seconds
        speedups.update({f"speedup at tau {tau:g}{at(n)}": tokens_per_s(case.k, tau, n) / plain for tau in case.tau})
    return DirectionResult(case, speedups, all((s > 1.0) == case.faster for s in speedups.values()))


def error_band(cases: tuple[Case, ...] = CASES, engines: dict[str, EngineConstants] | None = None,
               direction_cases: tuple[DirectionCase, ...] = DIRECTION_CASES) -> ErrorBand:
    engines = ENGINES if engines is None else engines
    results = [evaluate(c, engines[c.engine]) for c in cases]
    errors = [e for r in results for k, e in r.errors.items() if k != "speedup"]
    directions = [r.direction_right for r in results if r.direction_right is not None]
    stated = [evaluate_direction(c, engines[c.engine]) for c in direction_cases]
    directions += [r.right for r in stated]
    return ErrorBand(median(errors), max(errors), len(cases), sum(directions), len(directions), results, stated)


# ----------------------------------------------------------------------------- what the cases cover

def setting(target: ModelFacts) -> dict[str, str]:
    """The kinds of target a step's cost is modelled differently for, one value per dimension: its attention,
    its MLP and its weights' stored width (the narrowest of its layers')."""
    attention = ("MLA attention" if target.mla_kv_per_token else "linear-attention hybrid" if target.linear_layers
                 else "sliding-window attention" if target.sliding_layers else "full attention")
    width = min(target.weight_bytes, target.expert_weight_bytes if target.experts else target.weight_bytes)
    weights = "16-bit weights" if width >= 2 else "8-bit weights" if width >= 1 else "sub-8-bit weights"
    return {"attention": attention, "MLP": "MoE" if target.experts else "dense", "weights": weights}


# A share of a step's time above which its admissions are "visible": where the cases' admissions reach it, they set
# the admission costs; where a prediction's do, the attention kinds those cases had matter
VISIBLE_ADMISSIONS = 0.10


@dataclass(frozen=True)
class Coverage:
    """What the measured (throughput) cases span, read from the cases themselves: each setting dimension's values,
    the tensor-parallel sizes and concurrencies, and the terms their steps were bound by (plain and speculative);
    the TP sizes of the cases with a speculative figure; the attention of the targets whose admissions are a visible
    share of a step (VISIBLE_ADMISSIONS: the cases that set the admission costs); each TP > 1 case's target (named as
    its case, with its setting and engines: what the all-reduce extra was fitted on); and the input and output
    lengths."""

    kinds: dict[str, set[str]]
    tp: tuple[int, int]
    concurrency: tuple[int, int]
    bounds: set[str]
    speculative_tp: tuple[int, int] = (1, 1)
    admission_attention: set[str] = field(default_factory=set)
    tp_targets: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    input_len: tuple[int, int] = (0, 0)
    output_len: tuple[int, int] = (0, 0)

    def outside(self, target: ModelFacts, *, tp: int, concurrency: list[int], bounds: set[str],
                speculative: bool = False, admission_share: float = 0.0, input_len: int | None = None,
                output_len: int | None = None,
                length_names: tuple[str, str] = ("--input-len {}", "--output-len {}")) -> list[str]:
        """Each way a prediction's setting lies outside the cases, as a phrase naming what the cases have.
        `speculative`: the prediction has speculative steps; `admission_share`: the largest share of a predicted
        step its admissions take; the lengths: the request's (None: not asked), named by `length_names` (the
        caller's own words for them: predict's flags, validate's prompts and --max-new-tokens)."""
        kind = setting(target)
        out = [f"{value} (the cases: {', '.join(sorted(self.kinds[dim]))})"
               for dim, value in kind.items() if value not in self.kinds[dim]]
        if not self.tp[0] <= tp <= self.tp[1]:
            out.append(f"TP {tp} (the cases: TP {_span(self.tp)})")
        beyond = [b for b in concurrency if not self.concurrency[0] <= b <= self.concurrency[1]]
        if beyond:
            out.append(f"concurrency {', '.join(map(str, beyond))} (the cases: {_span(self.concurrency)})")
        new = sorted(b for b in bounds if b not in self.bounds and not b.startswith("does not fit"))
        if new:
            out.append(f"steps bound by {', '.join(new)} (the cases' steps: {', '.join(sorted(self.bounds))})")
        if speculative and not self.speculative_tp[0] <= tp <= self.speculative_tp[1]:
            out.append(f"speculation at TP {tp} is uncalibrated (the cases with a speculative figure: TP "
                       f"{_span(self.speculative_tp)}; every case beyond is plain only)")
        if admission_share >= VISIBLE_ADMISSIONS and kind["attention"] not in self.admission_attention:
            out.append(f"admissions {admission_share:.0%} of a step on a {kind['attention']} target (the admission "
                       f"costs were fitted where admissions matter on {', '.join(sorted(self.admission_attention))} "
                       "targets only)")
        if tp > 1 and tuple(kind.values()) not in {s for s, _ in self.tp_targets.values()}:
            runs = "; ".join(f"{name} ({', '.join(s)}; {', '.join(engines)})"
                             for name, (s, engines) in sorted(self.tp_targets.items()))
            out.append(f"the all-reduce cost at TP {tp}: its fitted extra rests on the runs of {runs} only")
        for name, n, span in ((length_names[0], input_len, self.input_len), (length_names[1], output_len,
                                                                             self.output_len)):
            if n is not None and not span[0] <= n <= span[1]:
                out.append(f"{name.format(n)} (the cases: {_span(span)})")
        return out


def _span(span: tuple[int, int]) -> str:
    return f"{span[0]}" if span[0] == span[1] else f"{span[0]} to {span[1]}"


def coverage(cases: tuple[Case, ...] = CASES, engines: dict[str, EngineConstants] | None = None) -> Coverage:
    engines = ENGINES if engines is None else engines
    measured = [c for c in cases if c.kind == "throughput"]
    kinds: dict[str, set[str]] = {}
    bounds: set[str] = set()
    admission_attention: set[str] = set()
    tp_targets: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for c in measured:
        target, g, constants = target_facts(c.target), gpu(c.gpu), engines[c.engine]
        kind = setting(target)
        for dim, value in kind.items():
            kinds.setdefault(dim, set()).add(value)
        steps = [plain_step(target, batch=c.concurrency, context=c.context, gpu=g, constants=constants,
                            tp=c.tp, output_len=c.output_len, input_len=c.input_len)]
        if not c.plain_only:
            steps.append(speculative_step(target, c.draft, batch=c.concurrency, k=c.k, tau=c.tau, context=c.context,
                                          gpu=g, constants=constants, tp=c.tp, output_len=c.output_len,
                                          input_len=c.input_len))
        bounds.update(s.bound for s in steps)
        if max(s.admissions_s / s.seconds for s in steps) >= VISIBLE_ADMISSIONS:
            admission_attention.add(kind["attention"])
        if c.tp > 1:  # the target as its case names it (the words before " on ")
            name = c.name.split(" on ")[0]
            engines_before = tp_targets.get(name, ((), ()))[1]
            tp_targets[name] = (tuple(kind.values()), tuple(sorted({*engines_before, c.engine})))
    speculative = [c.tp for c in measured if not c.plain_only]

    def span(values: list[int]) -> tuple[int, int]:
        return (min(values), max(values)) if values else (0, 0)

    return Coverage(kinds, span([c.tp for c in measured]), span([c.concurrency for c in measured]), bounds,
                    span(speculative), admission_attention, tp_targets, span([c.input_len for c in measured]),
                    span([c.output_len for c in measured]))


# ----------------------------------------------------------------------------- the fit

# How an engine's admission cost is fitted: "split" (kept) a plain and a speculative constant, X_plain and X_spec;
# "shared" one X for both; "none" no admission term. Chosen by the leave-one-out error (leave_one_out,
# docs/performance.md): "split" 7 % median against "shared" 10 % and "none" 11 %.
ADMISSIONS = "split"
ADMISSION_FORMS = ("none", "shared", "split")


def least_absolute_nonnegative(rows: list[list[float]], targets: list[float]) -> list[float]:
    """The coefficients x >= 0 minimising sum |target - row . x| (least absolute deviations, exactly). Such a fit lies
    at a vertex, where as many constraints hold exactly as there are coefficients (a row fitted exactly, or a
    coefficient at zero); every vertex is tried. Where several are best, their mean (also best: the loss is convex).
    With one coefficient and every row 1 this is the median, which is why it is the rule's robust line."""
    k = len(rows[0])
    tight = list(zip(rows, targets)) + [([1.0 if j == i else 0.0 for j in range(k)], 0.0) for i in range(k)]
    best, at = math.inf, set()
    for chosen in itertools.combinations(tight, k):
        x = _solve([list(r) for r, _ in chosen], [t for _, t in chosen])
        if x is None or min(x) < -1e-12:
            continue
        x = tuple(round(max(0.0, v), 15) for v in x)
        loss = sum(abs(t - sum(a * b for a, b in zip(r, x))) for r, t in zip(rows, targets))
        if loss < best - 1e-15:
            best, at = loss, {x}
        elif loss <= best + 1e-15:
            at.add(x)
    return [sum(v[j] for v in at) / len(at) for j in range(k)]


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """a x = b by Gaussian elimination with partial pivoting; None where a is singular."""
    n = len(b)
    m = [row + [rhs] for row, rhs in zip(a, b)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def fixed_costs_from_residuals(residuals: list[tuple[float, float | None, float, float]],
                               admissions: str = ADMISSIONS) -> tuple[float, float, float, float]:
    """An engine's fixed step cost F, speculative step cost S and admission costs X_plain, X_spec from its cases'
    residuals, each case (what the model leaves unexplained of its plain step, of its speculative step, in seconds;
    the share of its plain steps that admit a request, of its speculative steps: mixed_share). A plain residual is
    F + X_plain m_plain; a speculative one less its own plain one is S + X_spec m_spec - X_plain m_plain. Paired,
    because a speculative step's extra is measured against the plain step of the same engine, GPU and host:
    whatever a case's setting adds to both of its steps cancels in its difference.

    Each is a line fitted by least absolute deviations with every cost >= 0 (least_absolute_nonnegative): the median
    rule extended to a slope, so one case far off the line (vllm#49730) moves it no more than it moved the medians.
    "split": the plain line (F, X_plain), then the speculative one (S, X_spec) on each difference plus
    X_plain m_plain; "shared": one X for both, the plain residuals and the differences in one fit of (F, S, X);
    "none": X = 0, F and S the medians. A plain-only case (speculative residual None) is in the plain line only."""
    if not residuals:
        return 0.0, 0.0, 0.0, 0.0
    plain = [r[0] for r in residuals]
    paired = [r for r in residuals if r[1] is not None]
    extra = [spec - p for p, spec, _, _ in paired]
    if admissions == "none":
        (fixed,) = least_absolute_nonnegative([[1.0]] * len(plain), plain)
        (spec,) = least_absolute_nonnegative([[1.0]] * len(extra), extra) if extra else (0.0,)
        return fixed, spec, 0.0, 0.0
    if admissions == "shared":
        rows = [[1.0, 0.0, mp] for _, _, mp, _ in residuals] + [[0.0, 1.0, ms - mp] for _, _, mp, ms in paired]
        fixed, spec, x = least_absolute_nonnegative(rows, plain + extra)
        return fixed, spec, x, x
    if admissions != "split":
        raise ValueError(f"admissions: one of {ADMISSION_FORMS}, not {admissions!r}")
    fixed, x_plain = least_absolute_nonnegative([[1.0, mp] for _, _, mp, _ in residuals], plain)
    if not paired:
        return fixed, 0.0, x_plain, 0.0
    spec, x_spec = least_absolute_nonnegative([[1.0, ms] for _, _, _, ms in paired],
                                              [e + x_plain * mp for e, (_, _, mp, _) in zip(extra, paired)])
    return fixed, spec, x_plain, x_spec


def _fixed_costs(cases: list[Case], constants: EngineConstants,
                 admissions: str = ADMISSIONS) -> tuple[float, float, float, float]:
    """An engine's fixed, speculative and admission costs from what its throughput cases leave unexplained at
    `constants`' efficiencies (fixed_costs_from_residuals)."""
    zero = EngineConstants(constants.bandwidth_efficiency, constants.compute_efficiency, 0.0, 0.0)
    residuals = []
    for c in cases:
        if c.kind != "throughput":
            continue
        target, g = target_facts(c.target), gpu(c.gpu)
        # the prefills are the model's (the admission constants here zero): what is left is the engine's
        plain = plain_step(target, batch=c.concurrency, context=c.context, gpu=g, constants=zero, tp=c.tp,
                           output_len=c.output_len, input_len=c.input_len).seconds
        spec = None if c.plain_only else speculative_step(
            target, c.draft, batch=c.concurrency, k=c.k, tau=c.tau, context=c.context, gpu=g, constants=zero,
            tp=c.tp, output_len=c.output_len, input_len=c.input_len).seconds
        residuals.append((c.concurrency / c.baseline_tokens_per_s - plain,
                          None if spec is None else c.concurrency * c.tau / c.speculative_tokens_per_s - spec,
                          mixed_share(c.concurrency / c.output_len), mixed_share(c.concurrency * c.tau / c.output_len)))
    return fixed_costs_from_residuals(residuals, admissions)


def _allreduce_extra(cases: list[Case], engines: dict[str, EngineConstants]) -> float:
    """The seconds each all-reduce costs on top of ALLREDUCE_LATENCY_S and its bytes, shared by the group's engines:
    the least-absolute line through the origin of what the TP > 1 throughput cases leave unexplained of a plain step
    (at their engine's TP 1 constants) against the all-reduces the step makes (two per target layer); >= 0. One
    figure for the serving engines, since no engine has TP cases enough for its own and their all-reduce kernels are
    of one design (sglang#2904 adapts vLLM's). No TP case: 0, the measured latency alone."""
    rows, residuals = [], []
    for c in cases:
        if c.kind != "throughput":
            continue
        target, g = target_facts(c.target), gpu(c.gpu)
        step = plain_step(target, batch=c.concurrency, context=c.context, gpu=g, constants=engines[c.engine], tp=c.tp,
                          output_len=c.output_len, input_len=c.input_len)
        rows.append([2.0 * target.layers])
        residuals.append(c.concurrency / c.baseline_tokens_per_s - step.seconds)
    return least_absolute_nonnegative(rows, residuals)[0] if rows else 0.0


def _log_error(cases: list[Case], engines: dict[str, EngineConstants]) -> float:
    total = 0.0
    for c in cases:
        r = evaluate(c, engines[c.engine])
        total += sum(math.log(1 + e) ** 2 for k, e in r.errors.items() if k != "speedup")
    return total


# An engine's own fixed costs need at least this many throughput cases; with fewer it takes the fixed costs of the
# serving engines' cases pooled, its own among them (the same paired rule over the group's cases). One case alone
# sets both of an engine's fixed costs from its own residuals, whatever else made it slow (vllm#49730's 1.2x on a
# hybrid target, alone, sets an 11.2 ms speculative cost); taking another engine's constants instead would drop the
# engine's own case.
MIN_OWN_CASES = 2


def fit(cases: tuple[Case, ...] = CASES, admissions: str = ADMISSIONS,
        allreduce_extra: bool = True) -> dict[str, EngineConstants]:
    """Every engine's constants from the cases: the bandwidth efficiency on a grid of 0.005 from 0.2 to 0.9 (shared by the serving
    engines; the runtime's its own), fixed and admission costs as _fixed_costs says at each: an engine's own from its
    cases where it has MIN_OWN_CASES throughput cases, else from the group's cases pooled (its own among them)."""
    by_engine: dict[str, list[Case]] = {}
    for c in cases:
        by_engine.setdefault("runtime" if c.engine == "runtime" else "serving", []).append(c)
    out: dict[str, EngineConstants] = {}
    for group, members in by_engine.items():
        best: tuple[float, dict[str, EngineConstants]] | None = None
        for step in range(40, 181):  # 0.2 to 0.9: no engine streams more than 90 % of a datasheet bandwidth
            efficiency = step * 0.005
            trial = {}
            base = EngineConstants(efficiency, ASSUMED_COMPUTE_EFFICIENCY, 0.0, 0.0)
            # the fixed costs from the TP 1 cases, the TP > 1 ones giving the all-reduce extra; without the extra (the
            # form it is compared with) every case in the fixed costs' lines
            single = [c for c in members if c.tp == 1 or not allreduce_extra]
            for engine in sorted({c.engine for c in members}):
                mine = [c for c in single if c.engine == engine]
                own = sum(c.kind == "throughput" for c in mine) >= MIN_OWN_CASES or engine == "runtime"
                costs = _fixed_costs(mine if own else single, base, admissions)
                trial[engine] = EngineConstants(efficiency, ASSUMED_COMPUTE_EFFICIENCY, *costs)
            extra = _allreduce_extra([c for c in members if c.tp > 1], trial) if allreduce_extra else 0.0
            trial = {engine: replace(k, allreduce_extra_s=extra) for engine, k in trial.items()}
            score = _log_error(members, trial)
            if best is None or score < best[0] - 1e-12:
                best = (score, trial)
        out.update(best[1])
    return out


def leave_one_out(cases: tuple[Case, ...] = CASES, admissions: str = ADMISSIONS,
                  allreduce_extra: bool = True) -> list[CaseResult]:
    """Each serving engine's throughput case predicted by the constants fitted without it: how the model does on a
    case it was not fitted to, the figure that chooses between forms of the fit (ADMISSIONS)."""
    held = [c for c in cases if c.kind == "throughput" and c.engine != "runtime"]
    return [evaluate(c, fit(tuple(o for o in cases if o is not c), admissions, allreduce_extra)[c.engine])
            for c in held]
