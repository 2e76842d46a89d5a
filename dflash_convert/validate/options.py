"""What a validation run is asked to do: one typed object, built by the CLI and by library callers,
carried through the levels and recorded in the JSON report (`options`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, get_args
from pydantic import BaseModel, ConfigDict, Field

from dflash_convert.errors import UsageError
from dflash_convert.format.compat import Level
from dflash_convert.format.configs import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE
from dflash_runtime import DEVICE_MAPS, DRAFT_SAMPLING

LEVELS: tuple[str, ...] = get_args(Level)  # in the order they run
MAX_PROMPT_TOKENS = 8192  # token ids of one prompt, given or tokenized; also the cap on --max-new-tokens
TIMING_ROUNDS = 3  # interleaved target-only / speculative rounds over the baseline prompts
ENGINE_TIMEOUT_S = 1800.0  # the real engine's run: its start (imports, compilation) is most of it on small pairs
ENGINE_ARGS_OWNED = ("model", "speculative_config", "skip_tokenizer_init", "disable_log_stats")  # set by the driver
SamplingMode = Literal["auto", "greedy"]
SAMPLING_MODES: tuple[str, ...] = get_args(SamplingMode)
# a prompt: text, token ids, or OpenAI-style chat messages ({"role", "content"} turns)
Prompt = str | list[int] | list[dict[str, Any]]


class PromptSet(BaseModel):
    """A named set of prompts (a --dataset resolved by the caller), reported on its own."""

    model_config = ConfigDict(extra="forbid")

    name: str
    source: str = Field(description="where the prompts came from, as the report shows it")
    prompts: list[Prompt]


class ValidateOptions(BaseModel):
    """Options of `validate`. Defaults are the CLI's. `check()` turns an out-of-range value into the
    usage error the CLI prints (exit 2), before anything is read."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    target: str | Path | None = Field(None, description="target model directory, its config.json (static pair "
                                      "checks only) or, resolved by the caller, a Hub download")
    target_name: str | None = Field(None, description="how the report names the target (a Hub id)")
    target_revision: str | None = None
    checkpoint_revision: str | None = None
    prompts: str | Path | list[Prompt] | None = Field(
        None, description="a prompts file, or the prompts (text, token ids or chat messages); None: a built-in set "
        "(unless prompt_sets are given)")
    prompt_sets: list[PromptSet] = Field(default_factory=list, description="named prompt sets (--dataset), run "
                                         "after `prompts` and reported per set")
    chat_template: str = Field("auto", description="auto: the tokenizer's chat template when it has one; none: "
                               "raw text; else a Jinja template file")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="extra template variables, as vLLM's "
                                                        "chat_template_kwargs (e.g. enable_thinking)")
    levels: list[str] = Field(default_factory=lambda: list(LEVELS), description=f"of {', '.join(LEVELS)}")
    max_new_tokens: int = 64
    block_size: int | None = Field(None, description="run-time block size (default: the draft's)")
    sampling: SamplingMode = Field("auto", description="auto: temperature, top_k, top_p, min_p from "
                                                "the target's generation_config.json as vLLM does; greedy: "
                                                "temperature 0; a value given below overrides either")
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = Field(None, description="vLLM's repetition penalty (1: off; prompt and "
                                             "output tokens); default: generation_config.json, else off")
    presence_penalty: float | None = Field(None, description="vLLM's presence penalty in [-2, 2] (0: off; output "
                                           "tokens); default: generation_config.json, else off")
    frequency_penalty: float | None = Field(None, description="vLLM's frequency penalty in [-2, 2] (0: off; output "
                                            "tokens); default: generation_config.json, else off")
    draft_sampling: str = Field("greedy", description=f"{' or '.join(DRAFT_SAMPLING)}")
    seed: int = 0
    device: str = "auto"
    dtype: str = Field("auto", description="auto: each checkpoint in its own dtype")
    backend: str = Field("auto", description="the draft's attention backend")
    target_backend: str | None = Field(None, description="the target's attn_implementation; None: sdpa where its "
                                       "model class supports it, else eager")
    causal: bool | None = Field(None, description="force every draft layer causal (True) or not (False)")
    engine: str | None = Field(None, description="run the draft as this engine serves it (vllm, sglang, zlab)")
    engine_python: str | None = Field(None, description="with engine vllm: also serve the pair in real vLLM with "
                                      "the Python interpreter at this path (`self`: this one) and check it against "
                                      "the emulation")
    engine_args: dict[str, Any] = Field(default_factory=dict, description="passed to vLLM's LLM(...) (dtype, "
                                        "tensor_parallel_size, max_model_len, ...)")
    engine_timeout: float = Field(ENGINE_TIMEOUT_S, description="seconds the engine run may take")
    engine_kv_cache_gib: float = Field(1.0, description="vLLM's KV cache on CPU (VLLM_CPU_KVCACHE_SPACE), GiB")
    compile: bool = False
    device_map: str | None = Field(None, description=f"the target's placement: {', '.join(DEVICE_MAPS)}")
    max_memory: dict[str, int] | None = Field(None, description="device -> bytes the target may take")
    threads: int | None = Field(None, description="CPU threads; None: 1 for tiny pairs, else torch's default")
    min_acceptance_length: float | None = None
    min_position_rates: list[float] | None = None
    min_speedup: float | None = None
    timing_rounds: int = TIMING_ROUNDS
    baseline: str | Path | None = Field(None, description="an earlier `validate --json` report of the same prompts "
                                        "and settings: fail (exit 3) when tau or a position's rate dropped beyond "
                                        "what the counts explain")
    max_regression: float = Field(0.0, description="with baseline: a drop tolerated on top of the statistical "
                                  "bound, as a fraction of the baseline's value (0.05: 5 %)")
    keep_going: bool = Field(False, description="run numeric and end to end even when static checks fail")
    allow_pickle: bool = Field(False, description="load pickle weights and mask_embedding.pt (weights_only)")

    def check(self) -> None:
        """Raise UsageError naming the flag of the first value out of its range."""
        unknown = [lv for lv in self.levels if lv not in LEVELS]
        if unknown:
            raise UsageError(f"unknown validation level(s) {unknown}; choose from {', '.join(LEVELS)}")
        if self.block_size is not None and not MIN_BLOCK_SIZE <= self.block_size <= MAX_BLOCK_SIZE:
            raise UsageError(f"--block-size must be in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}], got {self.block_size}")
        if not 1 <= self.max_new_tokens <= MAX_PROMPT_TOKENS:
            raise UsageError(f"--max-new-tokens must be in [1, {MAX_PROMPT_TOKENS}], got {self.max_new_tokens}")
        from dflash_convert.validate.sampling import FIELDS, PENALTY_FIELDS, check_value

        for name in FIELDS + PENALTY_FIELDS:
            if getattr(self, name) is not None:
                check_value(name, getattr(self, name))
        if self.sampling == "greedy" and self.temperature not in (None, 0):
            raise UsageError(f"--sampling greedy decodes at temperature 0; drop --temperature {self.temperature} "
                             "or use --sampling auto")
        reserved = {"chat_template", "tokenize", "add_generation_prompt", "continue_final_message", "conversation"}
        if self.chat_template_kwargs and reserved & set(self.chat_template_kwargs):
            raise UsageError(f"--chat-template-kwargs may not set {sorted(reserved & set(self.chat_template_kwargs))}"
                             ": the run sets them as vLLM's chat endpoint does")
        names = [s.name for s in self.prompt_sets]
        if len(set(names)) != len(names):
            raise UsageError(f"prompt set names must be distinct (a --dataset given twice?), got {names}")
        tau = self.min_acceptance_length
        if tau is not None and not (math.isfinite(tau) and tau >= 0):
            raise UsageError(f"--min-acceptance-length must be a finite number >= 0, got {tau}")
        rates = self.min_position_rates
        if rates and not all(math.isfinite(r) and 0 <= r <= 1 for r in rates):
            raise UsageError(f"--min-position-rates must be rates in [0, 1], got {list(rates)}")
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise UsageError(f"--draft-sampling {self.draft_sampling!r}: choose {' or '.join(DRAFT_SAMPLING)}")
        if self.device_map is not None and self.device_map not in DEVICE_MAPS:
            raise UsageError(f"--device-map {self.device_map!r}: choose {', '.join(DEVICE_MAPS)}")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"--threads must be at least 1, got {self.threads}")
        if not (math.isfinite(self.max_regression) and 0 <= self.max_regression < 1):
            raise UsageError(f"--max-regression must be a fraction in [0, 1), got {self.max_regression}")
        if self.max_regression and self.baseline is None:
            raise UsageError("--max-regression is the tolerance of --baseline: give --baseline with it")
        if self.timing_rounds < 1:
            raise UsageError(f"timing rounds must be at least 1, got {self.timing_rounds}")
        if self.engine_python is not None:
            if self.engine != "vllm":
                raise UsageError("--engine-python runs the pair in real vLLM: give --engine vllm with it")
            if not (self.sampling == "greedy" or self.temperature == 0):
                raise UsageError("--engine-python compares greedy decoding: give --sampling greedy")
        if self.engine_args and self.engine_python is None:
            raise UsageError("--engine-args are for the real engine: give --engine-python with them")
        owned = [k for k in self.engine_args if k in ENGINE_ARGS_OWNED]
        if owned:
            raise UsageError(f"--engine-args: {', '.join(owned)} are set by validate itself")
        if not (self.engine_timeout > 0 and self.engine_kv_cache_gib > 0):
            raise UsageError("--engine-timeout and --engine-kv-cache must be positive")
        if self.engine is not None and self.causal is not None:
            raise UsageError("give --engine or --causal/--non-causal, not both (the engine decides causality)")

    @property
    def placed_by_device_map(self) -> str | None:
        """The target's device map: a memory budget means placement by the device map."""
        return self.device_map or ("auto" if self.max_memory is not None else None)
