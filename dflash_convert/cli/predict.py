"""`predict`: will DFlash pay off on a GPU? Plain vs speculative tokens/s per K and concurrency, from configs."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dflash_convert.cli._output import Output
from dflash_convert.cli._params import Json, Quiet, Token, choices, csv, examples, value

EXAMPLES = examples(
    "dflash-convert predict --target Qwen/Qwen3-8B --draft z-lab/Qwen3-8B-DFlash-b16 --gpu H100-SXM,H200 "
    "--tau 7=4.1,15=5.6",
    "dflash-convert predict --target ./target --draft ./draft --gpu A800 --from-report report.json "
    "--concurrency 1,8,64 --input-len 2048 --output-len 512 --engine sglang --json")

ServingEngine = choices("ServingEngine", ("vllm", "sglang"))


def predict(
    target: Annotated[str, typer.Option("--target", metavar="T", help="The target: a directory, its config.json or "
                                        "a Hub id (only config.json is read).")],
    draft: Annotated[str, typer.Option("--draft", metavar="D", help="The draft, as --target.")],
    # --gpu, --gpu-spec, --tau and --concurrency may be repeated (--gpu H100 --gpu H200): each adds to the list, as
    # one comma-separated value would; a second value must not silently replace the first
    gpu: Annotated[Optional[list[str]], typer.Option("--gpu", metavar="NAME[,NAME...]", help="GPUs from the table "
                                                     "(an unknown name lists the known ones).")] = None,
    gpu_spec: Annotated[Optional[list[str]], typer.Option("--gpu-spec", metavar="SPEC", help="Another GPU: "
                        "name=X,bw=GB/s,bf16=TFLOP/s[,fp8=TFLOP/s][,mem=GB][,link=GB/s]; repeat it for more.")] = None,
    tau: Annotated[Optional[list[str]], typer.Option("--tau", metavar="K=TAU[,K=TAU...]", help="tau (tokens per "
                                                     "step) per num_speculative_tokens K.")] = None,
    from_report: Annotated[Optional[Path], typer.Option("--from-report", metavar="REPORT", help="tau per K and the "
                           "per-position rates from a `validate --json` report (--tau adds or overrides K).")] = None,
    concurrency: Annotated[Optional[list[str]], typer.Option("--concurrency", metavar="N[,N...]", help="Concurrent "
                           "sequences (batch sizes); default 1.")] = None,
    # token counts as contexts are spoken of (2048 or 2k, 64k; k = 1024), as --max-model-len and --context-lengths
    input_len: Annotated[str, typer.Option("--input-len", metavar="L", callback=lambda t: _tokens(t, "--input-len"),
                                           help="Prompt tokens (8192 or 8k, k = 1024).")] = "1024",
    output_len: Annotated[str, typer.Option("--output-len", metavar="O", callback=lambda t: _tokens(t, "--output-len"),
                                            help="Generated tokens (the mean context is L + O/2).")] = "512",
    engine: Annotated[ServingEngine, typer.Option("--engine", help="The serving engine whose calibrated constants "
                      "apply.")] = ServingEngine("vllm"),
    tp: Annotated[int, typer.Option("--tp", metavar="N", help="Tensor-parallel GPUs.")] = 1,
    revision: Annotated[Optional[str], typer.Option("--revision", help="The draft's Hub revision: branch, tag or "
                        "commit sha (default: main); the target is read at main, as validate and inspect read "
                        "it.")] = None,
    token: Token = None,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Predict plain vs speculative tokens/s per GPU, K and concurrency from the configs alone (no GPU, no
    weights), recommend a K per concurrency or no speculation, with the model's error band."""
    from dflash_convert.errors import UsageError
    from dflash_convert.io.reading import read_json
    from dflash_convert.predict.gpus import gpu as known_gpu, gpu_from_spec
    from dflash_convert.predict.prediction import (check_taus_within_block, load_inputs, parse_taus, predict as run,
                                                   taus_from_report)

    out = Output(as_json, quiet)
    gpu, tau, concurrency = (",".join(v) if v else None for v in (gpu, tau, concurrency))
    gpus, typed = [], {}
    for name in (n for n in (gpu or "").split(",") if n.strip()):
        g = known_gpu(name)
        if g.name in typed:  # H100 and h100: one GPU, whose rows would show twice
            raise UsageError(f"--gpu {gpu}: {typed[g.name]} and {name} are both {g.name}")
        gpus.append(g)
        typed[g.name] = name
    for text in gpu_spec or []:
        spec = gpu_from_spec(text)
        if spec.name in typed:
            where = f"--gpu's {typed[spec.name]}" if typed[spec.name] is not None else "another --gpu-spec's"
            raise UsageError(f"--gpu-spec {text}: name {spec.name} is {where} too (name it otherwise)")
        gpus.append(spec)
        typed[spec.name] = None
    if not gpus:
        raise UsageError("give --gpu NAME[,NAME...] or --gpu-spec")
    given = parse_taus(tau) if tau else {}  # a bad flag (exit 2) before any file is read
    try:
        batches = csv(int)(concurrency) or [1]
    except typer.BadParameter as exc:
        raise UsageError(f"--concurrency {concurrency}: {exc}") from None
    taus, source, fields = dict(given), "--tau", {}
    if from_report is not None:
        taus, source, fields = taus_from_report(read_json(from_report, allow_bom=True), str(from_report))
        taus = {**taus, **given}
        if given:
            source = f"{source}; --tau at K {', '.join(map(str, sorted(given)))}"
    if not taus:
        raise UsageError("no tau: give --tau K=TAU[,K=TAU...] or --from-report REPORT")
    t_path, _ = out.local(target, token=token, config_only=True)  # --revision is the draft's, as validate's
    d_path, _ = out.local(draft, revision=revision, token=token, config_only=True)
    _refuse_a_draft_as_target(target, t_path, draft, d_path)
    # the launch line serves the model directory (a Hub id as given): vLLM and SGLang take no config.json file
    inputs = load_inputs(t_path, d_path, _served(target, t_path), _served(draft, d_path))
    if given:
        check_taus_within_block(given, inputs.draft, tau)
    if from_report is not None:
        check_taus_within_block({k: t for k, t in taus.items() if k not in given}, inputs.draft, str(from_report),
                                fields=fields)
    report = run(inputs, gpus, taus, concurrency=batches, input_len=input_len,
                 output_len=output_len, engine=value(engine), tp=tp, tau_source=source)
    out.result(report.model_dump(mode="json"), render=report.render)


def _tokens(text: str, flag: str) -> int:
    """A length flag's token count: 8192 or 8k (k = 1024); 0 allowed (its bounds are the prediction's)."""
    from dflash_convert.cli._params import token_count
    from dflash_convert.errors import UsageError

    try:
        return token_count(str(text).strip())
    except ValueError:
        raise UsageError(f"{flag} {text}: expected a token count (8192, 8k; k = 1024)") from None


def _refuse_a_draft_as_target(target: str, t_path: Path, draft: str, d_path: Path) -> None:
    """A DFlash draft's config given as --target is a usage error (exit 2) saying so, not a missing target field:
    the two given the other way round, or a draft where the target model belongs."""
    from dflash_convert.cli._params import is_draft, refuse_swapped
    from dflash_convert.errors import UsageError

    if not is_draft(t_path):
        return
    if not is_draft(d_path):
        refuse_swapped(f"--target {target} is a DFlash draft and --draft {draft} is not",
                       f"write --target {draft} --draft {target}")
    raise UsageError(f"--target {target} is a DFlash draft's config, not a target model's: give the model the draft "
                     "was trained for (its verifier) as --target")


def _served(given: str, local: Path) -> str:
    """What a launch line names: the directory of a config.json given as a file, else what the user gave."""
    return str(Path(given).parent) if Path(given).is_file() and Path(local).is_file() else given
