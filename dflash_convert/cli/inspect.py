"""`inspect`: the format, what each engine applies, the tensors and every problem found."""

from typing import Annotated, Optional

import typer

from dflash_convert.cli._output import Output
from dflash_convert.cli._params import (
    AllowPickle, EngineOpt, Json, Quiet, Revision, Source, Token, examples, flag, token_length, value
)

EXAMPLES = examples(
    "dflash-convert inspect ./draft",
    "dflash-convert inspect org/draft --revision v1 --json",
    "dflash-convert inspect ./draft --scan --engine sglang",
    "dflash-convert inspect ./draft --engine vllm --num-speculative-tokens 7 --max-num-seqs 256 "
    "--max-num-batched-tokens 2048",
    "dflash-convert inspect ./draft --engine vllm --num-speculative-tokens 15 --max-num-seqs 64 --gpu H100-SXM "
    "--target Qwen/Qwen3-8B")


def inspect(
    path: Source,
    scan: Annotated[bool, flag("--scan", help="Also read tensor values (NaN/Inf, all-zero); imports torch.")] = False,
    allow_pickle: AllowPickle = False,
    revision: Revision = None,
    token: Token = None,
    engine: EngineOpt = None,
    num_speculative_tokens: Annotated[Optional[int], typer.Option(
        "--num-speculative-tokens", metavar="K", help="With --engine vllm|sglang: check a launch drafting K tokens "
        "per step (vLLM's name; the block is K+1) against the engine's rules.")] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option(
        "--max-num-seqs", metavar="S", help="vLLM's max_num_seqs of that launch.")] = None,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option(
        "--max-num-batched-tokens", metavar="T", help="vLLM's max_num_batched_tokens of that launch.")] = None,
    draft_window_size: Annotated[Optional[int], typer.Option(
        "--draft-window-size", metavar="W", help="SGLang's --speculative-draft-window-size of that launch.")] = None,
    gpu: Annotated[Optional[str], typer.Option(
        "--gpu", metavar="NAME", help="With --num-speculative-tokens and --max-num-seqs: say whether that launch's "
        "full batch, S x (K+1) verify tokens, makes the target compute-bound on this GPU (predict's table).")] = None,
    target: Annotated[Optional[str], typer.Option(
        "--target", metavar="T", help="With --gpu: the target (directory, config.json or Hub id; only config.json "
        "is read) for its own figure; without it, a dense bf16 target's.")] = None,
    max_model_len: Annotated[Optional[str], typer.Option(
        "--max-model-len", metavar="TOKENS", callback=token_length, help="The context a deployment serves (vLLM's "
        "max_model_len; 32768 or 32k, k = 1024): warn where it passes the positions the draft was trained for.")] = None,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Show the format, what each engine will apply, the tensors, and every problem found (exit 3 if any fails)."""
    from dflash_convert.errors import UsageError, ValidationFailed
    from dflash_convert.validate.inspect import inspect_checkpoint

    out = Output(as_json, quiet)
    serving = _serving(value(engine), num_speculative_tokens, max_num_seqs, max_num_batched_tokens, draft_window_size)
    if gpu is not None:
        from dflash_convert.predict.gpus import gpu as known_gpu

        # an unknown name: the usage error listing the known ones (inspect has no --gpu-spec), before anything is read
        known_gpu(gpu, "--gpu", None)
        if serving is None or max_num_seqs is None:
            raise UsageError("--gpu checks a launch's full batch: give --engine, --num-speculative-tokens and "
                             "--max-num-seqs with it")
    elif target is not None:
        raise UsageError("--target goes with --gpu (the verify's compute bound on that GPU)")
    target_config = out.local(target, token=token, config_only=True)[0] if target is not None else None
    local, sha = out.local(path, revision=revision, token=token, allow_pickle=allow_pickle)
    report = inspect_checkpoint(local, scan=scan, allow_pickle=allow_pickle, engine=value(engine), serving=serving,
                                gpu=gpu, target_config=target_config,
                                max_model_len=max_model_len)
    report.revision = sha
    out.result(report.model_dump(mode="json"), render=report.render)
    if not report.ok:
        raise typer.Exit(ValidationFailed.exit_code)


def _serving(engine: str | None, k: int | None, seqs: int | None, budget: int | None, window: int | None):
    """The launch settings to check, or None; a usage error where they cannot be checked as given."""
    from dflash_convert.errors import UsageError
    from dflash_convert.format.serving import ServingConfig

    if k is None:
        if any(v is not None for v in (seqs, budget, window)):
            raise UsageError("--max-num-seqs, --max-num-batched-tokens and --draft-window-size describe a launch: "
                             "give --num-speculative-tokens with them")
        return None
    if engine not in ("vllm", "sglang"):
        raise UsageError("--num-speculative-tokens checks a launch of one engine: give --engine vllm or sglang")
    if any(v is not None and v < 1 for v in (k, seqs, budget, window)):
        raise UsageError("--num-speculative-tokens, --max-num-seqs, --max-num-batched-tokens and "
                         "--draft-window-size must be at least 1")
    return ServingConfig(engine, k, seqs, budget, window)
