"""One end-to-end run per num_speculative_tokens K: the side-by-side rows of the report and the K recommended
per concurrency, from each run's acceptance and timed steps (the cost model is cost.py)."""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from statistics import median

from dflash_convert.validate import cost
from dflash_convert.validate.batch_costs import BatchTimes
from dflash_convert.validate.report import (AcceptanceStats, ConcurrencyCost, EngineStats, KRecommendation,
                                            SpeculativeTokensRun)

BATCH = 1  # the runtime decodes one sequence at a time: the costs it measures are batch 1's


def device_name(device: str) -> str:
    """The device the costs were measured on, named as a reader compares machines (GPU model, CPU model)."""
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), None)
    return f"cpu ({model or platform.processor() or platform.machine()})"


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _times(stats: AcceptanceStats) -> list[cost.StepTimes]:
    return [cost.StepTimes(*r) for r in stats.round_step_times]


def batched(stats: AcceptanceStats, batch: BatchTimes) -> list[cost.StepTimes]:
    """One K's step times at `batch.batch` sequences per timing round: the target's batched verify (K+1 tokens per
    sequence) and target-only steps as timed, the draft's as that many of its batch-1 steps (one sequence each)."""
    k = len(stats.per_position_rates)
    draft = batch.batch * median(t.draft_s for t in _times(stats)) if stats.round_step_times else 0.0
    return [cost.StepTimes(draft, v, t) for v, t in zip(batch.verify_s.get(k + 1, []), batch.target_s)]


def concurrency_costs(stats: AcceptanceStats, batches: list[BatchTimes]) -> list[ConcurrencyCost]:
    """The report's costs and expected speedup of one K at each batch timed."""
    k = len(stats.per_position_rates)
    out = []
    for batch in batches:
        times = batched(stats, batch)
        if not times:
            continue
        e = cost.estimates({k: stats.acceptance_length}, {k: times})[0]
        out.append(ConcurrencyCost(
            concurrency=batch.batch, draft_step_s=times[0].draft_s, verify_step_s=median(t.verify_s for t in times),
            target_step_s=median(t.target_s for t in times), expected_speedup=round(e.speedup, 4),
            expected_speedup_range=[round(e.low, 4), round(e.high, 4)]))
    return out


def k_run(stats: AcceptanceStats, engine: EngineStats | None = None,
          batches: list[BatchTimes] | None = None) -> SpeculativeTokensRun | None:
    """The report row of one K's run, with vLLM's run of that K where it served the draft (`engine`) and its costs
    at the batches timed (`batches`, --concurrency); None where no timing round measured a step."""
    times = _times(stats)
    if not times:
        return None
    k = len(stats.per_position_rates)
    estimate = cost.estimates({k: stats.acceptance_length}, {k: times})[0]
    return SpeculativeTokensRun(
        num_speculative_tokens=k, block_size=stats.block_size, acceptance_length=stats.acceptance_length,
        per_position_rates=stats.per_position_rates, num_drafts=stats.num_drafts, outputs_equal=stats.outputs_equal,
        measured_speedup=round(stats.speedup, 4), draft_step_s=median(t.draft_s for t in times),
        verify_step_s=median(t.verify_s for t in times), target_step_s=median(t.target_s for t in times),
        expected_speedup=round(estimate.speedup, 4),
        expected_speedup_range=[round(estimate.low, 4), round(estimate.high, 4)], synthetic=stats.synthetic,
        vllm_counting=stats.vllm_counting, engine_run=engine, per_concurrency=concurrency_costs(stats, batches or []),
        per_context_length=stats.per_context_length, context_half_tau_length=stats.context_half_tau_length)


def recommendations(runs: list[AcceptanceStats], device: str,
                    batches: list[BatchTimes] | None = None) -> list[KRecommendation]:
    """The best K at each concurrency measured (batch 1: the runtime's decode loop; others: `batches`), with its
    spread and runner-up."""
    taus = {len(s.per_position_rates): s.acceptance_length for s in runs}
    costs = {BATCH: {len(s.per_position_rates): _times(s) for s in runs if s.round_step_times}}
    for batch in batches or []:
        costs[batch.batch] = {len(s.per_position_rates): batched(s, batch) for s in runs if s.round_step_times}
    out = []
    for r in cost.recommend(taus, costs):
        up = r.runner_up
        out.append(KRecommendation(
            concurrency=r.concurrency, num_speculative_tokens=r.best.num_speculative_tokens,
            expected_speedup=round(r.best.speedup, 4), expected_speedup_range=[round(r.best.low, 4),
                                                                               round(r.best.high, 4)],
            runner_up=up.num_speculative_tokens if up else None, runner_up_speedup=round(up.speedup, 4) if up else None,
            clear=r.clear, device=device, speculate=r.best.speedup >= 1.0))
    return out
