"""What a validation run is asked to do: one typed object, built by the CLI and by library callers,
carried through the levels and recorded in the JSON report (`options`)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.flags import (
    CAUSAL_HELP, VALIDATE_ALLOW_PICKLE_HELP, CommandOptions, Flag, Off, declared, named, wanted
)
from dflash_convert.format.compat import Level
from dflash_convert.format.configs import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE
from dflash_convert.format.dtypes import DTYPE_CHOICES
from dflash_convert.format.engines import ENGINE_NAMES
from dflash_convert.predict.prediction import MAX_CONCURRENCY
from dflash_runtime import BACKEND_NAMES, DEVICE_MAPS, DRAFT_SAMPLING

LEVELS: tuple[str, ...] = get_args(Level)  # in the order they run
MAX_CONTEXT_TOKENS = 1 << 20  # a --context-lengths value: the memory plan says whether it fits
MAX_PROMPT_TOKENS = 8192  # token ids of one prompt, given or tokenized; also the cap on --max-new-tokens
TIMING_ROUNDS = 3  # interleaved target-only / speculative rounds over the baseline prompts
ENDPOINT_TIMEOUT_S = 600.0  # the whole --endpoint measurement
ENDPOINT_KEY_VARIABLE = "OPENAI_API_KEY"
ENGINE_TIMEOUT_S = 1800.0  # the real engine's run: its start (imports, compilation) is most of it on small pairs
ENGINE_ARGS_OWNED = ("model", "speculative_config", "skip_tokenizer_init", "disable_log_stats")  # set by the driver
SamplingMode = Literal["auto", "greedy"]
SAMPLING_MODES: tuple[str, ...] = get_args(SamplingMode)
# the choices of a flag, as the libraries name them
DraftSampling = Literal[DRAFT_SAMPLING]
DeviceMap = Literal[DEVICE_MAPS]
Engine = Literal[ENGINE_NAMES]
Backend = Literal[("auto", *BACKEND_NAMES)]
Dtype = Literal[DTYPE_CHOICES]
# an item of a list flag, in its range
SpeculativeTokens = Annotated[int, Field(ge=1, le=MAX_BLOCK_SIZE)]
Concurrency = Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]
Rate = Annotated[float, Field(ge=0, le=1)]
ContextLength = Annotated[int, Field(ge=2, le=MAX_CONTEXT_TOKENS)]
# a prompt: text, token ids, or OpenAI-style chat messages ({"role", "content"} turns)
Prompt = str | list[int] | list[dict[str, Any]]


class PromptSet(BaseModel):
    """A named set of prompts (a --dataset resolved by the caller), reported on its own."""

    model_config = ConfigDict(extra="forbid")

    name: str
    source: str = Field(description="where the prompts came from, as the report shows it")
    prompts: list[Prompt]


# the sampling fields (vLLM's names); each one's range is its field's, a generation_config.json value is held to it
FIELDS = ("temperature", "top_k", "top_p", "min_p")
PENALTY_FIELDS = ("repetition_penalty", "presence_penalty", "frequency_penalty")
# what the run sets in a chat template's variables itself, as vLLM's chat endpoint does
TEMPLATE_OWNED = ("chat_template", "tokenize", "add_generation_prompt", "continue_final_message", "conversation")


def check_value(name: str, value: Any, *, file: str | None = None) -> float | int:
    """A sampling value in its field's range, as vLLM takes it (top_k -1 or 0: off, normalised to 0), else one
    error naming it: a usage error for a flag, a DFlashError naming the file for generation_config.json."""
    try:
        checked = _sampling_value(name).validate_python(value, strict=True)  # strict: 0.5 only, never "0.5"
    except ValidationError:
        where = f"field `{name}`" if file else named(ValidateOptions, name)
        message = f"{where} must be {wanted(ValidateOptions, (name,))}, got {value!r}"
        raise DFlashError(message, file=file) if file else UsageError(message) from None
    return max(checked, 0) if name == "top_k" else float(checked)


@cache
def _sampling_value(name: str) -> TypeAdapter:
    """The field's declaration (type and range) without its None."""
    kind, metadata = declared(ValidateOptions, (name,))
    return TypeAdapter(Annotated[(kind, *(m for m in metadata if not isinstance(m, (Flag, Off))))])


class ValidateOptions(CommandOptions):
    """Options of `validate`, each declared once: type, range or choices, default and help here, its flag in its
    `Flag` (the CLI's options are generated from this model; tests/cli/test_cli_options.py holds them together).
    A value out of its range, and options that contradict each other (the model validators below), are the
    usage error the CLI prints (exit 2), raised when the options are made, before anything is read."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # how `validate -h` groups the flags, the way users look for them (a field in none: "Options")
    HELP_PANELS: ClassVar[dict[str, tuple[str, ...]]] = {
        "Inputs": ("target", "prompts", "chat_template", "chat_template_kwargs", "compare_thinking", "levels",
                   "allow_pickle"),
        "Long contexts and outputs": ("context_lengths", "long_context_file", "max_model_len", "profile_out"),
        "Decoding": ("max_new_tokens", "num_speculative_tokens", "block_size", "sampling", "temperature", "top_k", "top_p", "min_p",
                     "repetition_penalty", "presence_penalty", "frequency_penalty", "draft_sampling", "seed"),
        "Runtime": ("device", "dtype", "backend", "target_backend", "causal", "compile", "device_map", "max_memory",
                    "threads", "keep_going"),
        "Engine": ("engine", "engine_python", "engine_args", "engine_timeout", "engine_kv_cache_gib"),
        "Live deployment": ("endpoint", "endpoint_model", "endpoint_key_env", "endpoint_timeout", "concurrency",
                            "baseline_endpoint"),
        "GPU prediction": ("predict_gpu",),
        "Thresholds": ("min_acceptance_length", "min_position_rates", "min_speedup", "baseline", "max_regression",
                       "require_end_to_end", "compare_to"),
    }

    target: Annotated[str | Path | None, Flag("--target", type=str, reads=True)] = Field(
        None, description="Target model directory, its config.json, or Hub id. A config alone enables the static pair "
        "checks; weights enable end to end.")
    target_name: Annotated[str | None, Flag(None, why="the CLI: the --target as given (a Hub id)")] = Field(
        None, description="how the report names the target (a Hub id)")
    target_revision: Annotated[str | None, Flag(None, why="the CLI: the target's resolved commit")] = None
    checkpoint_revision: Annotated[str | None, Flag(None, why="the CLI: the draft's resolved commit")] = None
    prompts: Annotated[str | Path | list[Prompt] | None, Flag("--prompts", type=Path, reads=True)] = Field(
        None, description="One prompt per line (text, or token ids as space-separated ints / a JSON list), or JSONL "
        "with a `prompt` field or OpenAI-style `messages`. Default: a built-in set.")
    prompt_sets: Annotated[list[PromptSet], Flag(None, why="the CLI: each --dataset, pulled from the Hub")] = Field(
        default_factory=list, description="named prompt sets (--dataset), run after `prompts` and reported per set")
    chat_template: Annotated[str, Flag("--chat-template", metavar="auto|none|FILE",
                                                        reads=True)] = Field(
        "auto", description="Render text prompts and messages with the target tokenizer's chat template (auto, when "
        "it has one), none, or a Jinja FILE; as vLLM's chat endpoint.")
    chat_template_kwargs: Annotated[dict[str, Any] | None, Flag("--chat-template-kwargs", parse="json")] = Field(
        None, description='Template variables, as vLLM\'s chat_template_kwargs, e.g. \'{"enable_thinking": false}\'.')
    context_lengths: Annotated[list[ContextLength] | None, Flag("--context-lengths", parse="lengths")] = Field(
        None, min_length=1, description="End to end: also measure tau, per-position rates and outputs equal on prompts of exactly "
        "these many tokens (1024, 2k, 32k; k = 1024) of a real long text, generation following it; reported as a "
        "curve of tau against context length. Each length + --max-new-tokens must fit --max-model-len, else the "
        "target's own positions.")
    long_context_file: Annotated[str | Path | None, Flag("--long-context-file", type=Path, metavar="FILE",
                                                              reads=True)] = Field(
        None, description="The long text --context-lengths cuts its prompts from (a document, code; token ids when "
        "the target ships no tokenizer). Default: the prompts' own texts joined in order.")
    max_model_len: Annotated[int | None, Flag("--max-model-len", metavar="TOKENS", parse="length")] = Field(
        None, ge=1, le=1 << 30, description="The context the deployment serves (vLLM's max_model_len; 32768 or 32k, "
        "k = 1024): the static "
        "level warns where it exceeds the positions the draft was trained for; --context-lengths past the target's "
        "own positions need it.")
    profile_out: Annotated[str | Path | None, Flag("--profile-out", type=Path, metavar="FILE")] = Field(
        None, description="Write the measured acceptance as a speculation_profile.json (NVIDIA Model-Optimizer's "
        "schema): one profile per K and per context length run.")
    compare_thinking: Annotated[bool, Flag("--compare-thinking")] = Field(
        False, description="Run end to end twice, the chat template rendered with enable_thinking true and false "
        "(with --endpoint: sent to the server), and report tau per mode side by side.")
    levels: Annotated[list[Level], Flag("--levels", parse="levels")] = Field(
        default_factory=lambda: list(LEVELS),
        description=f"Comma-separated subset of {','.join(LEVELS)} (default: all the inputs allow).")
    max_new_tokens: Annotated[int, Flag("--max-new-tokens")] = Field(
        64, ge=1, le=MAX_PROMPT_TOKENS, description="Tokens generated per prompt (end to end).")
    num_speculative_tokens: Annotated[list[SpeculativeTokens] | None, Flag("--num-speculative-tokens", parse="ints",
                                                             metavar="K[,K...]")] = Field(
        None, description="vLLM's num_speculative_tokens: tokens drafted per step (a block of K+1 slots; K for a "
        "DSpark draft with sample_from_anchor). Several values: one end-to-end run per K, reported side by side. "
        "Default: the draft's trained block.")
    block_size: Annotated[int | None, Flag("--block-size")] = Field(
        None, ge=MIN_BLOCK_SIZE, le=MAX_BLOCK_SIZE,
        description="The DFlash block in slots (K+1), not vLLM's KV-cache --block-size; "
        "--num-speculative-tokens says it in vLLM's terms. Default: the draft's.")
    sampling: Annotated[SamplingMode, Flag("--sampling")] = Field(
        "auto", description="auto: temperature, top-k, top-p, min-p from the target's generation_config.json, as "
        "vLLM serves it; greedy: temperature 0. Flags below override.")
    temperature: Annotated[float | None, Flag("--temperature")] = Field(
        None, ge=0, allow_inf_nan=False,
        description="0 = greedy (output must equal the target's). Default: per --sampling.")
    top_k: Annotated[int | None, Flag("--top-k"), Off("-1 or 0")] = Field(
        None, ge=-1, description="Top-k of the target's distribution (0: off). Default: per --sampling.")
    top_p: Annotated[float | None, Flag("--top-p")] = Field(
        None, gt=0, le=1, description="Top-p (1: off). Default: per --sampling.")
    min_p: Annotated[float | None, Flag("--min-p")] = Field(
        None, ge=0, le=1, description="Min-p (0: off). Default: per --sampling.")
    repetition_penalty: Annotated[float | None, Flag("--repetition-penalty"), Off("1")] = Field(
        None, gt=0, allow_inf_nan=False,
        description="vLLM's repetition penalty (1: off; prompt and output tokens). Default: the target's "
        "generation_config.json, else off, in both --sampling modes.")
    presence_penalty: Annotated[float | None, Flag("--presence-penalty"), Off("0")] = Field(
        None, ge=-2, le=2,
        description="vLLM's presence penalty in [-2, 2] (0: off; output tokens). Default: the target's "
        "generation_config.json, else off.")
    frequency_penalty: Annotated[float | None, Flag("--frequency-penalty"), Off("0")] = Field(
        None, ge=-2, le=2,
        description="vLLM's frequency penalty in [-2, 2] (0: off; output tokens). Default: the target's "
        "generation_config.json, else off.")
    draft_sampling: Annotated[DraftSampling, Flag("--draft-sampling")] = Field(
        "greedy", description="greedy: the draft's argmax (vLLM's default); probabilistic: sampled at --temperature, "
        "accepted by rejection sampling.")
    seed: Annotated[int, Flag("--seed")] = Field(0, description="Seed of the synthetic inputs and of sampling.")
    device: Annotated[str, Flag("--device")] = Field("auto", description="auto, cpu, cuda or cuda:N.")
    dtype: Annotated[Dtype, Flag("--dtype")] = Field(
        "auto", description="Compute dtype (auto: each checkpoint's own, from its config or weights).")
    backend: Annotated[Backend, Flag("--backend")] = Field(
        "auto", description="Draft attention backend (auto: the numeric level tries every available one).")
    target_backend: Annotated[str | None, Flag("--target-backend")] = Field(
        None, description="The target's attn_implementation (eager, sdpa, flex_attention, ...); default: sdpa where "
        "its model supports it, else eager.")
    causal: Annotated[bool | None, Flag("--causal/--non-causal")] = Field(None, description=CAUSAL_HELP)
    engine: Annotated[Engine | None, Flag("--engine")] = Field(
        None, description="A serving engine: run the draft as it would.")
    engine_python: Annotated[str | None, Flag("--engine-python", metavar="PATH")] = Field(
        None, description="With --engine vllm: also serve the pair in real vLLM, run by the Python interpreter at "
        "PATH (`self`: this one), and check its outputs and acceptance against ours.")
    engine_args: Annotated[dict[str, Any], Flag("--engine-args", parse="json")] = Field(
        default_factory=dict, description="Arguments for vLLM's LLM(...), e.g. "
        "'{\"dtype\": \"float32\", \"tensor_parallel_size\": 2}'.")
    engine_timeout: Annotated[float, Flag("--engine-timeout")] = Field(
        ENGINE_TIMEOUT_S, gt=0, description="Seconds the engine run may take; then it is killed (exit 1).")
    engine_kv_cache_gib: Annotated[float, Flag("--engine-kv-cache-gib", aliases=("--engine-kv-cache",),
                                               metavar="GIB")] = Field(
        1.0, gt=0, description="vLLM's CPU KV cache in GiB (VLLM_CPU_KVCACHE_SPACE).")
    compile: Annotated[bool, Flag("--compile")] = Field(
        False, description="End to end with static caches and torch.compile'd draft and verify steps (CUDA graphs "
        "on a GPU); compiling takes a while.")
    device_map: Annotated[DeviceMap | None, Flag("--device-map")] = Field(
        None, description="Place the target with transformers + accelerate (GPUs, then CPU, then disk).")
    max_memory: Annotated[dict[str, int] | None, Flag("--max-memory", parse="memory")] = Field(
        None, description="Per-device budget for --device-map, e.g. 0=20GiB,cpu=30GiB (implies --device-map auto).")
    threads: Annotated[int | None, Flag("--threads")] = Field(
        None, ge=1, description="CPU threads for torch (default: 1 for tiny pairs, else torch's; shown in the report).")
    min_acceptance_length: Annotated[float | None, Flag("--min-acceptance-length", parse="thresholds",
                                                        metavar="X[,CATEGORY=X...]")] = Field(
        None, ge=0, allow_inf_nan=False, description="Fail when tau (mean tokens per step) is lower; CATEGORY=X: "
        "when the tau of the prompts of that category (a JSONL `category` field) is lower. A category holding `,` or "
        "`=`: give a JSON object, '{\"\": 3, \"qa, misc\": 4}' (key \"\": the whole run).")
    min_category_acceptance_length: Annotated[dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]], Flag(
        None, why="the CLI: --min-acceptance-length CATEGORY=X")] = Field(
        default_factory=dict, description="category -> the tau its prompts must reach")
    min_position_rates: Annotated[list[Rate] | None, Flag("--min-position-rates", parse="floats")] = Field(
        None, description="Comma-separated minimum acceptance rate per draft position, e.g. 0.9,0.8,0.7.")
    min_speedup: Annotated[float | None, Flag("--min-speedup")] = Field(
        None, description="Fail when the measured speedup is lower (otherwise it is informational).")
    timing_rounds: Annotated[int, Flag(None, why="library callers: rounds of the speedup measurement")] = Field(
        TIMING_ROUNDS, ge=1)
    baseline: Annotated[str | Path | None, Flag("--baseline", type=Path, reads=True)] = Field(
        None, description="An earlier `validate --json` report of the same prompts and settings: fail (exit 3) on a "
        "drop of tau or a position's rate beyond what the counts explain.")
    compare_to: Annotated[str | Path | None, Flag("--compare-to", type=Path, reads=True)] = Field(
        None, description="Another draft (the unquantized source of a quantized one): run it on the same prompts "
        "and settings and report the tau and per-position rates this draft loses against it.")
    max_regression: Annotated[float, Flag("--max-regression")] = Field(
        0.0, ge=0, lt=1,
        description="With --baseline: a drop tolerated beyond the statistical bound, as a fraction of the "
        "baseline's value (0.05: 5 %).")
    endpoint: Annotated[str | None, Flag("--endpoint", metavar="URL")] = Field(
        None, description="A live OpenAI-compatible server (vLLM, SGLang, a router): send it the prompts and measure "
        "the acceptance it serves, from its per-request statistics or its Prometheus counters.")
    endpoint_model: Annotated[str | None, Flag("--endpoint-model", metavar="NAME")] = Field(
        None, description="The model to ask --endpoint for (default: the only one its /v1/models lists).")
    endpoint_key_env: Annotated[str, Flag("--endpoint-key-env", metavar="VAR")] = Field(
        ENDPOINT_KEY_VARIABLE, description="The environment variable holding the endpoint's API key (sent only "
        "to the endpoints, never printed or written).")
    endpoint_timeout: Annotated[float, Flag("--endpoint-timeout", metavar="SECONDS")] = Field(
        ENDPOINT_TIMEOUT_S, gt=0, allow_inf_nan=False,
        description="Seconds the whole endpoint measurement may take; each connect and read is "
        "bounded by what is left.")
    concurrency: Annotated[list[Concurrency], Flag("--concurrency", parse="ints", metavar="N[,N...]")] = Field(
        default_factory=lambda: [1], min_length=1, description="Requests in flight at once against --endpoint (and "
        "--baseline-endpoint; one value). End to end: the batch sizes at which the target's verify step and the "
        "draft step are also timed, for the expected speedup and the K recommended at each (batch 1 always).")
    baseline_endpoint: Annotated[str | None, Flag("--baseline-endpoint", metavar="URL")] = Field(
        None, description="The same target served without speculation: greedy outputs must equal --endpoint's "
        "(up to near-ties), and the speedup is measured in interleaved rounds.")
    keep_going: Annotated[bool, Flag("--keep-going")] = Field(
        False, description="Run numeric and end-to-end levels even when static checks failed.")
    require_end_to_end: Annotated[bool, Flag("--require-end-to-end")] = Field(
        False, description="Fail (exit 3) when the end-to-end level does not run (no --target, a config-only target, "
        "an earlier level failed): for CI, where a forgotten --target must not pass.")
    allow_pickle: Annotated[bool, Flag("--allow-pickle")] = Field(False, description=VALIDATE_ALLOW_PICKLE_HELP)
    predict_gpu: Annotated[list[str] | None, Flag("--predict-gpu", parse="names", metavar="NAME[,NAME...]")] = Field(
        None, description="Predict plain vs speculative tokens/s on these GPUs (dflash-convert predict's table) from "
        "this run's tau per K and the configs: GPU columns in the K table, a section in the reports and the model "
        "card with the launch line at the K recommended (engine: --engine, else vllm; concurrency: --concurrency).")

    @field_validator("predict_gpu")
    @classmethod
    def _known_gpus(cls, names: list[str] | None) -> list[str] | None:
        from dflash_convert.errors import UsageError
        from dflash_convert.predict.gpus import gpu

        if names is None:
            return None
        # an unknown name: the usage error listing all (validate has no --gpu-spec to suggest)
        known = [gpu(n, "--predict-gpu", None).name for n in names]
        if not known:
            raise UsageError("--predict-gpu names no GPU (give NAME[,NAME...])")
        if len(set(known)) != len(known):
            twice = next(k for k in known if known.count(k) > 1)
            raise UsageError(f"--predict-gpu {','.join(names)}: {twice} is named twice")
        return known

    def check(self) -> None:
        """Check the options again as they stand: `model_copy(update=...)` and `model_construct` skip pydantic's
        validation, so validate() checks what it was handed before anything is read."""
        type(self).model_validate(dict(self))

    @field_validator("num_speculative_tokens", "concurrency", "context_lengths")
    @classmethod
    def _distinct(cls, values: list[int] | None) -> list[int] | None:
        if values and len(set(values)) != len(values):
            raise ValueError(f"must be distinct values, got {values}")
        return values

    @field_validator("prompt_sets")
    @classmethod
    def _distinct_names(cls, sets: list[PromptSet]) -> list[PromptSet]:
        names = [s.name for s in sets]
        if len(set(names)) != len(names):
            raise ValueError(f"must have distinct names (a --dataset given twice?), got {names}")
        return sets

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, variables: dict[str, Any] | None) -> dict[str, Any] | None:
        owned = sorted(set(TEMPLATE_OWNED) & set(variables or {}))
        if owned:
            raise ValueError(f"may not set {owned}: the run sets them as vLLM's chat endpoint does")
        return variables

    @field_validator("engine_args")
    @classmethod
    def _engine_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        owned = [k for k in args if k in ENGINE_ARGS_OWNED]
        if owned:
            raise ValueError(f"may not set {', '.join(owned)}: they are set by validate itself")
        return args

    @field_validator("endpoint_key_env")
    @classmethod
    def _variable_name(cls, name: str) -> str:
        if not name.replace("_", "").isalnum():
            raise ValueError(f"must be the name of an environment variable, got {name!r}")
        return name

    # rules between options: each raises its own UsageError, its sentence naming the flags
    @model_validator(mode="after")
    def _decoding(self) -> ValidateOptions:
        if self.num_speculative_tokens is not None and self.block_size is not None:
            raise UsageError("give --num-speculative-tokens or --block-size, not both (the block is K+1 slots)")
        if self.sampling == "greedy" and self.temperature not in (None, 0):
            raise UsageError(f"--sampling greedy decodes at temperature 0; drop --temperature {self.temperature} "
                             "or use --sampling auto")
        return self

    @model_validator(mode="before")
    @classmethod
    def _category_thresholds(cls, data: Any) -> Any:
        """--min-acceptance-length as the CLI parses it ({"": X, CATEGORY: X}): the plain one and the categories'."""
        if isinstance(data, dict) and isinstance(data.get("min_acceptance_length"), dict):
            given = dict(data["min_acceptance_length"])
            data = {**data, "min_acceptance_length": given.pop("", None),
                    "min_category_acceptance_length": {**data.get("min_category_acceptance_length", {}), **given}}
        return data

    @model_validator(mode="after")
    def _thinking(self) -> ValidateOptions:
        if self.compare_thinking and "enable_thinking" in (self.chat_template_kwargs or {}):
            raise UsageError("--compare-thinking sets enable_thinking itself (true, then false): drop it from "
                             "--chat-template-kwargs")
        if self.compare_thinking and self.chat_template == "none":
            raise UsageError("--compare-thinking switches the chat template's enable_thinking: not with "
                             "--chat-template none")
        return self

    @model_validator(mode="after")
    def _long_contexts(self) -> ValidateOptions:
        if self.long_context_file is not None and not self.context_lengths:
            raise UsageError("--long-context-file is the text of --context-lengths: give --context-lengths with it")
        if self.context_lengths:  # the target's own positions are checked once its config is read (prepare)
            from dflash_convert.validate.trained_context import check_context_lengths

            check_context_lengths(self.context_lengths, self.max_new_tokens, max_model_len=self.max_model_len)
        return self

    @model_validator(mode="after")
    def _thresholds(self) -> ValidateOptions:
        if self.max_regression and self.baseline is None:
            raise UsageError("--max-regression is the tolerance of --baseline: give --baseline with it")
        return self

    @model_validator(mode="after")
    def _engine(self) -> ValidateOptions:
        if self.engine_python is not None and self.engine != "vllm":
            raise UsageError("--engine-python runs the pair in real vLLM: give --engine vllm with it")
        if self.engine_python is not None and self.draft_sampling != "greedy":
            raise UsageError("--engine-python compares with vLLM, whose DFlash drafter proposes greedily "
                             "(no draft probabilities): drop --draft-sampling")
        if self.engine_args and self.engine_python is None:
            raise UsageError("--engine-args are for the real engine: give --engine-python with them")
        if self.engine is not None and self.causal is not None:
            raise UsageError("give --engine or --causal/--non-causal, not both (the engine decides causality)")
        return self

    @model_validator(mode="after")
    def _endpoint(self) -> ValidateOptions:
        if self.endpoint is None and (self.endpoint_model or self.baseline_endpoint):
            raise UsageError("--endpoint-model and --baseline-endpoint go with --endpoint")
        if self.endpoint is not None and len(self.concurrency) > 1:
            raise UsageError("--endpoint is measured at one --concurrency; give one value")
        return self

    @field_validator("concurrency", mode="before")
    @classmethod
    def _one_concurrency(cls, value: Any) -> Any:
        """A single number (library callers, earlier reports) is the one concurrency."""
        return [value] if isinstance(value, int) else value

    @property
    def endpoint_concurrency(self) -> int:
        """The requests in flight against --endpoint (one value with it, `_endpoint`)."""
        return self.concurrency[0]

    def blocks(self, anchor_predicts: bool) -> list[int | None]:
        """The blocks (slots) to run, one end-to-end run each: K+1 per --num-speculative-tokens value (K when the
        anchor's slot proposes, as vLLM runs a DSpark draft with sample_from_anchor); else [--block-size], None
        meaning the draft's own."""
        if not self.num_speculative_tokens:
            return [self.block_size]
        return [k + (0 if anchor_predicts else 1) for k in self.num_speculative_tokens]

    @property
    def placed_by_device_map(self) -> str | None:
        """The target's device map: a memory budget means placement by the device map."""
        return self.device_map or ("auto" if self.max_memory is not None else None)
