"""Runs a target / DFlash draft pair in real vLLM and prints what it measured, as one JSON object.

Run by file path with the interpreter of the environment where vLLM is installed (`validate --engine
vllm --engine-python PATH`): it imports only the standard library and vLLM, never dflash_convert.
One JSON request on stdin:

    {"target": DIR, "prompts": [[ids], ...], "max_tokens": N, "stop_token_ids": [...], "engine_args": {...},
     "sampling": {"temperature": T, "top_k": ..., "seed": S, ...},   (absent or temperature 0: greedy)
     "drafts": [{"draft": DIR, "num_speculative_tokens": K, "mixed_layer_types": bool}, ...]}

One JSON object on the original stdout (everything else the engine prints goes to stderr):

    {"vllm_version": V, "drafts": [RUN or ERROR, ...], "target_only": RUN}    (no target_only when sampled)
    greedy, each RUN (target-only and speculative) also has "top_logits": per prompt, per generated token, {token
    id: logit} of the TIE_CANDIDATES largest processed logits (after penalties) and of the token taken. The
    speculative run's are its verify rows' (vLLM's rejection sampler reports the logits of the rows its tokens
    came from), the target-only run's its one-token decode's: where the two outputs part, the caller measures
    how far vLLM's own two computations of the target moved the two tokens (a near-tie, or not)
    RUN = {"outputs": [[ids]], "engine_config": {...}, "num_drafts": ..., "num_draft_tokens": ..., "num_accepted_tokens": ...,
           "num_accepted_tokens_per_pos": [...], "steps": [[accepted per verify step] or None per prompt] or None}
    ERROR = {"error": MESSAGE, "cannot_run": bool}
    "steps" comes from vLLM's per-request statistics (`per_request_spec_decode_metrics="detailed"`, vLLM 0.32 and
    later; None on a vLLM without them), by which the caller compares the counts step by step.

One engine at a time (several drafts are served one after the other against the same target: the
tests batch their cases so that vLLM is imported once).

Greedy, or sampled with the request's SamplingParams fields and prompt i seeded `seed + i` (vLLM's per-request
generator). Before a sampled run the rejection sampler is probed (`broken_sampler`): a build whose sampled
speculative decoding computes garbage is answered as "cannot run here", never served. Token-id prompts with no
tokenizer (the target need not ship one). The caller sets VLLM_CPU_KVCACHE_SPACE (its KV-cache size) and
VLLM_ENABLE_V1_MULTIPROCESSING=0 in the environment, bounds the time and kills the process group on Ctrl-C.
With several workers on a CPU build and no VLLM_CPU_OMP_THREADS_BIND given, the driver binds one range of the
allowed cores per worker (`bind_cpu_workers`): without it vLLM stops ("Not enough allowed NUMA nodes").
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
TIE_CANDIDATES = 5  # processed logits per step a greedy target-only run reports (vLLM's logprobs=N)


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
    """Outputs of the prompts, target-only (draft None) or with the draft speculating."""
    from vllm import LLM, SamplingParams

    kwargs = dict(model=request["target"], skip_tokenizer_init=True, disable_log_stats=False, seed=0)
    if no_triton_hybrid(request):  # prefix caching puts linear-attention state in vLLM's "align" mode: Triton only
        kwargs["enable_prefix_caching"] = False
    kwargs.update(request.get("engine_args") or {})
    ties = not sampled(request)
    if ties:  # logprobs as the logits the sampler picked from (penalties applied); the tokens do not change
        kwargs["logprobs_mode"] = "processed_logits"
    if draft is not None:
        kwargs["speculative_config"] = {"method": "dflash", "model": draft["draft"],
                                        "num_speculative_tokens": draft["num_speculative_tokens"]}
        if per_request_metrics():
            kwargs.setdefault("per_request_spec_decode_metrics", "detailed")
    llm = LLM(**kwargs)
    before = counters(llm)
    sampling = dict(request.get("sampling") or {})
    seed = sampling.pop("seed", 0)
    common = dict(max_tokens=request["max_tokens"], stop_token_ids=request.get("stop_token_ids") or None,
                  detokenize=False)
    if sampled(request):  # one generator per request, as a deployment seeding its requests
        params = [SamplingParams(**sampling, seed=seed + i, **common) for i in range(len(request["prompts"]))]
    else:  # greedy, with the run's penalties when it has any
        params = SamplingParams(**{**sampling, "temperature": 0.0}, **common, logprobs=TIE_CANDIDATES if ties else None)
    results = llm.generate([{"prompt_token_ids": p} for p in request["prompts"]], params, use_tqdm=False)
    run = {"outputs": [list(r.outputs[0].token_ids) for r in results], "engine_config": engine_config(llm)}
    if ties:
        run["top_logits"] = [None if r.outputs[0].logprobs is None else
                             [{str(t): float(lp.logprob) for t, lp in step.items()} for step in r.outputs[0].logprobs]
                             for r in results]
    if draft is not None:
        run.update(since(before, counters(llm)))
        run["steps"] = request_steps(results)
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None:  # frees the engine's KV cache before the next engine is made
        core.shutdown()
    del llm
    gc.collect()
    # the engine's shutdown unfroze the heap: freeze what survives (vLLM's and torch's modules) again, so that
    # the next engine's own gc.collect() calls (about eight in building one) do not walk it each time
    gc.freeze()
    return run


def per_request_metrics() -> bool:
    """Whether this vLLM keeps per-request speculative-decoding statistics (0.32 and later)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return any(f.name == "per_request_spec_decode_metrics" for f in dataclasses.fields(EngineArgs))


def request_steps(results) -> list | None:
    """Accepted proposals per verify step of each request, in order (None where vLLM kept none)."""
    steps = []
    for r in results:
        metrics = getattr(r.outputs[0], "spec_decode_metrics", None)
        kept = None if metrics is None else [int(a) for a in metrics.per_step_accepted]
        # the "summary" level (an --engine-args choice) counts steps without listing them
        steps.append(kept if kept is not None and len(kept) == sum(metrics.histogram) else None)
    return steps if any(s is not None for s in steps) else None


def engine_config(llm) -> dict:
    """What the engine was built with, of the settings --engine-args most often carries."""
    engine = llm.llm_engine
    model, parallel = engine.model_config, engine.vllm_config.parallel_config
    return {"dtype": str(model.dtype).removeprefix("torch."), "max_model_len": model.max_model_len,
            "enforce_eager": model.enforce_eager,
            "enable_prefix_caching": bool(engine.vllm_config.cache_config.enable_prefix_caching),
            "tensor_parallel_size": parallel.tensor_parallel_size,
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


def sampled(request: dict) -> bool:
    return float((request.get("sampling") or {}).get("temperature") or 0.0) > 0.0


def cpu_build() -> bool:
    """vLLM's CPU build, told from its distribution without importing vLLM (vllm-cpu, or a +cpu version)."""
    try:
        importlib.metadata.version("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        pass
    return "cpu" in (installed_version() or "")


def unrunnable_parallelism(request: dict) -> str | None:
    """A parallel layout vLLM's CPU build cannot run with a draft, named before vLLM starts."""
    args = request.get("engine_args") or {}
    if not cpu_build():
        return None
    if str(args.get("distributed_executor_backend")) == "ray":
        return ('distributed_executor_backend "ray": vLLM\'s CPU build refuses it ("current platform cpu does not '
                'support ray"): cannot run here; Ray needs vLLM\'s GPU build (multi-node recipe in docs/engines.md)')
    if int(args.get("pipeline_parallel_size") or 1) > 1:
        return (f"pipeline_parallel_size {args['pipeline_parallel_size']} with a draft: vLLM's CPU model runner has "
                "no drafter under pipeline parallelism (\"'CPUModelRunner' object has no attribute 'drafter'\"): "
                "cannot run here; use tensor_parallel_size")
    return None


KNOWN_ENGINE_FAILURES = {  # vLLM's own error for a layout it cannot run -> why, as "cannot run here"
    "object has no attribute 'drafter'": "vLLM has no drafter under this parallel layout (pipeline parallel with a "
                                         "draft): cannot run here",
    "does not support ray": "this vLLM platform does not support the Ray executor: cannot run here",
    "Not enough allowed NUMA nodes": "vLLM found fewer allowed NUMA nodes than workers: cannot run here; set "
                                     "VLLM_CPU_OMP_THREADS_BIND to one core range per worker",
}


def cannot_run(draft: dict, request: dict | None = None) -> dict | None:
    why = unrunnable_parallelism(request) if request is not None else None
    if why:
        return {"error": why, "cannot_run": True}
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


def broken_sampler(sampling: dict) -> str | None:
    """None when vLLM's rejection sampler applies the request's sampling parameters correctly, else one line
    saying what it computed. Calls vLLM's own functions on small known inputs, after registering the platform's
    kernel overrides as each worker does at start (on a CPU build without Triton, C++ fallbacks):
    - `expand_batch_to_tokens` spreads each request's temperature, top-k and top-p over its draft positions.
      vLLM 0.32's CPU fallback writes into an int64 copy of the output and never copies back: temperatures
      come out garbage (tau 1.2 instead of 14.6 at temperature 1) and top-k indexes out of bounds.
    - with top-k on, `apply_top_k_top_p` must take a step with no draft tokens (0 rows), as the sampler passes
      it; vLLM 0.32 on CPU raises there (max() of an empty tensor).
    A probe that cannot run is also answered: then nothing says the sampler works."""
    try:
        import torch
        from vllm.platforms import current_platform
        from vllm.v1.sample import rejection_sampler as rs

        current_platform.register_triton_kernel_overrides()
        device = current_platform.device_type
        cu = torch.tensor([2, 3], dtype=torch.int32, device=device)  # request 1: 2 draft positions, request 2: 1
        wrong = []
        for name, values, dtype, kwargs in (("temperature", [0.5, 2.0], torch.float32, {"replace_from": 0,
                                                                                          "replace_to": 1}),
                                            ("top_k", [5, 7], torch.int32, {}), ("top_p", [0.5, 0.9], torch.float32,
                                                                                {})):
            x = torch.tensor(values, dtype=dtype, device=device)
            got = rs.expand_batch_to_tokens(x, cu, 3, **kwargs).cpu()
            want = torch.tensor([values[0], values[0], values[1]], dtype=dtype)
            if not torch.equal(got, want):
                wrong.append(f"expand_batch_to_tokens: {name} {values} expanded to "
                             f"{[round(v, 4) for v in got.tolist()]}, not {[values[0], values[0], values[1]]}")
        if int(sampling.get("top_k") or 0) > 0:
            top_p = None if float(sampling.get("top_p", 1.0)) >= 1 else torch.zeros(0, device=device)
            try:
                rs.apply_top_k_top_p(torch.zeros(0, 8, device=device), torch.zeros(0, dtype=torch.int32,
                                                                                     device=device), top_p)
            except Exception as exc:
                wrong.append(f"apply_top_k_top_p with top-k on a step with no draft tokens raises "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    except Exception as exc:
        return f"its rejection sampler could not be probed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
    if wrong:
        return "its rejection sampler is broken: " + "; ".join(wrong)
    return None


def bind_cpu_workers(engine_args: dict, environ=os.environ) -> None:
    """One core range per worker in VLLM_CPU_OMP_THREADS_BIND ("0-3|4-7"), where a CPU build runs several
    workers and the user bound none: vLLM's automatic binding wants one NUMA node per worker."""
    workers = int(engine_args.get("tensor_parallel_size") or 1) * int(engine_args.get("pipeline_parallel_size") or 1)
    if workers < 2 or environ.get("VLLM_CPU_OMP_THREADS_BIND") or not cpu_build():
        return
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    per = max(len(cores) // workers, 1)
    ranges = []
    for w in range(workers):
        mine = cores[(w * per) % len(cores):][:per]
        ranges.append(str(mine[0]) if len(mine) == 1 else f"{mine[0]}-{mine[-1]}")
    environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(ranges)


def known_failure(run: dict) -> dict:
    """An engine error vLLM raises for a layout it cannot run: 'cannot run here', not a verdict."""
    for needle, why in KNOWN_ENGINE_FAILURES.items():
        if "error" in run and needle in run["error"]:
            return {"error": f"{why} ({run['error'][:200]})", "cannot_run": True}
    return run


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
            bind_cpu_workers(request.get("engine_args") or {})
            import vllm

            # the imports' objects never die: out of the collector's sight, each gc.collect() vLLM makes while
            # building an engine takes milliseconds instead of about a second on a 2-core machine
            gc.freeze()
            result["vllm_version"] = vllm.__version__
            broken = broken_sampler(request["sampling"]) if sampled(request) else None
            if broken:
                result["drafts"] = [{"error": f"vLLM {vllm.__version__}: {broken}: sampled speculative decoding "
                                     "cannot be compared here (compare with --sampling greedy, or a vLLM build "
                                     "whose sampler works)", "cannot_run": True, "broken_sampler": True}
                                    for _ in request["drafts"]]
            else:
                result["drafts"] = [known_failure(serve(request, d)) for d in request["drafts"]]
                if not sampled(request):  # sampled outputs differ run to run: nothing to compare them with
                    result["target_only"] = generate(request, None)
    except Exception as exc:
        result = known_failure(error(exc))
    out.write(json.dumps(result) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
