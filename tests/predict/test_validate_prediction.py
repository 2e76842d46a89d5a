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
    written = tmp_path / "report.json"  # what validate --json writes is a report predict --from-report reads
    written.write_text(r.out)
    again = cli("predict", "--target", PAIR / "target", "--draft", PAIR / "draft", "--gpu", "H200", "--from-report",
                written, "--json")
    assert again.code == 0 and again.json()["taus"]["3"] == round(report["per_num_speculative_tokens"][0][
        "acceptance_length"], 4) and not any("failed validation" in n for n in again.json()["notes"]), again.err
    p = report["prediction"]
    runs = {row["num_speculative_tokens"]: row for row in report["per_num_speculative_tokens"]}
    assert {float(t) for t in p["taus"].values()} == {round(runs[k]["acceptance_length"], 4) for k in (3, 7)}
    assert {(x["gpu"], x["num_speculative_tokens"]) for x in p["predictions"]} == {
        (g, k) for g in ("H200", "H100-SXM") for k in (3, 7)}
    assert p["engine"] == "sglang" and p["error_band"]["median"] <= 0.15
    assert p["notes"][0] == ("--predict-gpu H100: taken as H100-SXM, the figures of that part; name H100-PCIe for "
                             "the other part") and not any("h200:" in n for n in p["notes"])
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


def test_a_target_that_does_not_fit_one_gpu_is_pointed_to_predict_s_tp(tmp_path):
    """The recommendation says "more GPUs: --tp", which validate does not take: the note names predict's."""
    import json
    from types import SimpleNamespace

    from dflash_convert.validate.gpu_prediction import TP_NOTE, gpu_prediction

    # meta-llama/Llama-3.1-70B's shape (141 GB in bf16) with a draft for it
    llama_70b = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
                 "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                 "intermediate_size": 28672, "vocab_size": 128256, "tie_word_embeddings": False,
                 "torch_dtype": "bfloat16"}
    draft = json.loads((PAIR / "draft" / "config.json").read_text())
    draft["transformer_layer_config"].update(hidden_size=8192, vocab_size=128256)
    draft.update(aux_hidden_state_layer_ids=[2, 40], draft_vocab_size=128256, mask_token_id=128000)
    run = SimpleNamespace(num_speculative_tokens=7)
    report = SimpleNamespace(per_num_speculative_tokens=[run], acceptance=None, target="t", checkpoint="d",
                             model_dump=lambda mode: {"per_num_speculative_tokens": [
                                 {"num_speculative_tokens": 7, "acceptance_length": 4.0}]})
    opts = SimpleNamespace(predict_gpu=["H100-SXM", "MI300X"], engine=None, concurrency=[1], max_new_tokens=64)
    prediction, _ = gpu_prediction(report, opts, tmp_path / "config.json", llama_70b, draft, "draft/config.json")
    fits = {r.gpu: r.target_fits for r in prediction.recommendation}
    assert fits == {"H100-SXM": False, "MI300X": True} and TP_NOTE in prediction.notes
    opts.predict_gpu = ["MI300X"]
    prediction, _ = gpu_prediction(report, opts, tmp_path / "config.json", llama_70b, draft, "draft/config.json")
    assert TP_NOTE not in prediction.notes


def test_validate_s_notes_name_its_own_lengths_not_predict_s_flags(tmp_path):
    """validate has no --input-len or --output-len: its request is the prompts' mean length and --max-new-tokens,
    and the coverage note (terminal, Markdown report, model card) names those."""
    import json
    from types import SimpleNamespace

    from dflash_convert.predict.prediction import markdown_lines, text_lines
    from dflash_convert.validate.gpu_prediction import gpu_prediction

    target = json.loads((PAIR / "target" / "config.json").read_text())
    draft = json.loads((PAIR / "draft" / "config.json").read_text())
    prompts = [SimpleNamespace(prompt_tokens=n) for n in (20, 28)]
    report = SimpleNamespace(per_num_speculative_tokens=[SimpleNamespace(num_speculative_tokens=7)],
                             acceptance=SimpleNamespace(per_prompt=prompts), target="t", checkpoint="d",
                             model_dump=lambda mode: {"per_num_speculative_tokens": [
                                 {"num_speculative_tokens": 7, "acceptance_length": 3.0}]})
    opts = SimpleNamespace(predict_gpu=["H200"], engine=None, concurrency=[1], max_new_tokens=64)
    prediction, _ = gpu_prediction(report, opts, tmp_path / "config.json", target, draft, "draft/config.json")
    note = next(n for n in prediction.notes if n.startswith("outside the calibration cases"))
    assert "mean prompt length 24 tokens (the cases: " in note and "--max-new-tokens 64 (the cases: " in note
    shown = "\n".join(text_lines(prediction) + markdown_lines(prediction))
    assert "--input-len" not in shown and "--output-len" not in shown, shown
