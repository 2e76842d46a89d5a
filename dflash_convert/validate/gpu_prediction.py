"""--predict-gpu: this run's measured tau per K (and per-position rates) through predict's cost model, for the
GPUs named; what the K table, the Markdown report and the model card show beside the costs measured here."""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any

from dflash_convert.predict.facts import draft_facts, target_facts
from dflash_convert.predict.gpus import gpu
from dflash_convert.predict.prediction import Inputs, PredictionReport, predict, taus_from_report
from dflash_convert.validate.static import Check, make_check


def check_prediction_configs(opts: Any, target_config: Path, draft_raw: dict[str, Any], draft_file: str) -> None:
    """--predict-gpu: read both configs as the cost model reads them before any work, so that a config it cannot
    read fails the run at once (exit 1, the file and the field named) instead of after the whole run."""
    from dflash_convert.io.reading import read_json

    if opts.predict_gpu:
        draft_facts(draft_raw, target_facts(read_json(target_config), str(target_config)), draft_file)


def gpu_prediction(report: Any, opts: Any, target_config: Path | None, target_raw: dict[str, Any] | None,
                   draft_raw: dict[str, Any], draft_file: str) -> tuple[PredictionReport | None, Check | None]:
    """The prediction for opts.predict_gpu, or None and a warning saying why it could not be made."""
    if not opts.predict_gpu:
        return None, None
    if target_raw is None or not report.per_num_speculative_tokens:
        return None, make_check("gpu_prediction", False, "--predict-gpu: no prediction, the end-to-end level did not "
                                "measure tau (it needs --target); dflash-convert predict --tau K=TAU takes one "
                                "given by hand", level="end_to_end", bad="warn")
    taus, source, _ = taus_from_report(report.model_dump(mode="json"), "this run")
    measured = {r.num_speculative_tokens for r in report.per_num_speculative_tokens}
    if len(measured) > 1:  # the K run, each at its own tau; one run: every K its rates reach, to choose among
        taus, source = {k: t for k, t in taus.items() if k in measured}, "this run's tau per K"
    target = target_facts(target_raw, str(target_config))
    inputs = Inputs(target, draft_facts(draft_raw, target, draft_file), report.target or str(target_config),
                    report.checkpoint or draft_file)
    prompts = report.acceptance.per_prompt if report.acceptance is not None else []
    input_len = round(mean(p.prompt_tokens for p in prompts)) if prompts else 0
    engine = opts.engine if opts.engine in ("vllm", "sglang") else "vllm"
    prediction = predict(inputs, [gpu(n, "--predict-gpu", None) for n in opts.predict_gpu], taus, concurrency=list(opts.concurrency),
                         input_len=input_len, output_len=opts.max_new_tokens, engine=engine, tau_source=source,
                         length_names=VALIDATE_LENGTHS)
    if any(r.speedup is None for r in prediction.recommendation):  # validate has no --tp: say where it is
        prediction.notes.append(TP_NOTE)
    return prediction, None


# validate has no --input-len or --output-len: its request lengths are the prompts' mean and --max-new-tokens, so
# the prediction's notes name those
VALIDATE_LENGTHS = ("mean prompt length {} tokens", "--max-new-tokens {}")

# A deployment that does not fit one GPU is told "more GPUs: --tp", a flag validate does not have: predict has it and
# reads this run's report
TP_NOTE = ("validate predicts on one GPU (TP 1); for a tensor-parallel deployment write the report with --json and "
           "run dflash-convert predict --from-report REPORT --tp N with the same --target, --draft and --gpu")
