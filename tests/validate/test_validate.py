"""`validate`: the bundled trained pair passes every level; mis-wired copies of it fail with the check
that should catch them named in the report; JSON follows the schema, JUnit counts failures; exit codes.

Tests that need acceptance to mean something use the bundled trained pair (examples/pair); the
rest run on tiny random drafts saved by speculators (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from dflash_convert.io.checkpoint import open_checkpoint

from dflash_convert.io.reading import read_json
from factories import copy_draft
from runtime_helpers import ON_CUDA

ROOT = Path(__file__).resolve().parents[2]
PAIR = Path(os.environ.get("DFLASH_TEST_PAIR", ROOT / "examples" / "pair"))  # another trained pair for trials
PAIR_PROMPTS = 3  # held-out prompts used per end-to-end run (of the pair's prompts.txt)
PAIR_TOKENS = "32"
TAU_FLOOR = 0.95  # mis-wired copies are held to this share of the good pair's tau (greedy: deterministic)
MISWIRED_SHARE = 0.5  # and wrong target layer ids keep less than this share of it (the pair reads its context)


@dataclass
class Pair:
    target: Path
    draft: Path
    prompts: Path


@pytest.fixture(scope="session")
def pair(tmp_path_factory) -> Pair:
    if not all((PAIR / p).exists() for p in ("target/config.json", "draft/config.json", "prompts.txt")):
        pytest.skip("the bundled trained pair (examples/pair) is not in this checkout")
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    lines = [line for line in (PAIR / "prompts.txt").read_text().splitlines() if line.strip()]
    prompts.write_text("\n".join(lines[:PAIR_PROMPTS]) + "\n")
    return Pair(PAIR / "target", PAIR / "draft", prompts)


def e2e_args(pair: Pair, draft: Path | None = None, *extra: str) -> list[str]:
    return ["validate", str(draft or pair.draft), "--target", str(pair.target), "--prompts", str(pair.prompts),
            "--max-new-tokens", PAIR_TOKENS, "--threads", "1", "--sampling", "greedy", "--json", *extra]


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """`--threads 1` (the tiny pair's fastest setting) runs in-process: give other tests their threads back."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def miswired_args(pair: Pair, good: dict, draft: Path | None = None, *extra: str) -> list[str]:
    """A mis-wired copy end to end (numerics skipped: they cannot see wiring), held to 95% of the good tau,
    the way a CI gate pins a known-good acceptance."""
    floor = f"{TAU_FLOOR * good['acceptance']['acceptance_length']:.3f}"
    return [*e2e_args(pair, draft, *extra), "--levels", "static,end_to_end", "--min-acceptance-length", floor]


def statuses(report: dict) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


def failed(report: dict) -> list[str]:
    return sorted(c["name"] for c in report["checks"] if c["status"] == "fail")


@pytest.fixture(scope="session")
def good_run(pair, cli, tmp_path_factory):
    import torch

    junit = tmp_path_factory.mktemp("junit") / "good.xml"
    threads = torch.get_num_threads()
    try:
        r = cli(*e2e_args(pair), "--min-acceptance-length", "3", "--junit", str(junit))
    finally:
        torch.set_num_threads(threads)
    return r, junit


# ----------------------------------------------------------------------------- the trained pair

def test_min_acceptance_length_at_its_exact_boundary(pair, good_run, cli):
    """A threshold equal to the tau a report showed passes; the next representable step above fails."""
    tau = good_run[0].json()["acceptance"]["acceptance_length"]
    at = cli(*e2e_args(pair), "--levels", "end_to_end", "--min-acceptance-length", repr(tau))
    assert at.code == 0, at.err[-2000:]
    assert statuses(at.json())["acceptance_length"] == "pass"
    above = cli(*e2e_args(pair), "--levels", "end_to_end", "--min-acceptance-length", repr(round(tau + 1e-4, 4)))
    assert above.code == 3, above.err[-2000:]
    assert statuses(above.json())["acceptance_length"] == "fail"


def test_bundled_pair_passes_every_level(good_run):
    r, junit = good_run
    assert r.code == 0, r.err[-2000:]
    report = r.json()
    assert report["levels_run"] == ["static", "numeric", "end_to_end"] and report["passed"] is True
    assert failed(report) == []
    s = statuses(report)
    assert s["greedy_output_equal"] == "pass" and s["acceptance_length"] == "pass"
    assert all(s[n] == "pass" for n in s if n.startswith(("backend_agreement.", "causality_behaviour.")))
    a = report["acceptance"]
    assert a["acceptance_length"] >= 3 and a["outputs_equal"] == a["prompts"] == PAIR_PROMPTS
    assert a["speedup"] == a["speculative_tokens_per_s"] / a["target_tokens_per_s"]  # the rates shown
    rates = a["per_position_rates"]
    assert len(rates) == a["block_size"] - 1 and rates == sorted(rates, reverse=True) and rates[0] > 0.5
    assert report["environment"]["backends"]["eager"] is True
    assert report["environment"]["versions"]["torch"]
    root = ET.parse(junit).getroot()
    assert root.get("failures") == "0" and int(root.get("tests")) == len(report["checks"])


@pytest.mark.parametrize("device", [ON_CUDA])
def test_bundled_pair_passes_every_level_in_bf16_on_a_gpu(device, pair, cli):
    """The trained pair in bf16 on the GPU: every level passes (backends agree, greedy outputs equal, tau >= 3)."""
    r = cli(*e2e_args(pair), "--device", device, "--dtype", "bfloat16", "--min-acceptance-length", "3")
    assert r.code == 0, r.err[-2000:]
    report = r.json()
    assert report["passed"] is True and failed(report) == []
    assert report["environment"]["device"].startswith(device) and report["environment"]["dtype"] == "bfloat16"
    assert report["acceptance"]["outputs_equal"] == report["acceptance"]["prompts"] == PAIR_PROMPTS


def test_report_records_the_options_the_run_was_given(pair, good_run):
    """The JSON report carries the run's ValidateOptions: what a CI log needs to rerun it exactly."""
    from dflash_convert.validate import ValidateOptions

    options = good_run[0].json()["options"]
    assert options["min_acceptance_length"] == 3 and options["target"] == str(pair.target)
    assert ValidateOptions.model_validate(options).min_acceptance_length == 3  # it reads back as options


def test_options_out_of_range_are_usage_errors_before_anything_is_read(tmp_path):
    from dflash_convert.errors import UsageError
    from dflash_convert.validate import ValidateOptions, validate

    for bad, flag in [(dict(block_size=1), "--block-size"), (dict(levels=["nope"]), "--levels 'nope': choose"),
                      (dict(draft_sampling="top"), "--draft-sampling"), (dict(temperature=float("nan")), "--temperature"),
                      (dict(engine="vllm", causal=True), "--engine or --causal")]:
        with pytest.raises(UsageError, match=flag):
            validate(tmp_path / "does-not-exist", ValidateOptions(**bad))


def test_quiet_validate_writes_nothing_but_its_result(pair, cli):
    """-q: no status lines and no library bars (transformers' weight-loading bar) on stderr, only the quiet report
    (warnings, the verdict) that --json keeps there for the log; the JSON on stdout."""
    r = cli(*e2e_args(pair), "--levels", "end_to_end", "-q")
    assert r.code == 0 and "end to end:" not in r.err and "Loading" not in r.err, r.err[-2000:]
    assert r.err.strip().splitlines()[-1].startswith("PASSED ("), r.err[-2000:]
    assert r.json()["passed"] is True
    loud = cli(*e2e_args(pair), "--levels", "end_to_end")
    # our status line says what loads; transformers' own bar is hidden (it drew a bar inside ours)
    assert "end to end: loading the target" in loud.err and "Loading weights" not in loud.err


def test_json_report_validates_against_the_schema(good_run):
    import jsonschema

    schema = json.loads((ROOT / "schemas" / "validation-report.schema.json").read_text())
    jsonschema.validate(good_run[0].json(), schema)
    bad = {**good_run[0].json(), "checks": [{"name": "x", "status": "maybe"}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


@pytest.mark.parametrize("shift", [-1, 1])
def test_target_ids_off_by_one_fail_by_a_wide_margin(pair, good_run, cli, tmp_path, shift):
    """Every id one layer too low (a z-lab checkpoint written as speculators without the +1, speculators #705)
    or too high (the +1 applied twice): nothing static can see either, and the pair's draft reads its
    continuation from the context's features, so acceptance collapses to well under half the right tau."""
    spec = open_checkpoint(pair.draft).spec
    n = read_json(pair.target / "config.json")["num_hidden_layers"]
    ids = [i + shift for i in spec.target_layer_ids]
    assert 0 <= min(ids) and max(ids) < n  # the bundled pair leaves room for both shifts
    draft = copy_draft(pair.draft, tmp_path / "draft", spec_update={"target_layer_ids": ids})
    good = good_run[0].json()
    r = cli(*miswired_args(pair, good, draft))
    assert r.code == 3, r.err[-2000:]
    report = r.json()
    assert failed(report) == ["acceptance_length"]  # nothing static can see it: only acceptance does
    assert report["acceptance"]["acceptance_length"] < MISWIRED_SHARE * good["acceptance"]["acceptance_length"]
    assert statuses(report)["greedy_output_equal"] == "pass"  # still lossless, just slow


def test_target_ids_in_the_wrong_order(pair, cli, tmp_path):
    ids = list(reversed(open_checkpoint(pair.draft).spec.target_layer_ids))
    draft = copy_draft(pair.draft, tmp_path / "draft", spec_update={"target_layer_ids": ids})
    r = cli("validate", draft, "--target", pair.target, "--levels", "static", "--json")
    assert r.code == 3 and failed(r.json()) == ["target_layer_ids"]
    assert "increasing" in next(c["message"] for c in r.json()["checks"] if c["name"] == "target_layer_ids")


def test_wrong_mask_id(pair, good_run, cli, tmp_path):
    spec = open_checkpoint(pair.draft).spec
    info = read_json(pair.target / "config.json")
    # a plausible but wrong id (an ordinary token): only acceptance shows it
    draft = copy_draft(pair.draft, tmp_path / "plain", spec_update={"mask_token_id": 7})
    r = cli(*miswired_args(pair, good_run[0].json(), draft))
    assert r.code == 3 and failed(r.json()) == ["acceptance_length"], r.err[-2000:]
    assert spec.mask_token_id != 7
    # the eos token: caught statically against the target config
    eos = info["eos_token_id"]
    draft = copy_draft(pair.draft, tmp_path / "eos", spec_update={"mask_token_id": eos if isinstance(eos, int)
                                                                       else eos[0]})
    r = cli("validate", draft, "--target", pair.target, "--levels", "static", "--json")
    assert r.code == 3 and "target_mask_token_id_special" in failed(r.json())


def test_causal_draft_forced_non_causal(pair, good_run, cli, tmp_path):
    """A deployment forcing a causal draft non-causal is named statically and the draft really runs non-causal
    (numeric probe). The bundled draft copies from its context, which the block's later mask slots do not hide,
    so it keeps its acceptance (tau 15.04 non-causal vs 14.61 causal on all 16 prompts): acceptance does not
    fail, the truthful verdict for this draft. A checkpoint that lost its causal flag runs the same way."""
    spec = open_checkpoint(pair.draft).spec
    if not all(spec.layer_causal):
        pytest.skip("the bundled draft is not causal")
    good = good_run[0].json()

    def probes(report: dict) -> list[dict]:
        return [c for c in report["checks"] if c["name"].startswith("causality_behaviour.")]

    r = cli(*e2e_args(pair), "--non-causal", "--keep-going", "--min-acceptance-length",
            f"{TAU_FLOOR * good['acceptance']['acceptance_length']:.3f}")
    assert r.code == 3, r.err[-2000:]
    report = r.json()
    assert failed(report) == ["causal_override"]
    assert probes(report) and all(c["status"] == "pass" and "0:non-causal" in c["message"] for c in probes(report))
    assert statuses(report)["greedy_output_equal"] == "pass"
    # a conversion that lost the causality flag: the checkpoint itself now says non-causal, and runs so
    draft = copy_draft(pair.draft, tmp_path / "flag", spec_update={"layer_causal": [False] * spec.num_layers})
    r = cli(*e2e_args(pair, draft))
    assert r.code == 0, r.err[-2000:]
    assert probes(r.json()) and all("0:non-causal" in c["message"] for c in probes(r.json()))
    assert r.json()["acceptance"]["acceptance_length"] == report["acceptance"]["acceptance_length"]


def test_fc_of_the_wrong_width(pair, cli, tmp_path):
    import torch

    def widen(t):
        t["fc.weight"] = torch.cat([t["fc.weight"], t["fc.weight"][:, :8]], dim=1)

    draft = copy_draft(pair.draft, tmp_path / "draft", edit_tensors=widen)
    r = cli(*e2e_args(pair, draft))
    assert r.code == 3
    report = r.json()
    # a failed static level skips the expensive levels, and the last line names the failed check
    assert "fc_width" in failed(report) and report["levels_run"] == ["static"]
    assert all("static checks failed (fc_width" in report["levels_skipped"][lv] for lv in ("numeric", "end_to_end"))
    assert r.err.strip().splitlines()[-1].endswith("failed: " + ", ".join(c["name"] for c in report["checks"]
                                                                           if c["status"] == "fail"))
    r = cli(*e2e_args(pair, draft), "--keep-going")
    report = r.json()
    assert r.code == 3 and {"fc_width", "draft_loads"} <= set(failed(report))
    assert "end_to_end" in report["levels_skipped"]


def test_nan_tensor(pair, cli, tmp_path):
    def spoil(t):
        t["layers.0.self_attn.v_proj.weight"][0, 0] = float("nan")

    draft = copy_draft(pair.draft, tmp_path / "draft", edit_tensors=spoil)
    junit = tmp_path / "report.xml"
    r = cli("validate", draft, "--levels", "static,numeric", "--json", "--junit", junit)
    assert r.code == 3
    report = r.json()
    assert "finite_values" in failed(report) and "finite_output.eager" in failed(report)
    msg = next(c["message"] for c in report["checks"] if c["name"] == "finite_values")
    assert "layers.0.self_attn.v_proj.weight" in msg
    # JUnit: one testcase per check, failures counted right
    root = ET.parse(junit).getroot()
    cases = root.findall(".//testcase")
    failures = [c.get("name") for c in cases if c.find("failure") is not None]
    assert len(cases) == len(report["checks"]) and sorted(failures) == failed(report)
    assert int(root.get("failures")) == len(failures) == sum(int(s.get("failures")) for s in root.iter("testsuite"))
    assert int(root.get("skipped")) == sum(c["status"] == "skip" for c in report["checks"])


def test_target_with_a_different_hidden_size(pair, cli, tmp_path):
    from factories import make_target

    raw = read_json(pair.target / "config.json")
    other = make_target(tmp_path / "other", layers=raw["num_hidden_layers"], hidden=raw["hidden_size"] // 2,
                        vocab=raw["vocab_size"])
    args = e2e_args(pair, None, "--keep-going")
    args[args.index("--target") + 1] = str(other)  # a --target given twice is refused: the other one, given once
    r = cli(*args)
    assert r.code == 3
    assert {"target_hidden_size", "pair_compatible"} <= set(failed(r.json()))


# ----------------------------------------------------------------------------- random drafts (logic)

def test_random_pair_is_lossless_and_reports_low_acceptance(speculators_drafts, tiny_target, tmp_path, cli):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": [5, 6, 7, 8, 9, 10]}\n{"prompt": [100, 3, 44, 2]}\n')
    r = cli("validate", speculators_drafts["mixed"], "--target", tiny_target, "--prompts", prompts,
            "--max-new-tokens", "12", "--backend", "sdpa", "--threads", "1", "--sampling", "greedy", "--json")
    assert r.code == 0, r.err[-2000:]
    report = r.json()
    s = statuses(report)
    assert s["greedy_output_equal"] == "pass" and s["acceptance_length"] == "warn"  # random: accepts ~nothing
    assert set(n for n in s if n.startswith("causality_behaviour.")) == {"causality_behaviour.eager",
                                                                         "causality_behaviour.sdpa"}
    probe = next(c for c in report["checks"] if c["name"] == "causality_behaviour.sdpa")
    assert probe["value"][0] > probe["threshold"] >= probe["value"][1]  # layer 0 full (bidirectional), 1 causal
    assert report["environment"]["draft_backend"] == "sdpa"


@pytest.mark.parametrize("planted", [False, True])
def test_a_sampled_run_still_checks_the_decode_loop_greedily(speculators_drafts, tiny_target, tmp_path, cli,
                                                              monkeypatch, planted):
    """Sampled outputs cannot be compared token by token, and sampling is the default wherever the target's
    generation config (or vLLM's default) asks for it: the end-to-end level then decodes its baseline prompts
    greedily as well, so a decode loop that commits tokens the target would not is still caught (exit 3)."""
    from dflash_runtime import decode

    if planted:  # commit every proposal: the random draft's tokens are not the target's
        def always_accept(block, target_logits, draft_probs, **kw):
            return block.numel() - 1, block[1:].tolist() + [int(target_logits[-1].argmax())]

        monkeypatch.setattr(decode, "accept_block", always_accept)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": [5, 6, 7, 8, 9, 10]}\n{"prompt": [100, 3, 44, 2]}\n')
    r = cli("validate", speculators_drafts["full"], "--target", tiny_target, "--prompts", prompts,
            "--max-new-tokens", "12", "--backend", "sdpa", "--threads", "1", "--temperature", "0.7", "--json")
    report = r.json()
    check = next(c for c in report["checks"] if c["name"] == "greedy_output_equal")
    assert report["acceptance"]["temperature"] == 0.7 and "greedy pass" in check["message"]
    assert (r.code, check["status"]) == ((3, "fail") if planted else (0, "pass")), r.err[-2000:]


def test_pruned_draft_without_d2t(speculators_drafts, tmp_path, cli):
    def drop(t):
        del t["d2t"], t["t2d"]

    draft = copy_draft(speculators_drafts["pruned"], tmp_path / "d", edit_tensors=drop)
    r = cli("validate", draft, "--json", "--keep-going")
    assert r.code == 3 and {"vocab_map", "draft_loads"} <= set(failed(r.json()))
    assert r.json()["levels_run"] == ["static", "numeric"]
    assert r.json()["levels_skipped"]["end_to_end"].startswith("no --target given")


def test_convert_validate_keeps_nothing_when_validation_fails(speculators_drafts, tmp_path, cli):
    def zero(t):
        t["layers.1.mlp.gate_proj.weight"].zero_()

    bad = copy_draft(speculators_drafts["full"], tmp_path / "bad", edit_tensors=zero)
    r = cli("convert", bad, "-o", tmp_path / "out", "--validate")
    assert r.code == 3 and "degenerate_values" in r.err and not (tmp_path / "out").exists()
    assert "validation FAILED: " in r.err  # it says that validation ran, and its result
    r = cli("convert", speculators_drafts["full"], "-o", tmp_path / "ok", "--validate")
    assert r.code == 0 and (tmp_path / "ok" / "config.json").exists()
    assert "validation passed: " in r.err and "(static, numeric)" in r.err


def test_exit_codes_and_prompt_errors(speculators_drafts, tiny_target, tmp_path, cli):
    full = speculators_drafts["full"]
    assert cli("validate", tmp_path / "missing").code == 1
    assert cli("validate", full, "--backend", "cudnn").code == 2
    assert cli("validate", full, "--levels", "static,fast").code == 2
    assert cli("validate", full, "--min-position-rates", "0.9,x").code == 2
    text = tmp_path / "text.txt"
    text.write_text("hello world\n")  # the tiny target ships no tokenizer
    r = cli("validate", full, "--target", tiny_target, "--prompts", text)
    assert r.code == 1 and "text" in r.err and "tokenizer" in r.err and str(text) in r.err
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 99999\n")
    r = cli("validate", full, "--target", tiny_target, "--prompts", bad)
    assert r.code == 1 and "99999" in r.err
    r = cli("validate", full, "--target", tiny_target / "config.json", "--levels", "static,end_to_end", "--json")
    assert r.code == 0 and r.json()["levels_skipped"]["end_to_end"].endswith("has no weights (config only)")


def test_read_prompts_formats(tmp_path):
    from dflash_convert.validate.prompts import read_prompts

    p = tmp_path / "p.txt"
    p.write_text('1 2 3\n\n[4, 5]\n{"prompt": "Hi there"}\n{"prompt": [6]}\nplain text 7\n')
    assert read_prompts(p) == [[1, 2, 3], [4, 5], "Hi there", [6], "plain text 7"]
    p.write_text('{"text": "x"}\n')
    from dflash_convert.errors import DFlashError

    with pytest.raises(DFlashError, match="line 1: JSONL prompt lines need a `prompt` field"):
        read_prompts(p)


def test_numeric_level_catches_a_backend_that_ignores_causality(speculators_drafts, monkeypatch):
    import dataclasses

    from dflash_runtime import attention

    from dflash_convert.validate import ValidateOptions, validate

    def top_left_causal(q, k, v, *, scale, causal, ctx_first, block_at=None):  # a classic bug: the block mask dropped
        return attention.sdpa_attention(q, k, v, scale=scale, causal=False, ctx_first=ctx_first, block_at=block_at)

    monkeypatch.setitem(attention.BACKENDS, "sdpa", dataclasses.replace(attention.BACKENDS["sdpa"], fn=top_left_causal))
    report = validate(speculators_drafts["full"], ValidateOptions(levels=["numeric"], backend="sdpa"))
    status = {c.name: c.status for c in report.checks}
    assert status["causality_behaviour.sdpa"] == "fail" and status["backend_agreement.sdpa"] == "fail"
    assert status["causality_behaviour.eager"] == "pass" and not report.passed


@pytest.mark.parametrize("planted", ["rounding", "kernel"])
def test_a_low_precision_disagreement_is_judged_again_in_float32(speculators_drafts, monkeypatch, planted):
    """bf16 rounding spread over the layers (as a quantized draft's dequantized weights spread it) can pass
    the fixed tolerance; the float32 re-run tells it from a wrong kernel, which fails there too."""
    import dataclasses

    import torch
    from dflash_runtime import attention

    from dflash_convert.validate import ValidateOptions, validate

    sdpa = attention.BACKENDS["sdpa"]

    def noisy_in_bf16(q, k, v, **kw):  # rounding-sized noise, only where the dtype rounds
        out = sdpa.fn(q, k, v, **kw)
        return out + 0.2 * out.abs().amax() * (q.dtype == torch.bfloat16)

    def no_block_mask(q, k, v, **kw):  # a wrong kernel: the block's causal mask dropped
        return sdpa.fn(q, k, v, **dict(kw, causal=False))

    fn = noisy_in_bf16 if planted == "rounding" else no_block_mask
    monkeypatch.setitem(attention.BACKENDS, "sdpa", dataclasses.replace(sdpa, fn=fn))
    report = validate(speculators_drafts["full"], ValidateOptions(levels=["numeric"], backend="sdpa",
                                                                  dtype="bfloat16"))
    check = next(c for c in report.checks if c.name == "backend_agreement.sdpa")
    assert check.value > check.threshold, check.message  # over bf16's tolerance either way
    if planted == "rounding":
        assert check.status == "pass" and "rounding, not the kernel" in check.message
    else:
        assert check.status == "fail" and "in float32 still" in check.message and not report.passed


def test_text_prompts_go_through_the_target_tokenizer(speculators_drafts, tiny_target, tmp_path, cli):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    target = tmp_path / "target"
    shutil.copytree(tiny_target, target)
    words = ["hello", "world", "the", "cat", "sat", "[UNK]"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(target)
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world the cat\n3 4 0\n")
    from dflash_convert.validate.prompts import read_prompts, tokenize_prompts

    ids, _ = tokenize_prompts(read_prompts(prompts), target, 512, set())
    assert ids == [[0, 1, 2, 3], [3, 4, 0]]
    r = cli("validate", speculators_drafts["full"], "--target", target, "--prompts", prompts, "--levels",
            "end_to_end", "--max-new-tokens", "4", "--threads", "1", "--json")
    assert r.code == 0 and r.json()["acceptance"]["prompts"] == 2
