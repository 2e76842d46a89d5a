"""What a prediction is asked: `predict`'s options, one typed object, each option declared once (type, bounds,
help, metavar, how its text is read); the CLI's flags are generated from it (dflash_convert.cli._options), and
`run` is the library's entry taking it.

A flag's text is read here, so that a library caller and the command line meet the same rules and words:
`--input-len 64k` (k = 1024), `--tau 7=4.1,15=5.6`, `--gpu H100,h200`, `--concurrency 1,8`; the list flags may be
given more than once, each time adding its items (`--gpu H100 --gpu H200`). A value refused is one line naming
the flag (exit 2), raised when the options are made, before any file is read."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from dflash_convert.errors import UsageError
from dflash_convert.flags import CommandOptions, Flag, token_count
from dflash_convert.predict.gpus import GPU, gpu, gpu_from_spec, variant_note
from dflash_convert.predict.prediction import (MAX_LEN, MAX_TP, MIN_OUTPUT_LEN, PredictionReport,
                                               check_taus_within_block, load_inputs, parse_taus, predict,
                                               report_provenance, taus_from_report)

ServingEngine = Literal["vllm", "sglang"]  # the engines the calibration has constants for
LIST = list[str]  # a list flag's texts, each time it was given


def _text(value: Any) -> str | None:
    """A list flag's texts as one comma-separated value (`--gpu H100 --gpu H200` is `--gpu H100,H200`)."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return ",".join(value) if value else None
    return value if isinstance(value, str) else None


def _tokens_of(text: str, flag: str) -> int:
    """A length flag's token count (flags.token_count: 8192 or 8k, k = 1024), a bad one named by its flag."""
    try:
        return token_count(text.strip())
    except ValueError:
        raise UsageError(f"{flag} {text}: expected a token count (8192, 8k; k = 1024)") from None


class PredictOptions(CommandOptions):
    """Options of `predict`. `target` and `draft` are what the user gave until the CLI has them at hand (a Hub
    id is fetched, config.json only); then the local directory or file, and `target_name` / `draft_name` what
    the launch line serves."""

    target: Annotated[str | Path, Flag("--target", type=str, metavar="T", reads=True)] = Field(
        description="The target: a directory, its config.json or a Hub id (only config.json is read).")
    draft: Annotated[str | Path, Flag("--draft", type=str, metavar="D", reads=True)] = Field(
        description="The draft, as --target.")
    target_name: Annotated[str | None, Flag(None, why="the CLI: the --target a launch line serves (a Hub id as "
                                                      "given)")] = Field(None, description="default: target")
    draft_name: Annotated[str | None, Flag(None, why="the CLI: the --draft a launch line serves")] = Field(
        None, description="default: draft")
    # --gpu, --gpu-spec, --tau and --concurrency may be repeated: each adds to the list, as one comma-separated value
    # would; a second value must not silently replace the first
    gpu: Annotated[list[str] | None, Flag("--gpu", type=LIST, metavar="NAME[,NAME...]")] = Field(
        None, description="GPUs from the table (an unknown name lists the known ones).")
    gpu_spec: Annotated[list[str] | None, Flag("--gpu-spec", type=LIST, metavar="SPEC")] = Field(
        None, description="Another GPU: name=X,bw=GB/s,bf16=TFLOP/s[,fp8=TFLOP/s][,mem=GB][,link=GB/s]; repeat it "
        "for more.")
    tau: Annotated[dict[int, float] | None, Flag("--tau", type=LIST, metavar="K=TAU[,K=TAU...]")] = Field(
        None, description="tau (tokens per step) per num_speculative_tokens K.")
    from_report: Annotated[Path | None, Flag("--from-report", metavar="REPORT", reads=True)] = Field(
        None, description="tau per K and the per-position rates from a `validate --json` report (--tau adds or "
        "overrides K).")
    concurrency: Annotated[list[int], Flag("--concurrency", type=LIST, metavar="N[,N...]")] = Field(
        default_factory=lambda: [1], description="Concurrent sequences (batch sizes); default 1.")
    # token counts as contexts are spoken of (2048 or 2k, 64k; k = 1024), as --max-model-len and --context-lengths
    input_len: Annotated[int, Flag("--input-len", type=str, metavar="L")] = Field(
        1024, description="Prompt tokens (8192 or 8k, k = 1024).")
    output_len: Annotated[int, Flag("--output-len", type=str, metavar="O")] = Field(
        512, description=f"Generated tokens per request, at least {MIN_OUTPUT_LEN} (the first comes from the "
        "prefill): the mean context is L + O/2, a closed loop admits a new request every O tokens a sequence commits "
        "(the admission cost), and a step commits at most O - 1 tokens per sequence.")
    engine: Annotated[ServingEngine, Flag("--engine")] = Field(
        "vllm", description="The serving engine whose calibrated constants apply.")
    tp: Annotated[int, Flag("--tp", metavar="N")] = Field(1, ge=1, le=MAX_TP, description="Tensor-parallel GPUs.")

    @field_validator("gpu", mode="before")
    @classmethod
    def _known_gpus(cls, value: Any) -> Any:
        """The names as typed (the report's are the table's); an unknown one lists the known ones, two spellings of
        one part are refused (its rows would show twice)."""
        text = _text(value)
        if text is None:
            return value
        names, typed = [n for n in text.split(",") if n.strip()], {}
        for name in names:
            part = gpu(name).name
            if part in typed:
                raise UsageError(f"--gpu {text}: {typed[part]} and {name} are both {part}")
            typed[part] = name
        return names

    @field_validator("gpu_spec")
    @classmethod
    def _specs(cls, specs: list[str] | None, info: Any) -> list[str] | None:
        """Each one a GPU (one per --gpu-spec: its text holds commas); a name taken by --gpu or another spec is
        refused."""
        typed = {gpu(n).name: n for n in info.data.get("gpu") or []}
        for text in specs or []:
            name = gpu_from_spec(text).name
            if name in typed:
                where = f"--gpu's {typed[name]}" if typed[name] is not None else "another --gpu-spec's"
                raise UsageError(f"--gpu-spec {text}: name {name} is {where} too (name it otherwise)")
            typed[name] = None
        return specs

    @field_validator("tau", mode="before")
    @classmethod
    def _taus(cls, value: Any) -> Any:
        text = _text(value)
        if text is not None:  # K=TAU[,K=TAU...]: a bad one (exit 2) before any file is read
            return parse_taus(text)
        if isinstance(value, dict):  # a library caller's {K: tau}: the same rule, said of the same text
            return parse_taus(",".join(f"{k}={t}" for k, t in value.items())) if value else None
        return value

    @field_validator("concurrency", mode="before")
    @classmethod
    def _batches(cls, value: Any) -> Any:
        """Integers; their bounds and repeats are the prediction's (check_request)."""
        text = _text(value)
        if text is None:
            return [1] if value is None or value == [] else value
        try:
            return [int(x) for x in text.replace(" ", "").strip("[]").split(",") if x != ""] or [1]
        except ValueError:
            raise UsageError(f"--concurrency {text}: expected comma-separated int values, got {text!r}") from None

    @field_validator("input_len", "output_len", mode="before")
    @classmethod
    def _tokens(cls, value: Any, info: Any) -> Any:
        flag = "--" + info.field_name.replace("_", "-")
        count = _tokens_of(value, flag) if isinstance(value, str) else value
        least = MIN_OUTPUT_LEN if info.field_name == "output_len" else 0
        if isinstance(count, int) and not least <= count <= MAX_LEN:
            raise UsageError(f"{flag} must be an integer in [{least}, {MAX_LEN}] (tokens), got {count}")
        return count

    @model_validator(mode="after")
    def _gpus_and_taus(self) -> PredictOptions:
        if not self.gpu and not self.gpu_spec:
            raise UsageError("give --gpu NAME[,NAME...] or --gpu-spec")
        if not self.tau and self.from_report is None:
            raise UsageError("no tau: give --tau K=TAU[,K=TAU...] or --from-report REPORT")
        return self

    def gpus(self) -> list[GPU]:
        """The GPUs asked for: --gpu's parts, then each --gpu-spec's."""
        return [gpu(n) for n in self.gpu or []] + [gpu_from_spec(t) for t in self.gpu_spec or []]

    @property
    def tau_text(self) -> str:
        """--tau as the errors quote it."""
        return ",".join(f"{k}={t:g}" for k, t in (self.tau or {}).items())


def run(options: PredictOptions) -> PredictionReport:
    """The prediction the options ask for, `target` and `draft` local (a directory or its config.json): tau per K
    from --tau and --from-report (--tau adds or overrides K), each within the draft's block, then every GPU x K x
    concurrency (prediction.predict)."""
    from dflash_convert.io.reading import read_json

    given = dict(options.tau or {})
    taus, source, fields = dict(given), "--tau", {}
    note = None
    if options.from_report is not None:
        raw = read_json(options.from_report, allow_bom=True, what="a validate --json report this tool reads")
        note = report_provenance(raw, str(options.from_report)) if isinstance(raw, dict) else None
        taus, source, fields = taus_from_report(raw, str(options.from_report))
        taus = {**taus, **given}
        if given:
            source = f"{source}; --tau at K {', '.join(map(str, sorted(given)))}"
    if not taus:
        raise UsageError("no tau: give --tau K=TAU[,K=TAU...] or --from-report REPORT")
    inputs = load_inputs(Path(options.target), Path(options.draft), options.target_name or str(options.target),
                         options.draft_name or str(options.draft))
    if given:
        check_taus_within_block(given, inputs.draft, options.tau_text)
    if options.from_report is not None:
        check_taus_within_block({k: t for k, t in taus.items() if k not in given}, inputs.draft,
                                str(options.from_report), fields=fields)
    report = predict(inputs, options.gpus(), taus, concurrency=list(options.concurrency), input_len=options.input_len,
                     output_len=options.output_len, engine=options.engine, tp=options.tp, tau_source=source)
    picked = [n for n in (variant_note(name) for name in options.gpu or []) if n is not None]
    report.notes[:0] = ([note] if note is not None else []) + picked
    return report
