"""The measurements the cost model is calibrated on, as data, the fit of each engine's constants to them, and
the model's error on every one.

A case is a published engine measurement (plain and speculative tokens/s at a tau, K and concurrency) or one
of the bundled runtime's own step times on a lent GPU (docs/performance.md). Targets that cannot be
downloaded here are written as the few config.json values the model reads (their published config.json);
drafts as the dimensions the model reads. docs/performance.md cites each case's source and numbers.

The fit (`fit`) is the same for every engine and never per case: a grid over the bandwidth efficiency shared
by the serving engines (they run the same kinds of kernels), and, at each, every engine's fixed step cost and
speculative step cost as the median of what its cases leave unexplained. The compute efficiency is not fitted
(no case is compute-bound): ASSUMED_COMPUTE_EFFICIENCY of the datasheet peak, as large GEMMs reach.
`ENGINES` holds the result; a test checks that fitting again gives it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from dflash_convert.predict.cost import EngineConstants, plain_step, speculative_step, target_pass, draft_pass
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


def _draft(hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, vocab: int,
           features: int) -> ModelFacts:
    return ModelFacts(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                      intermediate=intermediate, vocab=vocab, context_features=features * hidden)


# z-lab's Qwen3-8B-DFlash-b16: 5 layers at the target's width, reading 5 target layers (its config.json)
QWEN3_8B_DFLASH = _draft(4096, 5, 32, 8, 128, 12288, 151936, 5)
# the drafts of the other cases are not named with their dimensions in their sources: z-lab's layout (5 layers
# at the target's width, its MLP width, 5 target layers read) is assumed
QWEN3_30B_A3B_DFLASH = _draft(2048, 5, 32, 4, 128, 6144, 151936, 5)
QWEN3_5_4B_DFLASH = _draft(2560, 5, 32, 8, 128, 9216, 248320, 5)


@dataclass(frozen=True)
class Case:
    """One measurement. kind "throughput": tokens/s plain and speculative; "draft step" / "verify step": the
    seconds of that one pass (the runtime's, compiled with CUDA graphs)."""

    name: str
    source: str
    engine: str
    gpu: str
    target: dict[str, Any]
    draft: ModelFacts
    k: int
    concurrency: int
    tau: float
    context: float
    kind: str = "throughput"
    baseline_tokens_per_s: float | None = None
    speculative_tokens_per_s: float | None = None
    step_s: float | None = None
    notes: str = ""

    @property
    def measured_speedup(self) -> float | None:
        if self.baseline_tokens_per_s and self.speculative_tokens_per_s:
            return self.speculative_tokens_per_s / self.baseline_tokens_per_s
        return None


CASES: tuple[Case, ...] = (
    Case("Qwen3-8B on A800, SGLang, batch 1", "https://github.com/sgl-project/sglang/issues/29244", "sglang",
         "A800", QWEN3_8B, QWEN3_8B_DFLASH, k=15, concurrency=1, tau=2.8, context=300,
         baseline_tokens_per_s=88, speculative_tokens_per_s=162,
         notes="SGLang 0.5.13, CUDA graphs; block 16 (K 15); context: the log's few hundred tokens"),
    Case("Qwen3-30B-A3B on A800, SGLang, batch 1", "https://github.com/sgl-project/sglang/issues/29244", "sglang",
         "A800", QWEN3_30B_A3B, QWEN3_30B_A3B_DFLASH, k=15, concurrency=1, tau=2.0, context=300,
         baseline_tokens_per_s=146, speculative_tokens_per_s=93,
         notes="the same setup as the Qwen3-8B case; the MoE target slows down"),
    Case("Qwen3.5-4B on H100, vLLM, batch 1", "https://github.com/vllm-project/vllm/issues/49730", "vllm",
         "H100-SXM", QWEN3_5_4B, QWEN3_5_4B_DFLASH, k=15, concurrency=1, tau=5.602, context=300,
         baseline_tokens_per_s=285, speculative_tokens_per_s=347,
         notes="vLLM nightly 0.23.1rc1, GSM8K; K 15 as z-lab's card launches it (assumed); hybrid target"),
    Case("runtime draft step, Qwen3-8B-DFlash-b16 shape, H100", "docs/performance.md (scripts/gpu-check.sh)",
         "runtime", "H100-SXM", QWEN3_8B, QWEN3_8B_DFLASH, k=15, concurrency=1, tau=1.0, context=512,
         kind="draft step", step_s=2.07e-3, notes="compiled with CUDA graphs, block 16 after 512 positions"),
    Case("runtime verify step, Qwen3-8B shape, H100", "docs/performance.md (scripts/gpu-check.sh)", "runtime",
         "H100-SXM", QWEN3_8B, QWEN3_8B_DFLASH, k=15, concurrency=1, tau=1.0, context=512, kind="verify step",
         step_s=10.6e-3, notes="compiled, 16 tokens after 512 cached"),
)

# The result of fit(CASES), rounded as printed; tests/predict checks fit(CASES) still gives it.
ENGINES: dict[str, EngineConstants] = {
    "sglang": EngineConstants(0.9, ASSUMED_COMPUTE_EFFICIENCY, 3.30e-3, 0.0),
    "vllm": EngineConstants(0.9, ASSUMED_COMPUTE_EFFICIENCY, 3.09e-3, 4.10e-3),  # pooled: one vLLM case (MIN_OWN_CASES)
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
    plain = plain_step(target, batch=b, context=case.context, gpu=g, constants=constants)
    spec = speculative_step(target, case.draft, batch=b, k=case.k, tau=case.tau, context=case.context, gpu=g,
                            constants=constants)
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

    def line(self) -> str:
        return (f"model error on {self.cases} calibration cases: median {self.median:.0%}, worst {self.worst:.0%}; "
                f"pay-off direction right in {self.directions_right} of {self.directions}")


def error_band(cases: tuple[Case, ...] = CASES, engines: dict[str, EngineConstants] | None = None) -> ErrorBand:
    engines = ENGINES if engines is None else engines
    results = [evaluate(c, engines[c.engine]) for c in cases]
    errors = [e for r in results for k, e in r.errors.items() if k != "speedup"]
    directions = [r.direction_right for r in results if r.direction_right is not None]
    return ErrorBand(median(errors), max(errors), len(cases), sum(directions), len(directions), results)


# ----------------------------------------------------------------------------- the fit

def _fixed_costs(cases: list[Case], constants: EngineConstants) -> tuple[float, float]:
    """An engine's fixed step cost and speculative step cost: the medians of what its cases leave unexplained
    (never below zero)."""
    zero = EngineConstants(constants.bandwidth_efficiency, constants.compute_efficiency, 0.0, 0.0)
    plain_left, spec_left = [], []
    for c in cases:
        target, g = target_facts(c.target), gpu(c.gpu)
        if c.kind != "throughput":
            continue
        plain = plain_step(target, batch=c.concurrency, context=c.context, gpu=g, constants=zero).seconds
        spec = speculative_step(target, c.draft, batch=c.concurrency, k=c.k, tau=c.tau, context=c.context, gpu=g,
                                constants=zero).seconds
        plain_left.append(c.concurrency / c.baseline_tokens_per_s - plain)
        spec_left.append(c.concurrency * c.tau / c.speculative_tokens_per_s - spec)
    fixed = max(0.0, median(plain_left)) if plain_left else 0.0
    extra = max(0.0, median(spec_left) - fixed) if spec_left else 0.0
    return fixed, extra


def _log_error(cases: list[Case], engines: dict[str, EngineConstants]) -> float:
    total = 0.0
    for c in cases:
        r = evaluate(c, engines[c.engine])
        total += sum(math.log(1 + e) ** 2 for k, e in r.errors.items() if k != "speedup")
    return total


# An engine's own fixed costs need at least this many throughput cases; with fewer it takes the serving engines'
# pooled ones. One case fits both of its fixed costs exactly, whatever else made it slow (vllm#49730's 1.2x on a
# hybrid target set an 11.6 ms speculative cost that predicted no speculation at tau 14.6 for every small target).
MIN_OWN_CASES = 2


def fit(cases: tuple[Case, ...] = CASES) -> dict[str, EngineConstants]:
    """Every engine's constants from the cases: the bandwidth efficiency on a grid of 0.005 from 0.2 to 0.9 (shared by the serving
    engines; the runtime's its own), fixed costs as _fixed_costs says at each: an engine's own from its cases where
    it has MIN_OWN_CASES throughput cases, else the group's pooled."""
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
            for engine in sorted({c.engine for c in members}):
                mine = [c for c in members if c.engine == engine]
                own = sum(c.kind == "throughput" for c in mine) >= MIN_OWN_CASES or engine == "runtime"
                fixed, extra = _fixed_costs(mine if own else members, base)
                trial[engine] = EngineConstants(efficiency, ASSUMED_COMPUTE_EFFICIENCY, fixed, extra)
            score = _log_error(members, trial)
            if best is None or score < best[0] - 1e-12:
                best = (score, trial)
        out.update(best[1])
    return out
