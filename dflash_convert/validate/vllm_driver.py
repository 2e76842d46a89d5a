"""Runs a target / DFlash draft pair in real vLLM and prints what it measured, as one JSON object.

Run by file path with the interpreter of the environment where vLLM is installed (`validate --engine
vllm --engine-python PATH`): it imports only the standard library and vLLM, never dflash_convert.
One JSON request on stdin:

    {"target": DIR, "prompts": [[ids], ...], "max_tokens": N, "stop_token_ids": [...], "engine_args": {...},
     "drafts": [{"draft": DIR, "num_speculative_tokens": K, "mixed_layer_types": bool}, ...]}

One JSON object on the original stdout (everything else the engine prints goes to stderr):

    {"vllm_version": V, "drafts": [RUN or ERROR, ...], "target_only": RUN}
    RUN = {"outputs": [[ids]], "engine_config": {...}, "num_drafts": ..., "num_draft_tokens": ..., "num_accepted_tokens": ...,
           "num_accepted_tokens_per_pos": [...]}          ERROR = {"error": MESSAGE, "cannot_run": bool}

One engine at a time (several drafts are served one after the other against the same target: the
tests batch their cases so that vLLM is imported once).

Greedy (temperature 0); token-id prompts with no tokenizer (the target need not ship one). The caller
sets VLLM_CPU_KVCACHE_SPACE (its KV-cache size) and VLLM_ENABLE_V1_MULTIPROCESSING=0 in the
environment, bounds the time and kills the process group on Ctrl-C.
"""

import os
import sys

# run by file path, this folder would come first on sys.path, and its inspect.py would shadow the standard one
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import gc  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402

COUNTERS = {  # vLLM's spec-decode counters -> our names
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def counters(llm) -> dict:
    """The spec-decode counters so far, summed over their label sets (one engine here)."""
    out = {name: 0 for name in COUNTERS.values()}
    per_pos: list = []
    for metric in llm.get_metrics():
        if metric.name in COUNTERS:
            out[COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == PER_POSITION:
            values = list(metric.values)
            n = max(len(values), len(per_pos))
            per_pos = [a + b for a, b in zip(per_pos + [0] * (n - len(per_pos)), values + [0] * (n - len(values)))]
    out["num_accepted_tokens_per_pos"] = per_pos
    return out


def since(before: dict, after: dict) -> dict:
    """Counters of one run: the process-wide registry may carry counts of an engine made before."""
    out = {k: after[k] - before[k] for k in COUNTERS.values()}
    old = before["num_accepted_tokens_per_pos"]
    out["num_accepted_tokens_per_pos"] = [a - (old[i] if i < len(old) else 0)
                                          for i, a in enumerate(after["num_accepted_tokens_per_pos"])]
    return out


def generate(request: dict, draft: dict | None) -> dict:
    """Greedy outputs of the prompts, target-only (draft None) or with the draft speculating."""
    from vllm import LLM, SamplingParams

    kwargs = dict(model=request["target"], skip_tokenizer_init=True, disable_log_stats=False, seed=0)
    if no_triton_hybrid(request):  # prefix caching puts linear-attention state in vLLM's "align" mode: Triton only
        kwargs["enable_prefix_caching"] = False
    kwargs.update(request.get("engine_args") or {})
    if draft is not None:
        kwargs["speculative_config"] = {"method": "dflash", "model": draft["draft"],
                                        "num_speculative_tokens": draft["num_speculative_tokens"]}
    llm = LLM(**kwargs)
    before = counters(llm)
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"],
                            stop_token_ids=request.get("stop_token_ids") or None, detokenize=False)
    results = llm.generate([{"prompt_token_ids": p} for p in request["prompts"]], params, use_tqdm=False)
    run = {"outputs": [list(r.outputs[0].token_ids) for r in results], "engine_config": engine_config(llm)}
    if draft is not None:
        run.update(since(before, counters(llm)))
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None:  # frees the engine's KV cache before the next engine is made
        core.shutdown()
    del llm
    gc.collect()
    return run


def engine_config(llm) -> dict:
    """What the engine was built with, of the settings --engine-args most often carries."""
    engine = llm.llm_engine
    model, parallel = engine.model_config, engine.vllm_config.parallel_config
    return {"dtype": str(model.dtype).removeprefix("torch."), "max_model_len": model.max_model_len,
            "enforce_eager": model.enforce_eager,
            "enable_prefix_caching": bool(engine.vllm_config.cache_config.enable_prefix_caching), "tensor_parallel_size": parallel.tensor_parallel_size,
            "pipeline_parallel_size": parallel.pipeline_parallel_size,
            "distributed_executor_backend": str(parallel.distributed_executor_backend)}


def error(exc: BaseException) -> dict:
    """One line for the caller; the traceback stays on stderr."""
    import traceback

    traceback.print_exc()
    return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500], "cannot_run": False}


def installed_version() -> str | None:
    """vLLM's version without importing it (its distribution is vllm, or vllm-cpu and the like)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def no_triton_hybrid(request: dict) -> bool:
    """A target with linear-attention (Gated DeltaNet) layers, on a vLLM without Triton (CPU). Its
    linear-attention layers run there; with a draft and prefix caching on, vLLM copies their state between
    steps with a Triton kernel (mamba_cache_mode "align"), which fails: prefix caching goes off instead."""
    if importlib.util.find_spec("triton") is not None:
        return False
    try:
        with open(os.path.join(request["target"], "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False  # vLLM reports it
    for part in (config, config.get("text_config") or {}):
        if "linear_attention" in (part.get("layer_types") or []) or "linear_conv_kernel_dim" in part:
            return True
    return False


def cannot_run(draft: dict, request: dict | None = None) -> dict | None:
    if request is not None and (request.get("engine_args") or {}).get("enable_prefix_caching") and \
            no_triton_hybrid(request):
        return {"error": "the target has linear-attention layers, whose state vLLM keeps for prefix caching with "
                "a Triton kernel while a draft speculates: cannot run here (no Triton, e.g. vLLM on CPU); leave "
                "enable_prefix_caching out of --engine-args (it is then off)", "cannot_run": True}
    if draft.get("mixed_layer_types") and importlib.util.find_spec("triton") is None:
        return {"error": "the draft mixes sliding and full attention layers, which vLLM serves only with its V2 "
                "model runner, which needs Triton: cannot run here (no Triton, e.g. vLLM on CPU)", "cannot_run": True}
    return None


def serve(request: dict, draft: dict) -> dict:
    try:
        return cannot_run(draft, request) or generate(request, draft)
    except Exception as exc:
        return error(exc)


def main() -> int:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the engine's own prints go to stderr: stdout carries the one JSON object
    sys.stdout = sys.stderr
    try:
        request = json.load(sys.stdin)
        result = {"vllm_version": installed_version()}
        if all(cannot_run(d, request) for d in request["drafts"]):  # nothing to serve: vLLM is not even imported
            result["drafts"] = [cannot_run(d, request) for d in request["drafts"]]
        else:
            import vllm

            result["vllm_version"] = vllm.__version__
            result["drafts"] = [serve(request, d) for d in request["drafts"]]
            result["target_only"] = generate(request, None)
    except Exception as exc:
        result = error(exc)
    out.write(json.dumps(result) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
