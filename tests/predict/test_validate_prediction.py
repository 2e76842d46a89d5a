"""validate --predict-gpu: the run's own tau per K through the cost model, in the K table (GPU columns beside the
CPU-measured costs), the Markdown report and the model card (the launch line naming the pushed repo)."""

from __future__ import annotations

from pathlib import Path

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"


def test_validate_predicts_on_the_named_gpus_from_its_measured_tau(cli, tmp_path):
    from dflash_convert.hub.card import model_card
    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_convert.validate.report import ValidationReport
    from dflash_convert.validate.report_terminal import per_k_lines

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PAIR.joinpath("prompts.txt").read_text().splitlines()[:2]) + "\n")
    md = tmp_path / "report.md"
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", prompts, "--levels", "end_to_end",
            "--max-new-tokens", "16", "--sampling", "greedy", "--num-speculative-tokens", "3,7",
            "--predict-gpu", "h200,H100", "--engine", "sglang", "--report-md", md, "--json")
    assert r.code == 0, r.err[-2000:]
    report = r.json()
    p = report["prediction"]
    runs = {row["num_speculative_tokens"]: row for row in report["per_num_speculative_tokens"]}
    assert {float(t) for t in p["taus"].values()} == {round(runs[k]["acceptance_length"], 4) for k in (3, 7)}
    assert {(x["gpu"], x["num_speculative_tokens"]) for x in p["predictions"]} == {
        (g, k) for g in ("H200", "H100-SXM") for k in (3, 7)}
    assert p["engine"] == "sglang" and p["error_band"]["median"] <= 0.15
    table = "\n".join(per_k_lines(ValidationReport.model_validate(report)))
    assert "H200" in table and "H100-SXM" in table and "measured on cpu" in table
    assert "### Predicted on a GPU" in md.read_text() and "model error on" in md.read_text()
    card = model_card(open_checkpoint(PAIR / "draft").spec, repo_id="org/pair-draft", validation=report)
    section = card.split("### Predicted throughput on GPUs", 1)[1]
    for rec in p["recommendation"]:
        if rec["num_speculative_tokens"] is not None:  # the launch names the repo pushed, not the local path
            assert (f"--speculative-draft-model-path org/pair-draft --speculative-num-draft-tokens "
                    f"{rec['num_speculative_tokens'] + 1}") in section
        else:
            assert "**no speculation**" in section


def test_predict_gpu_names_are_checked_before_anything_runs(cli):
    r = cli("validate", PAIR / "draft", "--predict-gpu", "H999")
    assert r.code == 2 and "unknown GPU; known: H100-SXM" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_predict_gpu_without_a_measured_tau_warns(cli):
    r = cli("validate", PAIR / "draft", "--levels", "static", "--predict-gpu", "H200", "--json")
    assert r.code == 0, r.err
    check = next(c for c in r.json()["checks"] if c["name"] == "gpu_prediction")
    assert check["status"] == "warn" and "--target" in check["message"]
    assert r.json()["prediction"] is None
