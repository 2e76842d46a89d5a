"""The validation report: the pydantic models (the JSON: `--json`, `schemas/validation-report.schema.json`,
generated from `ValidationReport`) and what every rendering of it says alike: the verdict line, the K a sweep
headlines, the prompts note, the sampling line and the acceptance counted each way.

Each other format has its own module: report_terminal (the rich table and lines on the console),
report_markdown (`--report-md` and the GitHub step summary, with the SVG chart beside it) and report_junit
(`--junit`); the model card is hub/card.py's.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, model_validator

from dflash_runtime import DRAFT_SAMPLING

from dflash_convert.predict.prediction import PredictionReport
from dflash_convert.validate.static import Check, Level, Status
from dflash_convert.validate.options import LEVELS, SamplingMode
from dflash_convert.validate.prompts import BUILTIN_TEXT_NOTE


class SamplingUsed(BaseModel):
    """How the end-to-end level sampled, resolved as vLLM resolves a chat request's parameters."""

    mode: SamplingMode = Field(description="auto: the model's generation_config.json, as vLLM's "
                                            "default --generation-config auto; greedy: temperature 0")
    temperature: float = Field(description="0: greedy")
    top_k: int = Field(description="0: off")
    top_p: float = Field(description="1: off")
    min_p: float = Field(description="0: off")
    repetition_penalty: float = Field(1.0, description="1: off; prompt and output tokens, as vLLM counts them")
    presence_penalty: float = Field(0.0, description="0: off; output tokens only, as vLLM counts them")
    frequency_penalty: float = Field(0.0, description="0: off; output tokens only, as vLLM counts them")
    sources: dict[str, str] = Field(description="field -> where its value came from: a flag, "
                                    "generation_config.json, vLLM default, --sampling greedy")
    not_applied: dict[str, str] = Field(
        default_factory=dict, description="generation_config.json keys this run does not apply -> why (those vLLM "
        "reads but that do not bear on acceptance, and those only transformers' generate applies)")
    stop_token_ids: list[int] = Field(default_factory=list, description="every id decoding stops on")
    stop_token_sources: dict[str, list[int]] = Field(
        default_factory=dict, description="config.json / generation_config.json / tokenizer -> its eos ids")


class Acceptance(BaseModel):
    """The counts every acceptance figure of the report carries, declared once: over `num_drafts` draft+verify
    steps, `accepted` proposals accepted; tau and the per-position rates follow from them. A run's figures, a
    prompt set's and the same decoding counted another way each add what is theirs."""

    num_drafts: int
    accepted: int
    acceptance_length: float = Field(description="tau: mean tokens committed per draft+verify step (max block_size; "
                                     "block_size + 1 for a dspark draft whose anchor slot proposes)")
    per_position_rates: list[float] = Field(
        description="fraction of steps whose k+1-th proposal was accepted (block_size - 1 positions; block_size when "
        "the anchor's slot proposes)")


class PromptSetAcceptance(Acceptance):
    """Acceptance on one named prompt set (a --dataset), as the papers' per-dataset tables report it."""

    source: str = Field(description="where the prompts came from (Hub dataset repo, commit, file)")
    prompts: int
    new_tokens: int


class AcceptanceCounts(Acceptance):
    """Acceptance counted one way: tau = 1 + accepted / num_drafts, rates[k] = share of draft steps whose
    draft k+1 was accepted."""

    drafted: int = Field(description="draft tokens proposed")


class SyntheticAcceptance(BaseModel):
    """vLLM's synthetic rejection sampler set to this run's acceptance: the keys to put in `--speculative-config`
    to load-test a fleet accepting as this draft did on these prompts. vLLM requires one rate per speculative
    token, each the unconditional share of steps whose first k+1 drafts were all accepted, in [0, 1] and
    non-increasing (checked here as vLLM checks it)."""

    num_speculative_tokens: int = Field(ge=1, description="K as vLLM runs the draft (the rates' length)")
    rejection_sample_method: Literal["synthetic"] = "synthetic"
    synthetic_acceptance_rates: list[float] = Field(description="per position: share of draft steps whose first "
                                                    "k+1 drafts were all accepted")
    counted: Literal["vllm", "last_block_shortened"] = Field(
        description="vllm: counted as vLLM counts (full last blocks, --engine vllm); last_block_shortened: each "
        "prompt's last block cut to max_new_tokens, which lowers the rates by at most one step per prompt")

    @model_validator(mode="after")
    def _as_vllm_checks(self):
        rates, k = self.synthetic_acceptance_rates, self.num_speculative_tokens
        if len(rates) != k or not all(0.0 <= r <= 1.0 for r in rates) or any(b > a for a, b in zip(rates, rates[1:])):
            raise ValueError(f"synthetic_acceptance_rates {rates} are not {k} non-increasing rates in [0, 1]")
        return self

    def speculative_config(self) -> dict[str, Any]:
        """The keys of vLLM's `--speculative-config` that replay this acceptance."""
        return self.model_dump(exclude={"counted"})


class KRecommendation(BaseModel):
    """The K with the best expected speedup at one concurrency, on the device its costs were measured on."""

    concurrency: int = Field(description="sequences per step the costs were measured at")
    num_speculative_tokens: int
    expected_speedup: float
    expected_speedup_range: list[float] = Field(description="[min, max] over the timing rounds")
    runner_up: int | None = Field(description="the next best K")
    runner_up_speedup: float | None
    clear: bool = Field(description="the best K's range lies above the runner-up's (else the rounds cannot tell "
                        "them apart)")
    device: str = Field(description="where the step costs were measured: they do not transfer to another device")
    speculate: bool = Field(True, description="whether to speculate at this concurrency on `device`: false when no "
                            "K's expected speedup reaches 1.0x there (num_speculative_tokens is then only the least "
                            "slow K; serve without speculation)")

    def advice(self) -> str:
        """The K to serve, or no speculation and why, in words: `num_speculative_tokens 3` or `no speculation
        (no K reaches 1.0x on the measured device; the best is K=3)`."""
        if self.speculate:
            return f"num_speculative_tokens {self.num_speculative_tokens}"
        return f"no speculation (no K reaches 1.0x on the measured device; the best is K={self.num_speculative_tokens})"


THRESHOLDS = ("min_acceptance_length", "min_position_rates", "min_speedup")


class PromptStats(BaseModel):
    """One prompt's speculative decoding."""

    prompt: int = Field(description="1-based, in the order of the prompts file (or the built-in set)")
    prompt_tokens: int
    new_tokens: int
    steps: int = Field(description="draft+verify steps")
    acceptance_length: float = Field(description="tau of this prompt: new tokens per step")
    output_equal: bool | None = Field(None, description="the output is the target's greedy output (None when "
                                      "sampling)")
    accepted_histogram: list[int] = Field(default_factory=list, description="verify steps by drafts accepted: "
                                          "entry a = steps that accepted exactly a (vLLM's per-request summary)")


class StepDecisions(BaseModel):
    """One prompt's greedy verify steps as vLLM counts them (--engine vllm), for the step-by-step comparison with
    the engine: the proposals each step accepted, and how near its decision sat to another outcome, as a gap
    relative to the binade of the logits compared (a gap g is g * 2^m ulps of a dtype with m mantissa bits; None:
    no other token competed): of the count (`margin`) and of any token it committed (`next_margin`)."""

    accepted: list[int]
    margin: list[float | None]
    next_margin: list[float | None]


class SliceAcceptance(Acceptance):
    """Acceptance on one slice of an end-to-end run: the prompts of one --context-lengths value or of one category,
    or the verify steps that began in one bucket of generated positions (validate/breakdown.py makes and renders
    them)."""

    label: str = Field(description="the slice as the report names it: `2048 tokens`, `64-256`, ...")
    prompts: int
    new_tokens: int
    context_tokens: int | None = Field(None, description="a context-length slice: the prompt length in tokens")
    category: str | None = Field(None, description="a category slice: the prompts' JSONL `category`")
    first_position: int | None = Field(None, description="an output bucket: its first generated position")
    end_position: int | None = Field(None, description="an output bucket: the position it ends before (None: open)")
    outputs_equal: int | None = Field(None, description="prompts whose speculative output is the target's greedy "
                                      "output (a context-length slice, greedy runs; None otherwise)")
    accepted_histogram: list[int] = Field(default_factory=list, description="verify steps by drafts accepted: "
                                          "entry a = steps that accepted exactly a")


class AcceptanceStats(Acceptance):
    """End-to-end speculative decoding on the prompts (greedy unless temperature > 0)."""

    prompts: int
    new_tokens: int = Field(description="tokens generated by speculative decoding, all prompts")
    block_size: int
    max_new_tokens: int
    temperature: float
    draft_sampling: Literal[DRAFT_SAMPLING] = Field(
        "greedy", description="greedy: the draft's argmax, accepted when equal to the target's token; "
        "probabilistic: sampled at the temperature, accepted by speculative rejection sampling")
    predicted_position_rates: list[float] | None = Field(
        None, description="dspark: the confidence head's estimate of each per-position rate (mean over steps of the "
        "product of its confidences up to that proposal, what vLLM's adaptive verification ranks proposals by); "
        "None without a confidence head")
    vllm_counting: AcceptanceCounts | None = Field(
        None, description="the same decoding counted as vLLM counts: the last block drafted and verified whole "
        "(block_size - 1 drafts) and acceptances past max_new_tokens counted; the figures above shorten the last "
        "block to what can still be emitted")
    synthetic: SyntheticAcceptance | None = Field(
        None, description="vLLM's synthetic rejection sampler set to this acceptance (None: no draft steps)")
    round_step_times: list[list[float]] = Field(
        default_factory=list, description="per timing round: [draft step, verify step, target-only step] in "
        "seconds, means per step at batch 1 (what the cost model reads)")
    vllm_steps: list[StepDecisions] | None = Field(
        None, description="greedy with --engine vllm: each prompt's verify steps counted as vLLM counts, with how "
        "near each decision sat to a tie (what engine_acceptance_agrees compares step by step)")
    outputs_equal: int | None = Field(description="prompts whose speculative output is the target's greedy output "
                                      "(None when sampling)")
    baseline_prompts: int = Field(description="prompts also decoded target-only (speedup, direct comparison)")
    target_attention: str | None = Field(None, description="the attn_implementation the target ran with")
    target_compiled: bool | None = Field(None, description="--compile: whether the target's verify step was "
                                         "compiled (None without --compile)")
    target_eager_reason: str | None = Field(None, description="--compile: why the target still ran eagerly")
    timing_rounds: int = Field(1, description="interleaved rounds of target-only and speculative decoding of the "
                               "baseline prompts that the tokens/s and the speedup are measured on")
    speculative_tokens_per_s: float = Field(description="speculative decoding over all timed runs")
    target_tokens_per_s: float = Field(description="target-only decoding over all timed runs")
    speedup: float = Field(description="speculative_tokens_per_s / target_tokens_per_s: the same timed runs")
    speedup_range: list[float] = Field(default_factory=list, description="[min, max] speedup of a single round")
    speculative_tokens_per_s_range: list[float] = Field(default_factory=list, description="[min, max] per round")
    target_tokens_per_s_range: list[float] = Field(default_factory=list, description="[min, max] per round")
    per_prompt: list[PromptStats] = Field(default_factory=list, description="each prompt's own figures")
    sampling: SamplingUsed | None = Field(None, description="temperature, top-k, top-p, min-p and stop ids used, "
                                          "with where each came from")
    prompt_format: str | None = Field(None, description="how text prompts became token ids (chat template or raw)")
    builtin_prompts: str | None = Field(None, description="set when the prompts were neither the user's (--prompts) "
                                        "nor a named set (--dataset): which built-in ones, and what tau on them means")
    per_prompt_set: dict[str, PromptSetAcceptance] = Field(
        default_factory=dict, description="tau and per-position rates per named prompt set (--dataset)")
    per_context_length: list[SliceAcceptance] = Field(
        default_factory=list, description="--context-lengths: the same decoding on prompts of each length")
    context_source: str | None = Field(None, description="--context-lengths: the text the long prompts were cut from")
    context_half_tau_length: int | None = Field(
        None, description="the first --context-lengths value whose tau is below half the run's own (short-context) "
        "tau; None: none is")
    per_category: list[SliceAcceptance] = Field(
        default_factory=list, description="tau, per-position rates and outputs equal per prompt category (a JSONL "
        "`category` field, as SpecBench and SPEED-Bench files carry)")
    per_output_bucket: list[SliceAcceptance] = Field(
        default_factory=list, description="the verify steps grouped by the generated position they began at "
        "(0-64, 64-256, 256-1024, 1024-...): tau against output length")
    per_request_histogram: list[int] = Field(default_factory=list, description="prompts per tau band: entry i = "
                                             "prompts whose tau is in [i + 1, i + 2) (the last band includes block)")
    prompt_ids_sha256: str | None = Field(None, description="SHA-256 of the prompts' token ids (JSON, compact): "
                                          "--baseline checks that two runs decoded the same prompts")
    vllm_context_counting: list[SliceAcceptance] = Field(
        default_factory=list, description="--context-lengths with --engine vllm: each length's prompts decoded again "
        "counted as vLLM counts (full last blocks), what vLLM's figures per length are compared with")
    vllm_context_steps: list[list[StepDecisions]] | None = Field(
        None, description="greedy, --context-lengths with --engine vllm: per length, each long prompt's verify steps "
        "counted as vLLM counts, with how near each decision sat to a tie (compared with vLLM's step by step)")
    # our speculative outputs of the long prompts per length (not in the JSON: the engine level compares vLLM's)
    _context_outputs: list[list[list[int]]] = PrivateAttr(default_factory=list)


class EngineStats(BaseModel):
    """The pair served by the real engine (`--engine-python`): the same prompts, max tokens and sampling."""

    engine: str
    version: str
    python: str = Field(description="the interpreter the engine ran under")
    engine_args: dict[str, Any] = Field(default_factory=dict, description="passed to the engine (vLLM's LLM(...))")
    engine_config: dict[str, Any] = Field(default_factory=dict, description="what the engine was built with: dtype, "
                                          "max_model_len, parallel sizes, executor backend, prefix caching")
    prompts: int
    outputs_equal: int | None = Field(description="greedy: prompts whose engine speculative output, engine "
                                      "target-only output and our target's greedy output are all equal; None when "
                                      "sampled (samples of different random streams are not compared)")
    counts: AcceptanceCounts = Field(description="the engine's own spec-decode counters")
    sampling: dict[str, Any] = Field(default_factory=dict, description="the engine's sampling: temperature, "
                                     "top_k, top_p, min_p and seed (prompt i seeded seed + i); temperature 0: greedy")
    tolerance: dict[str, Any] = Field(default_factory=dict, description="how the counts were compared: mode; "
                                      "greedy: step by step up to near-ties of tie_ulps ulps of dtype, with "
                                      "steps_compared, prompts_whole and steps_not_compared; sampled: tau (absolute), "
                                      "per_position and z (standard errors) of the interval derived from the counts")
    emulated: AcceptanceCounts | None = Field(None, description="our runtime's run counted as this engine counts, "
                                              "where that is not vLLM's counting (transformers)")
    steps_equal: int | None = Field(None, description="prompts whose acceptance equals the emulation's step for "
                                    "step (transformers, greedy)")
    per_context_length: list[SliceAcceptance] = Field(
        default_factory=list, description="--context-lengths: the engine's own per-request counts grouped per length")
    per_category: list[SliceAcceptance] = Field(
        default_factory=list, description="the engine's own per-request counts grouped per prompt category")
    per_output_bucket: list[SliceAcceptance] = Field(
        default_factory=list, description="the engine's own verify steps grouped by the generated position they "
        "began at")


class ConcurrencyCost(BaseModel):
    """One K's step costs and expected speedup at a batch of `concurrency` sequences (--concurrency)."""

    concurrency: int
    draft_step_s: float = Field(description="concurrency x the batch-1 draft step (the runtime's draft runs one "
                                "sequence per step; an engine batching the blocks does no worse): an upper bound")
    verify_step_s: float = Field(description="the target's forward of K+1 tokens per sequence at this batch, median "
                                 "over rounds")
    target_step_s: float = Field(description="the target's forward of one token per sequence at this batch, median")
    expected_speedup: float
    expected_speedup_range: list[float] = Field(description="[min, max] over the timing rounds")


class SpeculativeTokensRun(BaseModel):
    """One end-to-end run at one num_speculative_tokens K (the block runs K+1 slots; K when a DSpark anchor
    proposes), with its step costs and the speedup they predict on the device measured (validate/cost.py)."""

    num_speculative_tokens: int
    block_size: int = Field(description="slots the run drafted per step")
    acceptance_length: float = Field(description="tau at this K")
    per_position_rates: list[float]
    num_drafts: int
    outputs_equal: int | None = Field(description="greedy: prompts whose output is the target's")
    measured_speedup: float = Field(description="the runtime's tokens/s over target-only, the same timed runs")
    draft_step_s: float = Field(description="a draft step, median over timing rounds (batch 1)")
    verify_step_s: float = Field(description="the target's verify step of the block, median over rounds (batch 1)")
    target_step_s: float = Field(description="a target-only step (one token), median over rounds (batch 1)")
    expected_speedup: float = Field(description="tau * target_step_s / (draft_step_s + verify_step_s), median "
                                    "over the timing rounds")
    expected_speedup_range: list[float] = Field(description="[min, max] over the timing rounds")
    synthetic: SyntheticAcceptance | None = None
    vllm_counting: AcceptanceCounts | None = Field(
        None, description="--engine vllm: this K's run counted as vLLM counts (full last blocks), what vLLM's "
        "counters at this K are compared with")
    engine_run: EngineStats | None = Field(
        None, description="--engine vllm --engine-python: vLLM serving the draft at this K, in the same vLLM "
        "process as the other K (its counters, outputs and how they were compared)")
    per_concurrency: list[ConcurrencyCost] = Field(
        default_factory=list, description="--concurrency: the costs and expected speedup at each batch size other "
        "than 1, timed with the target's batched forward (validate/batch_costs.py)")
    per_context_length: list[SliceAcceptance] = Field(
        default_factory=list, description="--context-lengths: this K's decoding of the prompts of each length")
    context_half_tau_length: int | None = Field(
        None, description="the first --context-lengths value whose tau at this K is below half this K's own "
        "(short-context) tau; None: none is")


class EndpointRequest(BaseModel):
    """One request sent to the endpoint (the first measured round)."""

    prompt: int = Field(description="1-based, in the order the prompts were given (named sets after the prompts)")
    prompt_set: str | None = None
    path: str = Field(description="/v1/chat/completions (text, messages) or /v1/completions (token ids)")
    new_tokens: int = Field(description="the server's usage.completion_tokens")
    steps: int | None = Field(None, description="verify steps (per-request statistics only)")
    accepted: int | None = Field(None, description="draft tokens accepted (per-request statistics only)")
    acceptance_length: float | None = Field(None, description="tau, vLLM's counting (per-request statistics only)")
    latency_s: float = Field(description="request sent to answer read, as this client saw it")
    ttft_ms: float | None = Field(None, description="time to first token, as the server reports it (vLLM "
                                  "--enable-per-request-metrics); None: not reported")
    itl_ms: float | None = Field(None, description="mean inter-token latency, as the server reports it")


class EndpointComparison(BaseModel):
    """--baseline-endpoint: the same target served without speculation."""

    url: str
    model: str
    prompts: int
    outputs_equal: int | None = Field(description="greedy: prompts whose outputs are equal token for token; None: "
                                      "sampled (not compared)")
    near_ties: list[str] = Field(default_factory=list, description="outputs that part first at a near-tie")
    rounds: int = Field(description="interleaved rounds of both endpoints over the prompts")
    tokens_per_s: float = Field(description="the speculative endpoint, all rounds")
    baseline_tokens_per_s: float = Field(description="the baseline endpoint, all rounds")
    speedup: float = Field(description="tokens_per_s / baseline_tokens_per_s")
    speedup_range: list[float] = Field(default_factory=list, description="[min, max] of a single round")
    latency_s: float = Field(description="mean request latency, speculative endpoint")
    baseline_latency_s: float = Field(description="mean request latency, baseline endpoint")


class EndpointStats(BaseModel):
    """A live OpenAI-compatible server measured over HTTP (`--endpoint URL`): the deployment's own counts."""

    url: str = Field(description="the server's root (never with credentials)")
    model: str
    engine: str = Field(description="vllm, sglang, or unknown (told from /v1/models' owned_by)")
    counted: str = Field(description="where the acceptance figures come from: per-request statistics or the "
                         "Prometheus counters' deltas")
    concurrency: int
    prompts: int
    new_tokens: int
    counts: AcceptanceCounts = Field(description="vLLM's counting: tau = 1 + accepted / verify steps")
    sglang_acceptance_length: float | None = Field(
        None, description="SGLang's counting: generated tokens / verify steps (None: counters, steps per request "
        "unknown)")
    accepted_histogram: list[int] = Field(default_factory=list, description="verify steps by draft tokens accepted "
                                          "(entry j: steps that accepted j); empty from counters")
    per_prompt_set: dict[str, PromptSetAcceptance] = Field(default_factory=dict)
    per_category: dict[str, PromptSetAcceptance] = Field(
        default_factory=dict, description="tau per prompt category, from the requests' own statistics")
    per_prompt_length: dict[str, PromptSetAcceptance] = Field(
        default_factory=dict, description="tau per group of prompt lengths (the server's usage.prompt_tokens: "
        "<1024, 1024-2047, ...), from the requests' own statistics")
    per_request: list[EndpointRequest] = Field(default_factory=list)
    per_context_length: list[SliceAcceptance] = Field(
        default_factory=list, description="--context-lengths: tau per prompt length, each length's requests measured "
        "on their own (token ids of exactly that many tokens)")
    context_source: str | None = Field(None, description="the text the --context-lengths prompts were cut from, and "
                                       "whose tokenizer cut it")
    context_half_tau_length: int | None = Field(None, description="the first context length whose tau is below half "
                                                "the endpoint's tau on the prompts (None: none)")
    per_output_bucket: list[SliceAcceptance] = Field(
        default_factory=list, description="the verify steps by the generated position they began at, from vLLM's "
        "per-step lists (--per-request-spec-decode-metrics detailed; empty otherwise)")
    duration_s: float = Field(description="wall time of the measured round")
    tokens_per_s: float = Field(description="generated tokens / duration_s, at `concurrency` requests in flight")
    latency_s_mean: float
    latency_s_p50: float
    latency_s_p90: float
    ttft_ms_mean: float | None = None
    itl_ms_mean: float | None = None
    max_tokens: int
    sampling: dict[str, Any] = Field(default_factory=dict, description="each sampling field: the value sent, or "
                                     "'server default' (not sent)")
    prompts_sha256: str = Field(description="SHA-256 of the prompts as sent (--baseline checks the same ones ran)")
    baseline_endpoint: EndpointComparison | None = None
    offline: AcceptanceCounts | None = Field(None, description="with CKPT and --target: the runtime's emulation of "
                                             "the engine, counted as vLLM counts")

    # the figures the breakdowns' renderers (validate/breakdown.py) read of an end-to-end run, so that they draw
    # the endpoint's curves too
    @property
    def acceptance_length(self) -> float:
        return self.counts.acceptance_length

    @property
    def per_position_rates(self) -> list[float]:
        return self.counts.per_position_rates


class BaselineComparison(BaseModel):
    """This run against an earlier report (--baseline): the figures of both and the drops allowed."""

    path: str
    created_at: str | None = None
    tool_version: str | None = None
    baseline_counted: str = Field(description="which figures of the baseline: the engine's counters, the emulation "
                                  "counted as vLLM counts, or the emulation's own")
    counted: str = Field(description="which figures of this run")
    baseline_num_drafts: int
    num_drafts: int
    baseline_tau: float
    tau: float
    tau_allowed_drop: float = Field(description="the drop of tau the counts explain (+ max_regression x baseline)")
    baseline_rates: list[float]
    rates: list[float]
    rates_allowed_drop: list[float] = Field(description="per position, as tau_allowed_drop")
    z: float = Field(description="standard errors allowed (one-sided, Bonferroni over tau and positions)")
    max_regression: float = Field(description="the extra tolerance asked for: a fraction of the baseline value")
    rule: str
    regressed: list[str] = Field(default_factory=list, description="what dropped beyond the bound")


class Environment(BaseModel):
    versions: dict[str, str | None] = Field(description="python, torch, transformers, dflash_convert, ...")
    platform: str
    device: str
    dtype: str = Field(description="the draft's dtype")
    target_dtype: str | None = None
    device_map: str | None = Field(None, description="the target's placement by transformers + accelerate")
    draft_sampling: str = "greedy"
    backends: dict[str, bool] = Field(default_factory=dict, description="draft attention backend -> usable here")
    draft_backend: str | None = None
    target_backend: str | None = None
    causal_override: bool | None = None
    threads: int | None = Field(None, description="torch CPU threads")
    cores: int | None = Field(None, description="CPU cores this process may use")
    load_average: float | None = Field(None, description="1-minute load average when the report was made")


class CheckSummary(BaseModel):
    name: str
    level: Level
    status: Status
    message: str = ""


class ValidationSummary(BaseModel):
    """The short form of a report that other outputs carry: `convert --json`, `push` and the model card."""

    passed: bool
    levels_run: list[Level]
    counts: dict[Status, int] = Field(description="checks per status")
    checks: list[CheckSummary]
    target: str | None = None
    created_at: str | None = Field(None, description="when the validation ran (UTC, ISO 8601)")
    acceptance: AcceptanceStats | None = Field(None, description="the end-to-end figures, when that level ran")
    endpoint: EndpointStats | None = Field(None, description="a live server's figures (--endpoint), without the "
                                           "per-request list")
    thresholds: dict[str, Any] = Field(default_factory=dict, description="the gates asked for: "
                                       "min_acceptance_length, min_position_rates, min_speedup")
    per_num_speculative_tokens: list[SpeculativeTokensRun] = Field(
        default_factory=list, description="end to end: one run per K (the report's rows)")
    recommendation: list[KRecommendation] = Field(default_factory=list, description="the K recommended per "
                                                  "concurrency")
    prediction: PredictionReport | None = Field(None, description="--predict-gpu: the prediction on the GPUs named")
    speculation_profile: dict[str, Any] | None = Field(None, description="the report's speculation_profile.json")


class ValidationReport(BaseModel):
    tool: str = "dflash-convert"
    tool_version: str
    checkpoint: str | None = Field(description="the draft checkpoint; None: an --endpoint run without one")
    checkpoint_format: Literal["speculators", "hf", "transformers"] | None = None
    checkpoint_revision: str | None = None
    target: str | None = None
    target_revision: str | None = None
    levels_run: list[Level]
    levels_skipped: dict[str, str] = Field(default_factory=dict, description="level -> why it did not run")
    checks: list[Check]
    acceptance: AcceptanceStats | None = None
    engine_run: EngineStats | None = Field(None, description="the real engine's figures (--engine-python)")
    endpoint: EndpointStats | None = Field(None, description="a live server's figures (--endpoint)")
    baseline: BaselineComparison | None = Field(None, description="this run against an earlier report (--baseline)")
    per_num_speculative_tokens: list[SpeculativeTokensRun] = Field(
        default_factory=list, description="end to end: one run per K (--num-speculative-tokens; else the one run)")
    recommendation: list[KRecommendation] = Field(
        default_factory=list, description="per concurrency: the K with the best expected speedup")
    prediction: PredictionReport | None = Field(
        None, description="--predict-gpu: plain vs speculative tokens/s on each GPU named, from this run's tau per K "
        "and the configs (dflash-convert predict's model), with its error band")
    per_thinking_mode: list[SliceAcceptance] = Field(
        default_factory=list, description="--compare-thinking: the run with enable_thinking true, then false (its "
        "end-to-end checks named `(thinking off)`)")
    speculation_profile: dict[str, Any] | None = Field(
        None, description="the measured acceptance in NVIDIA Model-Optimizer's speculation_profile.json schema "
        "(validate/profile.py): the first K's on the run's prompts, `profiles` each other K's and context length's")
    environment: Environment
    options: dict[str, Any] | None = Field(None, description="the run's ValidateOptions, as given")
    duration_s: float
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            description="when the report was made (UTC, ISO 8601)")
    incomplete: str | None = Field(None, description="why the run stopped before its levels ended (Ctrl-C): the "
                                   "checks and figures are what was measured until then, and it did not pass")
    passed: bool = Field(description="no check failed")

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def failed(self) -> bool:
        return bool(self.failed_checks)

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "warn": 0, "skip": 0}
        for c in self.checks:
            out[c.status] += 1
        return out

    def thresholds(self) -> dict[str, Any]:
        """The end-to-end gates this run was given (from its options), without those not given."""
        options = self.options or {}
        return {k: options[k] for k in THRESHOLDS if options.get(k) is not None}

    def summary(self) -> ValidationSummary:
        return ValidationSummary(passed=self.passed, levels_run=self.levels_run, counts=self.counts(),
                                 checks=[CheckSummary(**c.model_dump(include={"name", "level", "status", "message"}))
                                         for c in self.checks],
                                 target=self.target, created_at=self.created_at, acceptance=self.acceptance,
                                 endpoint=self.endpoint.model_copy(update={"per_request": []}) if self.endpoint
                                 else None, thresholds=self.thresholds(),
                                 per_num_speculative_tokens=self.per_num_speculative_tokens,
                                 recommendation=self.recommendation, prediction=self.prediction,
                                 speculation_profile=self.speculation_profile)


def validation_report_schema() -> dict[str, Any]:
    return ValidationReport.model_json_schema()


# ----------------------------------------------------------------------------- what every rendering says

UNRELIABLE_TIMING = "timings are unreliable"  # the speedup check's words for a busy machine


def short(value: Any, limit: int = 48) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, list) and value and all(isinstance(v, float) for v in value):
        items = [f"{v:.2f}" for v in value]  # cut between numbers, never inside one
        shown = next((k for k in range(len(items), 0, -1)
                      if len(", ".join(items[:k])) + (0 if k == len(items) else 14) + 2 <= limit), 1)
        return "[" + ", ".join(items[:shown]) + (f", +{len(items) - shown} more" if shown < len(items) else "") + "]"
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cost_at(row: SpeculativeTokensRun, concurrency: int) -> ConcurrencyCost | None:
    return next((c for c in row.per_concurrency if c.concurrency == concurrency), None)


def speedup_at(row: SpeculativeTokensRun, concurrency: int) -> float | None:
    """A row's expected speedup at a concurrency: batch 1's from the decode loop, others from --concurrency."""
    if concurrency == 1:
        return row.expected_speedup
    at = cost_at(row, concurrency)
    return None if at is None else at.expected_speedup


def served_version(rows: list[SpeculativeTokensRun]) -> str | None:
    """"vLLM V" where the engine served the K of these rows, else None."""
    return next((f"vLLM {r.engine_run.version}" for r in rows if r.engine_run is not None), None)


def tau_text(counts: AcceptanceCounts | None) -> str:
    return "-" if counts is None else f"{counts.acceptance_length:.2f}"


def sampling_line(u: SamplingUsed) -> str:
    """The sampling of a run in one line: each value with its source, the penalties, what was not applied."""
    keys = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
    line = f"sampling ({u.mode}): " + ", ".join(f"{k} {getattr(u, k):g} ({u.sources.get(k, 'vLLM default')})"
                                                for k in keys) + f"; stop ids {u.stop_token_ids}"
    if u.not_applied:
        line += "; not applied: " + "; ".join(f"{k} {why}" for k, why in u.not_applied.items())
    return line


def verdict_word(report: ValidationReport) -> str:
    """PASSED, FAILED, or INCOMPLETE for a run stopped before its end (Ctrl-C)."""
    return "INCOMPLETE" if report.incomplete else "PASSED" if report.passed else "FAILED"


def levels_text(report: ValidationReport) -> str:
    """The levels that ran and those that did not, with why: `(static, numeric; end to end not run: ...)`."""
    ran = ", ".join(lv.replace("_", " ") for lv in report.levels_run) or "no level ran"
    return "(" + "; ".join([ran, *(f"{lv.replace('_', ' ')} not run: {why}"
                                   for lv, why in sorted(report.levels_skipped.items(), key=_level_order))]) + ")"


def _level_order(item: tuple[str, str]) -> int:
    return LEVELS.index(item[0]) if item[0] in LEVELS else len(LEVELS)


def verdict_text(report: ValidationReport) -> str:
    """The verdict line after PASSED/FAILED: the levels run and not, counts, tau and speedup, the failed checks."""
    n = report.counts()
    a = report.acceptance
    figures = f", tau {a.acceptance_length:.2f}, speedup {a.speedup:.2f}x" if a is not None else ""
    if a is not None and headline_k(report) is not None:  # a K sweep: the K recommended first, then every other
        best = headline_k(report)
        others = [r for r in report.per_num_speculative_tokens if r is not best]
        rec = headline_recommendation(report)
        advice = ("no speculation recommended (no K reaches 1.0x on the measured machine); best "
                  if rec is not None and not rec.speculate else "recommended ")
        figures = (f", {advice}K={best.num_speculative_tokens}: tau {best.acceptance_length:.2f}, speedup "
                   f"{best.measured_speedup:.2f}x (" + "; ".join(
                       f"K={r.num_speculative_tokens}: tau {r.acceptance_length:.2f}, {r.measured_speedup:.2f}x"
                       for r in others) + ")")
    if report.endpoint is not None:
        figures += f", endpoint tau {report.endpoint.counts.acceptance_length:.2f}"
    builtin = prompts_note(report)
    figures += f" on {builtin}" if builtin else ""
    failed = report.failed_checks
    names = f"; failed: {', '.join(c.name for c in failed)}" if failed else ""
    return (f"{levels_text(report)}: {n['pass']} passed, {n['fail']} failed, {n['warn']} warnings, "
            f"{n['skip']} skipped in {report.duration_s:.1f} s{figures}{names}")


def headline_k(report: ValidationReport | ValidationSummary) -> SpeculativeTokensRun | None:
    """A K sweep's run to headline: the K recommended at concurrency 1 (else at the first concurrency measured);
    None for a single K."""
    rows = report.per_num_speculative_tokens
    if len(rows) < 2:
        return None
    rec = headline_recommendation(report)
    k = rec.num_speculative_tokens if rec is not None else rows[0].num_speculative_tokens
    return next((r for r in rows if r.num_speculative_tokens == k), rows[0])


def headline_recommendation(report: ValidationReport | ValidationSummary) -> KRecommendation | None:
    """The recommendation a headline states: concurrency 1's, else the first concurrency measured's."""
    return next((r for r in report.recommendation if r.concurrency == 1), None) or next(iter(report.recommendation),
                                                                                       None)


def prompts_note(report: ValidationReport) -> str | None:
    """What the figures were measured on when it was not the user's prompts nor a named set (None when it was)."""
    if report.acceptance is not None:
        return report.acceptance.builtin_prompts
    options = report.options or {}
    if report.endpoint is not None and options.get("prompts") is None and not options.get("prompt_sets"):
        return BUILTIN_TEXT_NOTE  # the server tokenizes: the built-in text prompts went to it
    return None


def counting_rows(a: AcceptanceStats, engine: EngineStats | None) -> list[tuple[str, int, int, float, list[float]]]:
    """(counted how, drafts, accepted, tau, per-position rates): our figures both ways and the engine's own."""
    rows = [("runtime (last block shortened)", a.num_drafts, a.accepted, a.acceptance_length, a.per_position_rates)]
    counted = [("runtime, as vLLM counts (full last block)", a.vllm_counting)]
    if engine is not None and engine.emulated is not None:
        counted.append((f"runtime, as {engine.engine} counts", engine.emulated))
    if engine is not None:
        counted.append((f"{engine.engine} {engine.version} (its counters)", engine.counts))
    return rows + [(name, c.num_drafts, c.accepted, c.acceptance_length, c.per_position_rates)
                   for name, c in counted if c is not None]


def engine_line(engine: EngineStats) -> str:
    """What the engine run showed besides its counts: its outputs (greedy) or the tolerance (sampled)."""
    if engine.outputs_equal is not None:
        steps = (f"; acceptance equal step for step on {engine.steps_equal}/{engine.prompts} prompts"
                 if engine.steps_equal is not None else "")
        return (f"{engine.engine} {engine.version}: outputs equal on {engine.outputs_equal}/{engine.prompts} "
                f"prompts (speculative, target-only, our target's greedy){steps}")
    return (f"{engine.engine} {engine.version}: sampled at temperature {engine.sampling.get('temperature')} "
            f"(prompt i seeded {engine.sampling.get('seed', 0)} + i); acceptance compared within "
            f"tau +/- {engine.tolerance.get('tau')}")


def to_json(report: ValidationReport) -> dict[str, Any]:
    return report.model_dump(mode="json")
