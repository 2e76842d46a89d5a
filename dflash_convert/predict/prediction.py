"""A prediction: plain and speculative tokens/s per GPU, K and concurrency, the K to serve at each concurrency
(or no speculation, and why), and the model's error band beside it; the report's model and renderings.

Tokens per step: a plain step of a batch of B emits B tokens, a speculative one B x tau(K). tau per K is
given (`--tau`, a validate report's runs per K), or derived from per-position acceptance rates: validate's
rates are unconditional (rate i = the share of steps whose proposal i+1 was accepted, which under prefix
acceptance means its first i+1 all were), so tau(K) = 1 + sum of the first K rates, for K up to the
positions measured. (From conditional rates p_i it is 1 + sum over i < K of p_1 ... p_i, the same number.)
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from dflash_convert.errors import UsageError
from dflash_convert.format.sizes import decoder, short_repr
from dflash_convert.predict.calibration import ENGINES, coverage, error_band
from dflash_convert.predict.cost import committed_per_step, plain_step, speculative_step
from dflash_convert.predict.facts import ModelFacts, draft_facts, target_facts
from dflash_convert.predict.gpus import GPU
from dflash_convert.predict.memory import GB, USABLE_FRACTION, memory_need


def taus_from_rates(rates: list[float]) -> dict[int, float]:
    """tau(K) for K = 1 .. len(rates) from unconditional per-position acceptance rates."""
    out, total = {}, 1.0
    for k, rate in enumerate(rates, start=1):
        total += rate
        out[k] = total
    return out


# Bounds on what a prediction is asked: tensor-parallel groups beyond 1024 GPUs and contexts beyond 10 M tokens
# are typos or hostile input, not deployments (the largest published contexts are 10 M tokens).
MAX_TP = 1024
MAX_LEN = 10_000_000
MAX_CONCURRENCY = 1_000_000  # sequences per step: past any engine's batch (vLLM's max_num_seqs defaults to 256-1024)
# predict's names for the input and output lengths in its notes (format strings of the length); validate passes its own
PREDICT_LENGTHS = ("--input-len {}", "--output-len {}")
# a request's first token comes from its prefill: an output of 0 tokens is no request (--output-len's least)
MIN_OUTPUT_LEN = 1


def tau_problem(k: Any, tau: Any) -> str | None:
    """What is wrong with tau `tau` at K `k`, or None: the one rule --tau and --from-report share. tau counts the
    tokens a step emits, the bonus token included, so it lies in [1, K+1]."""
    if type(k) is not int:  # a bool is an int subclass: refused too
        return f"K must be an integer, got {short_repr(k)}"
    if k < 1:
        return f"K must be at least 1, got {k}"
    if type(tau) not in (int, float):
        return f"tau of K={k} must be a number, got {short_repr(tau)}"
    if not 1.0 <= tau <= k + 1:
        return f"tau of K={k} must be in [1, {k + 1}] (tokens per step), got {tau:g}"
    return None


def rate_problem(position: int, rate: Any) -> str | None:
    """What is wrong with an unconditional per-position acceptance rate (a share of steps), or None."""
    if type(rate) not in (int, float):
        return f"the acceptance rate of position {position} must be a number, got {short_repr(rate)}"
    if not 0.0 <= rate <= 1.0:
        return f"the acceptance rate of position {position} must be in [0, 1] (a share of steps), got {rate:g}"
    return None


def block_problem(k: int, draft: ModelFacts) -> str | None:
    """K past the draft's trained block, or None: the draft proposes at most `max_proposals` tokens a step
    (block_size - 1; block_size when its anchor slot proposes)."""
    if draft.max_proposals and k > draft.max_proposals:
        return (f"K {k} is past the draft's block: {draft.source} has block_size {draft.block_size}, which proposes "
                f"at most {draft.max_proposals} tokens per step (K 1 to {draft.max_proposals})")
    return None


def parse_taus(text: str) -> dict[int, float]:
    """`K=TAU[,K=TAU...]` -> {K: tau}; a K without a tau, a tau outside [1, K+1], a K given twice is a usage
    error."""
    out: dict[int, float] = {}
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        k, sep, tau = item.partition("=")
        if not sep or not tau:
            raise UsageError(f"--tau {text}: K {k or '?'} has no tau (write K=TAU, e.g. 7=4.2)")
        try:
            kk, tt = int(k), float(tau)
        except ValueError:
            raise UsageError(f"--tau {text}: {item!r} is not K=TAU (an integer K, a number tau)") from None
        problem = tau_problem(kk, tt) or (f"K {kk} is given twice" if kk in out else None)
        if problem:
            raise UsageError(f"--tau {text}: {problem}")
        out[kk] = tt
    if not out:
        raise UsageError(f"--tau {text}: no K=TAU given")
    return out


def check_taus_within_block(taus: dict[int, float], draft: ModelFacts, given: str, *,
                            fields: dict[int, str] | None = None) -> None:
    """Every K within the draft's block. `given`: the --tau text (a usage error, exit 2), or with `fields` (K ->
    the field it was read from) the report file (an error naming the file and the field, exit 1)."""
    from dflash_convert.errors import DFlashError

    for k in sorted(taus):
        problem = block_problem(k, draft)
        if problem and fields is not None:
            raise DFlashError(f"field `{fields[k]}`: {problem}", file=given)
        if problem:
            raise UsageError(f"--tau {given}: {problem}")


RATE_TOLERANCE = 1e-6  # per-position rates are written rounded to 4 places: rounding keeps their order


def report_provenance(report: dict[str, Any], file: str) -> str | None:
    """Whether --from-report may use `report`: another tool's report, or one stopped before its end (Ctrl-C; it
    does not record which K's runs finished, so its figures may cover part of the prompts), is an error naming the
    file and the field (a report without `tool`, figures written by hand, is read). A failed validation is used: its checks judge the draft (outputs, gates), and the tau its
    runs measured is still a measurement; the returned note says so (None for a passed report)."""
    from dflash_convert.errors import DFlashError

    tool = report.get("tool", "dflash-convert")  # absent: figures written by hand, held to the same rules
    if tool != "dflash-convert":
        raise DFlashError(f"field `tool` is {short_repr(tool)}, not \"dflash-convert\": not a validate --json report",
                          file=file)
    if report.get("incomplete") not in (None, False, ""):
        raise DFlashError(f"field `incomplete` is {short_repr(report.get('incomplete'))}: the validation stopped before "
                          "its end, so its figures may be partial; run validate to its end", file=file)
    if "passed" not in report or report["passed"] is True:
        return None
    checks = report.get("checks") if isinstance(report.get("checks"), list) else []
    failed = [str(c.get("name")) for c in checks if isinstance(c, dict) and c.get("status") == "fail"]
    return (f"{file} is a failed validation (`passed` is {short_repr(report.get('passed'))}"
            + (f"; failed: {', '.join(failed)}" if failed else "") + "): its tau was still measured and is used here; "
            "the draft did not pass its checks")


def taus_from_report(report: dict[str, Any], file: str) -> tuple[dict[int, float], str, dict[int, str]]:
    """tau per K from a validate --json report: its runs per K (their own tau, each K's prefix of the longest
    run's rates for the K not run), else its one run's rates. Every value read is held to --tau's rule (K >= 1,
    tau in [1, K+1], rates in [0, 1], each K once): a report breaking it is one error naming the file and the
    field. Returns the taus, where they came from, and the field each K was read from (for the block check,
    which needs the draft)."""
    from dflash_convert.errors import DFlashError

    def fail(field: str, problem: str) -> DFlashError:
        return DFlashError(f"field `{field}`: {problem}", file=file)

    def shaped(value: Any, field: str, kind: type, what: str) -> Any:
        if value is not None and not isinstance(value, kind):
            raise DFlashError(f"field `{field}` is {short_repr(value)}, not {what}", file=file)
        return value

    def rates_of(value: Any, field: str) -> list[float]:
        for i, rate in enumerate(shaped(value, field, list, "a list of acceptance rates") or []):
            if (problem := rate_problem(i + 1, rate)) is not None:
                raise fail(f"{field}[{i}]", problem)
        rates = [float(x) for x in value or []]
        # position i+1 is accepted only where position i was: a share of steps cannot rise along the block
        rising = [i + 1 for i in range(1, len(rates)) if rates[i] > rates[i - 1] + RATE_TOLERANCE]
        if rising:
            raise fail(field, f"the rate rises at position(s) {', '.join(map(str, rising))} (from "
                       f"{rates[rising[0] - 2]:g} to {rates[rising[0] - 1]:g} at the first); these rates are each "
                       "the share of steps whose draft token there was accepted, which cannot rise with position")
        return rates

    runs = shaped(report.get("per_num_speculative_tokens"), "per_num_speculative_tokens", list,
                  "a list of runs") or []
    taus: dict[int, float] = {}
    fields: dict[int, str] = {}
    longest: list[float] = []
    longest_field = ""
    for i, r in enumerate(runs):
        at = f"per_num_speculative_tokens[{i}]"
        shaped(r, at, dict, "a run (an object)")
        k, tau = r.get("num_speculative_tokens"), r.get("acceptance_length")
        counted = shaped(r.get("vllm_counting"), f"{at}.vllm_counting", dict, "an object") or {}
        tau_field = f"{at}.acceptance_length"
        if counted.get("acceptance_length") is not None:  # vLLM's counting, where the run has it
            tau, tau_field = counted["acceptance_length"], f"{at}.vllm_counting.acceptance_length"
        rates = rates_of(r.get("per_position_rates"), f"{at}.per_position_rates")
        problem = tau_problem(k, tau)
        if problem is not None:
            raise fail(f"{at}.num_speculative_tokens" if problem.startswith("K ") else tau_field, problem)
        if k in taus:
            raise fail(f"{at}.num_speculative_tokens", f"K {k} is given twice (also at {fields[k]})")
        taus[k], fields[k] = float(tau), f"{at}.num_speculative_tokens"
        if len(rates) > len(longest):
            longest, longest_field = rates, f"{at}.per_position_rates"
    acceptance = shaped(report.get("acceptance"), "acceptance", dict, "an object") or {}
    top_rates = rates_of(acceptance.get("per_position_rates"), "acceptance.per_position_rates")
    if not longest and top_rates:
        longest, longest_field = top_rates, "acceptance.per_position_rates"
    derived = {k: t for k, t in taus_from_rates(longest).items() if k not in taus}
    if not taus and not derived:
        raise DFlashError("no tau per K in this report: it has neither per_num_speculative_tokens runs nor "
                          "acceptance.per_position_rates (run validate with --target, end to end)", file=file)
    source = (f"{file}: measured at K {', '.join(map(str, sorted(taus)))}" if taus else f"{file}") + (
        f"; derived from its per-position rates at the other K up to {len(longest)}" if derived else "")
    fields.update({k: f"{longest_field}[{k - 1}]" for k in derived})
    return {**derived, **taus}, source, fields


class PredictionRow(BaseModel):
    gpu: str
    num_speculative_tokens: int
    concurrency: int
    tau: float
    baseline_tokens_per_s: float | None = Field(description="None: the target alone does not fit on the GPU")
    speculative_tokens_per_s: float | None = Field(description="None: the target and the draft do not fit")
    speedup: float | None = Field(description="None: either deployment does not fit")
    bound: str = Field(description="the term most of the speculative step's time goes to: weights, experts, KV "
                       "cache, lm_head, draft, compute, all-reduce, fixed cost or admissions; or 'does not fit: ...' with the "
                       "memory needed and the memory usable per GPU")
    baseline_bound: str = Field(description="the same for the plain step")
    # defaults: a report written before memory was checked still reads (validate --baseline, push's model card)
    memory_per_gpu_gb: float | None = Field(None, description="what one GPU holds serving the speculative "
                                            "deployment, a lower bound: the target's and the draft's weights and KV "
                                            "caches (concurrency x (input_len + output_len) positions), divided by "
                                            "the tensor-parallel size")
    baseline_memory_per_gpu_gb: float | None = Field(None, description="the same for the target alone")
    fits: bool | None = Field(None, description=f"memory_per_gpu_gb within {USABLE_FRACTION:.0%} of the GPU's "
                              "memory (vLLM's default gpu_memory_utilization); None: the GPU's memory is not known")
    baseline_fits: bool | None = Field(None, description="the same for the target alone")


class ConcurrencyRecommendation(BaseModel):
    gpu: str
    concurrency: int
    num_speculative_tokens: int | None = Field(description="the K with the best predicted speedup; None: no "
                                               "speculation (no K reaches 1.0)")
    speedup: float | None = Field(description="that K's predicted speedup (the best one when no K reaches 1.0); "
                                  "None: the deployment does not fit on the GPU")
    reason: str
    launch: str | None = Field(None, description="the serving command at that K")
    target_fits: bool = Field(True, description="False: the target alone does not fit on the GPU at this "
                              "concurrency and context (nothing is predicted)")


class ModelError(BaseModel):
    median: float = Field(description="median |predicted / measured - 1| over the calibration set's figures")
    worst: float
    cases: int
    directions_right: int = Field(description="calibration cases whose pay-off direction (faster or slower than "
                                  "no speculation) the model gets right")
    directions: int
    line: str
    # the speedup's error, the engine's own cases or pooled, and where the setting lies outside the cases
    speedup_median: float | None = Field(None, description="median |predicted / measured - 1| of the speedup over "
                                         "the engine's own measured cases, or the serving engines' pooled")
    speedup_worst: float | None = None
    speedup_cases: int = 0
    speedup_pooled: bool = Field(False, description="the engine has too few cases of its own: the serving "
                                 "engines' cases pooled")
    speedup_line: str = ""
    outside_calibration: list[str] = Field(default_factory=list, description="each way this prediction's setting "
                                           "(attention, MLP, weights, TP, concurrency, the steps' bound, speculation's TP, "
                                           "admissions on a kind of target they were not fitted on, the all-reduce "
                                           "cost's one target, input and output lengths) lies "
                                           "outside what the calibration cases cover: the band was not measured "
                                           "there")


class PredictionReport(BaseModel):
    tool: str = "dflash-convert"
    target: str
    draft: str
    engine: str
    tensor_parallel: int
    input_len: int
    output_len: int
    context: float = Field(description="the mean context a decode step sees: input_len + output_len / 2")
    gpus: list[dict[str, Any]] = Field(description="each GPU's datasheet figures as used")
    taus: dict[int, float] = Field(description="tau per K the prediction used")
    tau_source: str
    predictions: list[PredictionRow]
    recommendation: list[ConcurrencyRecommendation]
    error_band: ModelError
    notes: list[str] = Field(default_factory=list)

    def render(self, console: Any, quiet: bool = False) -> None:  # noqa: ARG002 (the table is the result)
        for line in text_lines(self):
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def launch_line(engine: str, target: str, draft: str, k: int, tp: int, kind: str = "dflash", block: int = 0) -> str:
    """The serving command at K for a draft of `kind` (its vLLM method, its SGLang algorithm and draft tokens, as
    the kind states them for the model card: a DSpark draft is vLLM's method dspark, SGLang's DSPARK at gamma + 1
    draft tokens), trained at `block` (0: not stated)."""
    from dflash_convert.format import kinds

    of_kind = kinds.get(kind) or kinds.of("dflash")
    serving = of_kind.card_serving(block or None, str(k), False)
    tp_flag = f" --tensor-parallel-size {tp}" if tp > 1 else ""
    if engine == "sglang":
        tokens = k + 1 if serving.sglang_block_of_k else of_kind.sglang_draft_tokens(block or None)
        return (f"python -m sglang.launch_server --model-path {shlex.quote(target)} --speculative-algorithm "
                f"{serving.sglang_algorithm} --speculative-draft-model-path {shlex.quote(draft)} "
                f"--speculative-num-draft-tokens {tokens}" + (f" --tp-size {tp}" if tp > 1 else ""))
    config = json.dumps({"method": serving.vllm_method, "model": draft, "num_speculative_tokens": k})
    return f"vllm serve {shlex.quote(target)}{tp_flag} --speculative-config {shlex.quote(config)}"


@dataclass(frozen=True)
class Inputs:
    target: ModelFacts
    draft: ModelFacts
    target_name: str
    draft_name: str
    max_positions: int | None = None  # the target's max_position_embeddings; None: not stated


def load_inputs(target: Path, draft: Path, target_name: str, draft_name: str) -> Inputs:
    """The two models' facts from their config.json (a directory holding it, or the file itself), the draft held
    to its target (hidden size, target layer ids, vocab: compat's rules, as convert and validate apply them)."""
    from dflash_convert.io.reading import read_json

    def config(path: Path) -> Path:
        return path / "config.json" if path.is_dir() else path

    t, d = config(Path(target)), config(Path(draft))
    target_raw, draft_raw = read_json(t), read_json(d)
    target_facts_ = target_facts(target_raw, str(t))
    draft_facts_ = draft_facts(draft_raw, target_facts_, str(d))
    check_pair(draft_raw, target_raw, str(t), str(d))
    return Inputs(target_facts_, draft_facts_, target_name, draft_name, max_positions(target_raw, str(t)))


def check_pair(draft_raw: dict[str, Any], target_raw: dict[str, Any], target_file: str, draft_file: str) -> None:
    """A draft that cannot run on this target (its hidden size, the target layers it reads, its vocabulary) is an
    error naming both files and the field (exit 1): a prediction for a pair no engine can serve is no answer. The
    target is read as convert and validate read it (target_info)."""
    from dflash_convert.format import compat
    from dflash_convert.format.mapping import spec_from_config, target_info

    compat.raise_first_failure(compat.compatibility_checks(spec_from_config(draft_raw, draft_file),
                                                           target_info(target_raw, target_file, target_file)),
                               names=compat.RUN_BLOCKING, file=draft_file)


def max_positions(raw: dict[str, Any], file: str) -> int | None:
    """The target's max_position_embeddings (a multimodal config's text_config's), None where not stated."""
    read = decoder(raw, file)
    return read("positions") if read.present("positions") else None


def check_request(inputs: Inputs, *, concurrency: list[int], input_len: int, output_len: int, tp: int) -> None:
    """The flags against the bounds and the pair: usage errors (exit 2)."""
    bad = [b for b in concurrency if b < 1]
    if bad or not concurrency:
        raise UsageError(f"--concurrency must be positive integers, got {', '.join(map(str, bad)) or 'none'}")
    if (big := [b for b in concurrency if b > MAX_CONCURRENCY]):
        raise UsageError(f"--concurrency must be at most {MAX_CONCURRENCY:,} sequences, got {big[0]}")
    twice = next((b for i, b in enumerate(concurrency) if b in concurrency[:i]), None)
    if twice is not None:  # its rows and its recommendation would show twice
        raise UsageError(f"--concurrency {','.join(map(str, concurrency))}: {twice} is given twice")
    if not 1 <= tp <= MAX_TP:
        raise UsageError(f"--tp must be an integer in [1, {MAX_TP}], got {tp}")
    for flag, n, least in (("--input-len", input_len, 0), ("--output-len", output_len, MIN_OUTPUT_LEN)):
        if not least <= n <= MAX_LEN:
            raise UsageError(f"{flag} must be an integer in [{least}, {MAX_LEN}] (tokens), got {n}")
    # vLLM 0.33 (config/model.py, ModelConfig.verify_with_parallel_config) refuses a tensor-parallel size that does
    # not divide the attention heads, the target's and the draft's (whose draft_tensor_parallel_size defaults to
    # the target's); KV heads fewer than the GPUs are replicated, so they set no such rule.
    for who, facts in (("target", inputs.target), ("draft", inputs.draft)):
        if facts.heads % tp:
            raise UsageError(f"--tp {tp}: the {who}'s num_attention_heads ({facts.heads}, {facts.source}) is not "
                             f"divisible by {tp}: tensor parallelism splits the attention heads evenly over the GPUs "
                             f"(vLLM refuses this size); give a divisor of {facts.heads}")


def predict(inputs: Inputs, gpus: list[GPU], taus: dict[int, float], *, concurrency: list[int], input_len: int,
            output_len: int, engine: str = "vllm", tp: int = 1, tau_source: str = "--tau",
            length_names: tuple[str, str] = PREDICT_LENGTHS) -> PredictionReport:
    """Every GPU x K x concurrency, the recommendation per GPU and concurrency, and the error band. `length_names`:
    how the notes and reasons name the input and output lengths (format strings of the length), the caller's
    words for them (predict: its flags; validate: the prompts' mean length and --max-new-tokens)."""
    input_name, output_name = (name.format(n) for name, n in zip(length_names, (input_len, output_len)))
    if not taus:
        raise UsageError("no tau: give --tau K=TAU or --from-report REPORT")
    check_request(inputs, concurrency=concurrency, input_len=input_len, output_len=output_len, tp=tp)
    constants = ENGINES[engine]
    context = input_len + output_len / 2
    rows: list[PredictionRow] = []
    admission_share = 0.0  # the largest share of a predicted step its admissions take (for the coverage note)
    recommendations: list[ConcurrencyRecommendation] = []
    for g in gpus:
        for b in concurrency:
            # the smallest K's need (a hybrid target's state slots grow with K): where it does not fit, no K does
            need = memory_need(inputs.target, inputs.draft, g, batch=b, tokens=input_len + output_len, tp=tp,
                               k=min(taus))
            plain_fits, spec_fits = need.fits(need.plain), need.fits(need.speculative)
            plain = plain_step(inputs.target, batch=b, context=context, gpu=g, constants=constants, tp=tp,
                               output_len=output_len, input_len=input_len)
            base = b / plain.seconds
            admission_share = max(admission_share, plain.admissions_s / plain.seconds)
            here = []
            for k in sorted(taus):
                spec = speculative_step(inputs.target, inputs.draft, batch=b, k=k, tau=taus[k], context=context,
                                        gpu=g, constants=constants, tp=tp, output_len=output_len, input_len=input_len)
                # what a step commits: tau, capped at what a request has left to decode (committed_per_step)
                fast = b * committed_per_step(taus[k], output_len) / spec.seconds
                admission_share = max(admission_share, spec.admissions_s / spec.seconds)
                at_k = memory_need(inputs.target, inputs.draft, g, batch=b, tokens=input_len + output_len, tp=tp,
                                   k=k)
                fits = at_k.fits(at_k.speculative)
                row = PredictionRow(
                    gpu=g.name, num_speculative_tokens=k, concurrency=b, tau=round(taus[k], 4),
                    baseline_tokens_per_s=None if plain_fits is False else round(base, 1),
                    speculative_tokens_per_s=None if fits is False else round(fast, 1),
                    speedup=None if fits is False else round(fast / base, 3),
                    bound=at_k.refusal(at_k.speculative) if fits is False else spec.bound,
                    baseline_bound=need.refusal(need.plain) if plain_fits is False else plain.bound,
                    memory_per_gpu_gb=round(at_k.speculative / GB, 2), baseline_memory_per_gpu_gb=round(
                        need.plain / GB, 2), fits=fits, baseline_fits=plain_fits)
                here.append(row)
            rows += here
            if spec_fits is False:  # no K is predicted: the rows carry no tokens/s
                what = ("the target alone " + need.refusal(need.plain) + " (fewer sequences, a shorter context or "
                        "more GPUs: --tp)") if plain_fits is False else (
                    f"the target alone fits ({need.plain / GB:.1f} GB per GPU) but not with the draft: target and "
                    f"draft {need.refusal(need.speculative)}")
                recommendations.append(ConcurrencyRecommendation(
                    gpu=g.name, concurrency=b, num_speculative_tokens=None, speedup=None, reason=what,
                    target_fits=plain_fits is not False))
                continue
            best = max((r for r in here if r.fits is not False), key=lambda r: (r.speedup, -r.num_speculative_tokens))
            if best.speedup >= 1.0:
                recommendations.append(ConcurrencyRecommendation(
                    gpu=g.name, concurrency=b, num_speculative_tokens=best.num_speculative_tokens,
                    speedup=best.speedup, reason=f"the best predicted speedup, {speedup_text(best.speedup)}x (tau {best.tau:.2f}; the step is bound by {best.bound})",
                    launch=launch_line(engine, inputs.target_name, inputs.draft_name, best.num_speculative_tokens,
                                       tp, inputs.draft.kind, inputs.draft.block_size)))
            else:
                recommendations.append(ConcurrencyRecommendation(
                    gpu=g.name, concurrency=b, num_speculative_tokens=None, speedup=best.speedup,
                    reason=f"no K reaches 1.0x; the best, K={best.num_speculative_tokens}, gives "
                    f"{speedup_text(best.speedup)}x: " + _slower_step(best, output_len, output_name)))
    band = error_band()
    speedup_error = band.speedup(engine)
    outside = coverage().outside(inputs.target, tp=tp, concurrency=concurrency,
                                 bounds={b for r in rows for b in (r.bound, r.baseline_bound)}, speculative=True,
                                 admission_share=admission_share, input_len=input_len, output_len=output_len,
                                 length_names=length_names)
    notes = [f"warning: the {who}'s {m.storage_warning}" for who, m in (("target", inputs.target),
                                                                        ("draft", inputs.draft)) if m.storage_warning]
    if outside:
        notes.append("outside the calibration cases, so the error band was not measured here: " + "; ".join(outside))
    if inputs.target.experts:
        notes.append(f"MoE target: a step of N tokens reads the experts they route to, E (1 - (1 - k/E)^N) per layer "
                     f"under uniform routing ({inputs.target.experts} experts, top {inputs.target.top_k}): "
                     f"{inputs.target.distinct_experts(1):.0f} at N=1, {inputs.target.distinct_experts(16):.0f} "
                     "at N=16; real routing is less uniform, so this overstates the experts a verify reads")
    # where the output caps what a step commits below tau (committed_per_step), for the K whose tau it caps
    capped = [k for k in sorted(taus) if committed_per_step(taus[k], output_len) < taus[k]]
    if output_len <= 1:
        notes.append(f"{output_name}: a request's one token comes from its prefill, so there is no decode step and "
                     "nothing to speculate on; every step is counted as committing the target's own token")
    elif capped:
        most = output_len - 1
        notes.append(f"{output_name} caps tau for K {', '.join(map(str, capped))}: a request's first token comes "
                     f"from its prefill, so its decode steps commit at most {most} token{'s' if most != 1 else ''}, "
                     "and a step commits at most what a request has left, not tau")
    if inputs.max_positions is not None and input_len + output_len > inputs.max_positions:
        notes.append(f"{input_name} + {output_name} = {input_len + output_len} tokens pass the "
                     f"target's max_position_embeddings ({inputs.max_positions}): an engine refuses such requests "
                     "unless its max_model_len is raised (with RoPE scaling the model supports)")
    unknown = [g.name for g in gpus if not g.memory_gb]
    if unknown:
        notes.append(f"{', '.join(unknown)}: memory not given (--gpu-spec mem=GB), so whether the deployment fits "
                     "is not checked")
    if inputs.target.linear_layers:
        notes.append(f"hybrid target: {inputs.target.linear_layers} linear-attention layers, their state read and "
                     "written per verified token")
    return PredictionReport(
        target=inputs.target_name, draft=inputs.draft_name, engine=engine, tensor_parallel=tp, input_len=input_len,
        output_len=output_len, context=context,
        gpus=[{"name": g.name, "memory_bandwidth_gbps": g.memory_bandwidth_gbps, "bf16_tflops": g.bf16_tflops,
               "fp8_tflops": g.fp8_tflops, "memory_gb": g.memory_gb} for g in gpus],
        taus={k: round(t, 4) for k, t in sorted(taus.items())}, tau_source=tau_source, predictions=rows,
        recommendation=recommendations,
        error_band=ModelError(median=round(band.median, 4), worst=round(band.worst, 4), cases=band.cases,
                              directions_right=band.directions_right, directions=band.directions, line=band.line(),
                              speedup_median=round(speedup_error.median, 4), speedup_worst=round(speedup_error.worst, 4),
                              speedup_cases=speedup_error.cases, speedup_pooled=speedup_error.pooled,
                              speedup_line=speedup_error.line(), outside_calibration=outside),
        notes=notes)


def text_lines(report: PredictionReport) -> list[str]:
    """The table per GPU, the recommendation per concurrency, the error band beside them."""
    band = report.error_band
    head = (f"{'K':>3} {'conc':>5} {'tau':>6} {'plain tok/s':>12} {'spec tok/s':>11} {'speedup':>8} "
            f"{'GB/GPU':>7}  bound (speculative / plain)")
    lines = [f"predicted for {report.target} + {report.draft} on {report.engine}"
             + (f", TP {report.tensor_parallel}" if report.tensor_parallel > 1 else "")
             + f", context {report.input_len} in + {report.output_len} out (tau: {report.tau_source})",
             f"datasheet GPU figures, calibrated efficiencies; {band.line}"
             + (f"; {band.speedup_line}" if band.speedup_line else "")]
    for g in report.gpus:
        memory = f", {g['memory_gb']:g} GB" if g.get("memory_gb") else ""
        lines += ["", f"{g['name']} ({g['memory_bandwidth_gbps']:g} GB/s, {g['bf16_tflops']:g} bf16 TFLOP/s{memory}):",
                  head]
        for r in (r for r in report.predictions if r.gpu == g["name"]):
            plain, fast, speedup, memory = _figures(r)
            lines.append(f"{r.num_speculative_tokens:>3} {r.concurrency:>5} {r.tau:>6.2f} {plain:>12} {fast:>11} "
                         f"{speedup:>8} {memory:>7}  "
                         + (r.bound if r.baseline_fits is False else f"{r.bound} / {r.baseline_bound}"))
        for rec in (r for r in report.recommendation if r.gpu == g["name"]):
            band_text = "" if rec.speedup is None or band.speedup_median is None else (
                f" (speedup error: median {band.speedup_median:.0%}, worst {band.speedup_worst:.0%} on "
                f"{band.speedup_cases} cases{', engines pooled' if band.speedup_pooled else ''}"
                + ("; outside the calibration cases, see the note" if band.outside_calibration else "") + ")")
            lines.append(f"  concurrency {rec.concurrency}: {_verdict(rec)}: {rec.reason}{band_text}")
            if rec.launch:
                lines.append(f"    {rec.launch}")
    lines += [f"note: {n}" for n in report.notes]
    return lines


def _slower_step(best: PredictionRow, output_len: int, output_name: str) -> str:
    """Why the best K is slower: its step costs more than the plain steps it replaces, one per token it commits,
    which is tau capped at what a request has left (committed_per_step)."""
    committed = committed_per_step(best.tau, output_len)
    count = f"{committed:.0f}" if committed == int(committed) else f"{committed:.2f}"
    cap = f" (tau {best.tau:.2f} capped by {output_name})" if committed < best.tau else ""
    plural = "" if committed == 1 else "s"
    return (f"its step ({best.bound}-bound) costs more than the {committed:.2f} plain step{plural} "
            f"({best.baseline_bound}-bound) its {count} committed token{plural} replace{'s' if not plural else ''}"
            f"{cap}")


def speedup_text(speedup: float) -> str:
    """A speedup to 2 decimals, or as many more as it takes to fall on the same side of 1.0 as the figure (0.996
    is not "1.00x" beside a verdict of no speculation)."""
    for digits in range(2, 7):
        text = f"{speedup:.{digits}f}"
        if (float(text) >= 1.0) == (speedup >= 1.0):
            return text
    return f"{speedup}"


def _verdict(rec: ConcurrencyRecommendation) -> str:
    if rec.num_speculative_tokens is not None:
        return f"K={rec.num_speculative_tokens}"
    return "no speculation" if rec.target_fits else "does not fit"


def _figures(r: PredictionRow) -> tuple[str, ...]:
    """A row's plain and speculative tokens/s, speedup and GB per GPU as text; '-' where there is none (the
    deployment does not fit)."""
    return tuple("-" if value is None else show(value) for value, show in (
        (r.baseline_tokens_per_s, "{:.1f}".format), (r.speculative_tokens_per_s, "{:.1f}".format),
        (r.speedup, lambda x: speedup_text(x) + "x"), (r.memory_per_gpu_gb, "{:.1f}".format)))


def markdown_lines(report: PredictionReport) -> list[str]:
    """The prediction as a Markdown section (validate's report, the model card)."""
    band = report.error_band
    lines = [f"Predicted on {', '.join(g['name'] for g in report.gpus)} ({report.engine}, context {report.input_len} "
             f"in + {report.output_len} out; datasheet figures, calibrated constants; {band.line}"
             + (f"; {band.speedup_line}" if band.speedup_line else "") + "):", "",
             "| GPU | K | concurrency | tau | plain tok/s | speculative tok/s | speedup | GB per GPU | bound |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.gpu} | {r.num_speculative_tokens} | {r.concurrency} | {r.tau:.2f} | "
              + " | ".join(_figures(r)) + f" | {r.bound} |" for r in report.predictions]
    lines += [f"- note: {n}" for n in report.notes if n.startswith(("warning:", "outside the calibration cases"))]
    lines.append("")
    for rec in report.recommendation:
        lines.append(f"- {rec.gpu}, concurrency {rec.concurrency}: **{_verdict(rec)}**: {rec.reason}")
        if rec.launch:
            lines += ["", f"  `{rec.launch}`", ""]
    return lines


def prediction_report_schema() -> dict[str, Any]:
    return PredictionReport.model_json_schema()


def verify_compute_note(gpu_: GPU, engine: str, k: int, max_num_seqs: int,
                        target: ModelFacts | None = None, context: float = 1024) -> tuple[bool, str]:
    """Whether a full batch's verify, max_num_seqs x (K+1) tokens, is compute-bound on the GPU, and the sentence
    saying so: with the target's facts, its verify pass as the cost model has it (and the batch where it turns);
    without, the GPU's ridge point for a dense bf16 target (its FLOPs per weight byte: 2 FLOPs per 2-byte weight
    per token), which any dense bf16 target crosses at about the same token count."""
    from dflash_convert.predict.cost import target_pass

    constants = ENGINES.get(engine, ENGINES["vllm"])
    tokens = max_num_seqs * (k + 1)
    if target is None:
        ridge = (gpu_.bf16_tflops * 1e12 * constants.compute_efficiency
                 / (gpu_.memory_bandwidth_gbps * 1e9 * constants.bandwidth_efficiency))
        bound = tokens > ridge
        return bound, (f"{max_num_seqs} sequences x (K {k} + 1) = {tokens} verify tokens per step; on {gpu_.name} a "
                       f"dense bf16 target's verify turns compute-bound past about {ridge:.0f} tokens per step "
                       f"(datasheet peak / bandwidth at {engine}'s calibrated efficiencies)"
                       + (": at a full batch each verify step costs more than reading the weights, so speculation "
                          "gains less as the batch fills" if bound else ": memory-bound at a full batch")
                       + "; give --target for the target's own figure (MoE, fp8, KV cache)")

    def compute_bound(seqs: int) -> bool:
        p = target_pass(target, batch=seqs, tokens_per_seq=k + 1, context=context, gpu=gpu_, constants=constants,
                        tp=1)
        return p.compute_s > p.memory_s

    bound = compute_bound(max_num_seqs)
    turn = next((s for s in (2 ** i for i in range(0, 17)) if compute_bound(s)), None)
    where = (f"it turns compute-bound at about {turn} sequences ({turn * (k + 1)} tokens)" if turn is not None
             else "it stays memory-bound (weights, experts or KV cache) up to 65536 sequences")
    return bound, (f"{max_num_seqs} sequences x (K {k} + 1) = {tokens} verify tokens per step on {gpu_.name} "
                   f"({engine}, context {context:g}): the target's verify is "
                   f"{'compute-bound' if bound else 'memory-bound'}; {where}")
