"""The sampling a deployment uses, resolved as vLLM resolves a chat request's: each of temperature,
top_k, top_p, min_p is the request's (here: the flag) when given, else the model's default from its
`generation_config.json` (vLLM's `--generation-config auto`, its default), else vLLM's own default.
`--sampling greedy` forces temperature 0.

Penalties (repetition, presence, frequency) resolve the same way, flag > generation_config.json > vLLM's
neutral default, in both modes: vLLM applies the model's penalties to greedy requests too. The keys of
generation_config.json that vLLM reads and the run does not apply are named in the report
(`not_applied`), as are the keys transformers' `generate` would apply and vLLM ignores.

Stop tokens: every eos id of config.json,
generation_config.json and the tokenizer (vLLM stops on the tokenizer's eos and adds the generation
config's eos ids to the stop ids).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflash_convert.errors import DFlashError
from dflash_convert.io.reading import read_json
from dflash_convert.validate.options import FIELDS, PENALTY_FIELDS, ValidateOptions, check_value  # noqa: F401
from dflash_convert.validate.report import SamplingUsed

GENERATION_CONFIG = "generation_config.json"
# vLLM's defaults for a chat request that sets none of these, where the model's generation config is silent
VLLM_DEFAULTS: dict[str, float | int] = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                                         "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
# generation_config.json keys vLLM 0.33 reads (ModelConfig.get_diff_sampling_param) that this run does not apply
VLLM_READS_NOT_APPLIED = {"max_new_tokens": "vLLM's default max_tokens of a request; this run decodes "
                                            "--max-new-tokens",
                          "skip_special_tokens": "detokenization only; acceptance is counted on token ids"}
# keys transformers' generate applies from generation_config.json and vLLM ignores (so does this run)
TRANSFORMERS_ONLY = ("no_repeat_ngram_size", "encoder_repetition_penalty", "bad_words_ids", "min_new_tokens",
                     "min_length", "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "typical_p",
                     "epsilon_cutoff", "eta_cutoff", "forced_bos_token_id", "forced_eos_token_id")
GREEDY_BELOW = 1e-5  # vLLM samples greedily below this temperature


def generation_config(target_dir: Path | None) -> tuple[dict[str, Any], str | None]:
    """(the target's generation_config.json, its path), or ({}, None) when it ships none."""
    if target_dir is None or not (target_dir / GENERATION_CONFIG).exists():
        return {}, None
    path = target_dir / GENERATION_CONFIG
    return read_json(path), str(path)


def resolve_sampling(opts: ValidateOptions, gen: dict[str, Any], gen_path: str | None) -> SamplingUsed:
    """The sampling parameters of the run and where each came from."""
    given = {name: getattr(opts, name) for name in FIELDS}
    values: dict[str, float | int] = {}
    sources: dict[str, str] = {}
    for name in FIELDS:
        flag = "--" + name.replace("_", "-")
        if given[name] is not None:
            values[name], sources[name] = check_value(name, given[name]), flag
        elif name == "temperature" and opts.sampling == "greedy":
            values[name], sources[name] = 0.0, "--sampling greedy"
        elif opts.sampling == "auto" and gen.get(name) is not None:
            values[name], sources[name] = check_value(name, gen[name], file=gen_path), GENERATION_CONFIG
        else:
            values[name], sources[name] = VLLM_DEFAULTS[name], "vLLM default"
    for name in PENALTY_FIELDS:  # in both modes: vLLM applies the model's penalties to greedy requests too
        if getattr(opts, name) is not None:
            values[name], sources[name] = check_value(name, getattr(opts, name)), "--" + name.replace("_", "-")
        elif gen.get(name) is not None:
            values[name], sources[name] = check_value(name, gen[name], file=gen_path), GENERATION_CONFIG
        else:
            values[name], sources[name] = VLLM_DEFAULTS[name], "vLLM default"
    if values["temperature"] < GREEDY_BELOW:
        values["temperature"] = 0.0
    not_applied = {k: f"{gen[k]!r}: {why}" for k, why in VLLM_READS_NOT_APPLIED.items() if gen.get(k) is not None}
    not_applied |= {k: f"{gen[k]!r}: transformers' generate applies it, vLLM ignores it (so does this run)"
                    for k in TRANSFORMERS_ONLY if gen.get(k) not in (None, [], {})}
    return SamplingUsed(mode=opts.sampling, sources=sources, not_applied=not_applied, **values)


def runtime_sampling(used: SamplingUsed, seed: int | None = None):
    """The runtime's Sampling (dflash_runtime.Sampling) of the resolved sampling and the run's seed."""
    from dflash_runtime import Penalties, Sampling

    return Sampling(temperature=used.temperature, top_k=used.top_k, top_p=used.top_p, min_p=used.min_p,
                    penalties=Penalties(repetition=used.repetition_penalty, presence=used.presence_penalty,
                                        frequency=used.frequency_penalty),
                    stop_token_ids=tuple(used.stop_token_ids), seed=seed)


def _ids(value: Any, name: str, file: str) -> list[int]:
    """An eos_token_id field (an id or a list of ids) as a list."""
    items = value if isinstance(value, list) else [value]
    if not all(type(i) is int and i >= 0 for i in items):
        raise DFlashError(f"field `{name}` must be a token id or a list of token ids, got {value!r}", file=file)
    return list(items)


def stop_token_ids(config_eos: tuple[int, ...], gen: dict[str, Any], gen_path: str | None,
                   tokenizer) -> dict[str, list[int]]:
    """Every eos id the run stops on, by where it was found (config.json, generation_config.json, tokenizer)."""
    found: dict[str, list[int]] = {}
    if config_eos:
        found["config.json"] = list(config_eos)
    if gen.get("eos_token_id") is not None:
        found[GENERATION_CONFIG] = _ids(gen["eos_token_id"], "eos_token_id", gen_path or GENERATION_CONFIG)
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if isinstance(eos, int):
        found["tokenizer"] = [eos]
    return found
