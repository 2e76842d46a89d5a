"""`predict`'s inputs against each other and their bounds: a --from-report held to --tau's rule (one line naming the
report and the field, exit 1), a --tp vLLM refuses, a draft that cannot run on the target (exit 1, both files
named), duplicate K and GPUs, lengths past their bounds (exit 2) or past the target's positions (a note), the
launch line's model directory, --revision the draft's; and unknown GPUs named by the flag the user typed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factories import draft_config as draft_for

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
DRAFT_CONFIG = PAIR / "draft" / "config.json"
PAIR_TARGET = json.loads((PAIR / "target" / "config.json").read_text())

PAIR_ARGS = ("--target", PAIR / "target", "--draft", PAIR / "draft", "--gpu", "H200")
BLOCK = (f"is past the draft's block: {DRAFT_CONFIG} has block_size 16, which proposes at most 15 tokens per step "
         "(K 1 to 15)")

# Published dimensions (meta-llama/Llama-3.1-8B and -70B config.json), the fields the checks read.
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
            "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "max_position_embeddings": 131072}
LLAMA_70B = {**LLAMA_8B, "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
             "intermediate_size": 28672}


def _run(i: int = 0, **fields) -> dict:
    return {"per_num_speculative_tokens": [{"num_speculative_tokens": 7, "acceptance_length": 4.0,
                                            "per_position_rates": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3], **fields}]}


RUN0 = "per_num_speculative_tokens[0]"


@pytest.mark.parametrize("report, field, problem", [
    (_run(acceptance_length=-3), f"{RUN0}.acceptance_length", "tau of K=7 must be in [1, 8] (tokens per step), got -3"),
    (_run(acceptance_length=1e6), f"{RUN0}.acceptance_length",
     "tau of K=7 must be in [1, 8] (tokens per step), got 1e+06"),
    (_run(acceptance_length=True), f"{RUN0}.acceptance_length", "tau of K=7 must be a number, got True"),
    (_run(vllm_counting={"acceptance_length": "9"}), f"{RUN0}.vllm_counting.acceptance_length",
     "tau of K=7 must be a number, got '9'"),
    (_run(num_speculative_tokens=-3), f"{RUN0}.num_speculative_tokens", "K must be at least 1, got -3"),
    (_run(num_speculative_tokens=0), f"{RUN0}.num_speculative_tokens", "K must be at least 1, got 0"),
    (_run(num_speculative_tokens=True), f"{RUN0}.num_speculative_tokens", "K must be an integer, got True"),
    (_run(num_speculative_tokens=10 ** 9), f"{RUN0}.num_speculative_tokens", f"K 1000000000 {BLOCK}"),
    (_run(per_position_rates=[0.9, 5.0]), f"{RUN0}.per_position_rates[1]",
     "the acceptance rate of position 2 must be in [0, 1] (a share of steps), got 5"),
    (_run(per_position_rates=[None]), f"{RUN0}.per_position_rates[0]",
     "the acceptance rate of position 1 must be a number, got None"),
    (_run(per_position_rates=["a"]), f"{RUN0}.per_position_rates[0]",
     "the acceptance rate of position 1 must be a number, got 'a'"),
    ({"acceptance": {"per_position_rates": [[1]]}}, "acceptance.per_position_rates[0]",
     "the acceptance rate of position 1 must be a number, got [1]"),
    ({"acceptance": {"per_position_rates": [-5.0]}}, "acceptance.per_position_rates[0]",
     "the acceptance rate of position 1 must be in [0, 1] (a share of steps), got -5"),
    # rates past the block: K 16 derived from them is a K the draft cannot propose
    ({"acceptance": {"per_position_rates": [0.5] * 100}}, "acceptance.per_position_rates[15]", f"K 16 {BLOCK}"),
    # unconditional rates (the share of steps whose draft token there was accepted) cannot rise along the block
    ({"acceptance": {"per_position_rates": [0.1, 0.9, 0.9]}}, "acceptance.per_position_rates",
     "the rate rises at position(s) 2 (from 0.1 to 0.9 at the first); these rates are each the share of steps whose "
     "draft token there was accepted, which cannot rise with position"),
    (_run(per_position_rates=[0.9, 0.5, 0.6, 0.4, 0.45, 0.3, 0.2]), f"{RUN0}.per_position_rates",
     "the rate rises at position(s) 3, 5 (from 0.5 to 0.6 at the first); these rates are each the share of steps "
     "whose draft token there was accepted, which cannot rise with position"),
    ({"per_num_speculative_tokens": [_run()["per_num_speculative_tokens"][0]] * 2},
     "per_num_speculative_tokens[1].num_speculative_tokens", f"K 7 is given twice (also at {RUN0}"
     ".num_speculative_tokens)"),
])
def test_a_report_value_past_the_tau_rule_is_one_line_naming_the_report_and_field_exit_1(cli, tmp_path, report,
                                                                                          field, problem):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    r = cli("predict", *PAIR_ARGS, "--from-report", path)
    assert r.code == 1, (r.code, r.err)
    assert r.err.strip().splitlines() == [f"Error: {path}: field `{field}`: {problem}"], r.err


@pytest.mark.parametrize("report, says", [
    ({"acceptance": [1, 2]}, "field `acceptance` is [1, 2], not an object"),
    ({"per_num_speculative_tokens": {"a": 1}}, "field `per_num_speculative_tokens` is {'a': 1}, not a list of runs"),
    ({"per_num_speculative_tokens": [3]}, f"field `{RUN0}` is 3, not a run (an object)"),
    (_run(vllm_counting=[1]), f"field `{RUN0}.vllm_counting` is [1], not an object"),
    (_run(per_position_rates="0.9"), f"field `{RUN0}.per_position_rates` is '0.9', not a list of acceptance rates"),
    ({**_run(), "tool": "something-else"},
     "field `tool` is 'something-else', not \"dflash-convert\": not a validate --json report"),
    ({**_run(), "tool": "dflash-convert", "incomplete": "interrupted (Ctrl-C)", "passed": False},
     "field `incomplete` is 'interrupted (Ctrl-C)': the validation stopped before its end, so its figures may be "
     "partial; run validate to its end"),
])
def test_a_report_of_the_wrong_shape_is_one_line_naming_the_field_exit_1(cli, tmp_path, report, says):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    r = cli("predict", *PAIR_ARGS, "--from-report", path)
    assert r.code == 1, (r.code, r.err)
    assert r.err.strip().splitlines() == [f"Error: {path}: {says}"], r.err


@pytest.mark.parametrize("name, taken, other", [("A100", "A100-80GB", "A100-40GB"), ("h100", "H100-SXM", "H100-PCIe"),
                                               ("A100-40GB", None, None), ("NVIDIA H100 80GB HBM3", None, None)])
def test_a_gpu_name_that_picks_one_of_several_parts_says_which(cli, name, taken, other):
    """A100 and H100 are families: the part taken is said, with the other's name; a part's own name is quiet."""
    r = cli("predict", "--target", PAIR / "target", "--draft", PAIR / "draft", "--gpu", name, "--tau", "3=2",
            "--json")
    assert r.code == 0, r.err
    picked = [n for n in r.json()["notes"] if "taken as" in n]
    assert picked == ([f"--gpu {name}: taken as {taken}, the figures of that part; name {other} for the other part"]
                      if taken else []), picked
    inspect = cli("inspect", PAIR / "draft", "--engine", "vllm", "--num-speculative-tokens", "15", "--max-num-seqs",
                  "64", "--gpu", name, "--json")
    check = next(c for c in inspect.json()["checks"] if c["name"] == "verify_compute_bound")
    assert (f"(--gpu {name}: taken as {taken}, the figures of that part" in check["message"]) == bool(taken), check


def test_a_report_past_the_size_limit_is_called_a_report(cli, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**_run(), "pad": "x" * (9 << 20)}))
    r = cli("predict", *PAIR_ARGS, "--from-report", path)
    assert (r.code, r.err.strip()) == (1, f"Error: {path}: file is larger than 8 MB: not a validate --json report "
                                          "this tool reads"), r.err


def test_a_failed_validation_s_tau_is_used_with_a_note(cli, tmp_path):
    """A failed report's checks judge the draft; the tau its runs measured is still a measurement: used, and said."""
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**_run(), "tool": "dflash-convert", "passed": False, "incomplete": None,
                                "checks": [{"name": "outputs_equal", "status": "fail"}]}))
    r = cli("predict", *PAIR_ARGS, "--from-report", path, "--json")
    assert r.code == 0, r.err
    assert r.json()["notes"][0] == (f"{path} is a failed validation (`passed` is False; failed: outputs_equal): its "
                                    "tau was still measured and is used here; the draft did not pass its checks")
    assert r.json()["taus"]["7"] == 4.0


def test_tau_and_the_report_share_one_rule(cli, tmp_path):
    """The same (K, tau) refused by both, with the same words: a flag is a usage error, a file an error."""
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_run(acceptance_length=9)))
    flag = cli("predict", *PAIR_ARGS, "--tau", "7=9")
    report = cli("predict", *PAIR_ARGS, "--from-report", path)
    problem = "tau of K=7 must be in [1, 8] (tokens per step), got 9"
    assert (flag.code, flag.err.strip()) == (2, f"Error: --tau 7=9: {problem}"), flag.err
    assert (report.code, report.err.strip()) == (
        1, f"Error: {path}: field `{RUN0}.acceptance_length`: {problem}"), report.err
    path.write_text(json.dumps(_run()))
    ok = cli("predict", *PAIR_ARGS, "--from-report", path, "--tau", "7=5", "--json")  # --tau overrides the report's
    assert ok.code == 0 and ok.json()["taus"]["7"] == 5.0 and ok.json()["taus"]["3"] == 3.4, ok.err


def test_a_k_given_twice_is_refused_exit_2(cli):
    r = cli("predict", *PAIR_ARGS, "--tau", "7=3,7=5")
    assert (r.code, r.err.strip().splitlines()) == (2, ["Error: --tau 7=3,7=5: K 7 is given twice"]), r.err


# ----------------------------------------------------------------------------- --tp

def test_a_tp_that_does_not_divide_the_heads_is_refused_as_vllm_does_exit_2(cli, tmp_path):
    target = PAIR / "target" / "config.json"
    r = cli("predict", *PAIR_ARGS, "--tau", "7=3", "--tp", "3")
    assert r.code == 2 and r.err.strip().splitlines() == [
        f"Error: --tp 3: the target's num_attention_heads (2, {target}) is not divisible by 3: tensor parallelism "
        "splits the attention heads evenly over the GPUs (vLLM refuses this size); give a divisor of 2"], r.err
    # 2 heads, 1 KV head over 2 GPUs: the KV head is replicated, which vLLM serves
    assert cli("predict", *PAIR_ARGS, "--tau", "7=3", "--tp", "2").code == 0
    (tmp_path / "config.json").write_text(json.dumps({**PAIR_TARGET, "num_attention_heads": 4}))
    draft = cli("predict", "--target", tmp_path, "--draft", PAIR / "draft", "--gpu", "H200", "--tau", "7=3",
                "--tp", "4")
    assert draft.code == 2 and draft.err.strip().splitlines() == [
        f"Error: --tp 4: the draft's num_attention_heads (2, {DRAFT_CONFIG}) is not divisible by 4: tensor "
        "parallelism splits the attention heads evenly over the GPUs (vLLM refuses this size); give a divisor of 2"
    ], draft.err


def test_a_tp_past_the_bound_is_refused_exit_2(cli):
    r = cli("predict", *PAIR_ARGS, "--tau", "7=3", "--tp", "1000000000")
    assert (r.code, r.err.strip()) == (2, "Error: --tp must be an integer in [1, 1024], got 1000000000"), r.err


# ----------------------------------------------------------------------------- target against draft

def test_a_draft_of_another_target_is_one_line_naming_both_files_exit_1(cli, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    target = tmp_path / "config.json"
    draft = draft_for(LLAMA_70B, tmp_path / "d70b")
    r = cli("predict", "--target", tmp_path, "--draft", draft.parent, "--gpu", "H100", "--tau", "7=3")
    assert r.code == 1 and r.err.strip().splitlines() == [
        f"Error: {draft}: target {target} has hidden_size 4096; the draft's fc takes 5 ids x target hidden 8192 = "
        "40960 inputs; the draft's hidden size is 8192, and it embeds its block with the target's embedding table "
        "and reads the target's lm_head"], r.err
    # the right hidden size, but reading layers a 32-layer target does not have
    layers = draft_for(LLAMA_8B, tmp_path / "ids", num_target_layers=80,
                       dflash_config={"mask_token_id": 128002, "target_layer_ids": [1, 20, 39, 58, 77]})
    r = cli("predict", "--target", tmp_path, "--draft", layers, "--gpu", "H100", "--tau", "7=3")
    assert r.code == 1 and r.err.strip().splitlines() == [
        f"Error: {layers}: target_layer_ids [39, 58, 77] are not layers of target {target} (32 layers: 0..31)"], r.err
    ok = cli("predict", "--target", tmp_path, "--draft", draft_for(LLAMA_8B, tmp_path / "d8b"), "--gpu", "H100",
             "--tau", "7=3")
    assert ok.code == 0, ok.err


# ----------------------------------------------------------------------------- lengths, names, GPUs

@pytest.mark.parametrize("flag", ["--input-len", "--output-len"])
def test_a_length_past_10m_tokens_is_refused_exit_2(cli, flag):
    r = cli("predict", *PAIR_ARGS, "--tau", "7=3", flag, "10000001")
    least = 1 if flag == "--output-len" else 0
    assert (r.code, r.err.strip()) == (
        2, f"Error: {flag} must be an integer in [{least}, 10000000] (tokens), got 10000001"), r.err


def test_an_output_of_0_tokens_is_refused_exit_2_and_0_in_is_not(cli):
    r = cli("predict", *PAIR_ARGS, "--tau", "7=3", "--output-len", "0")
    assert (r.code, r.err.strip()) == (2, "Error: --output-len must be an integer in [1, 10000000] (tokens), got 0")
    assert cli("predict", *PAIR_ARGS, "--tau", "7=3", "--input-len", "0").code == 0


def test_a_context_past_the_target_s_positions_is_predicted_with_a_note(cli, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    draft = draft_for(LLAMA_8B, tmp_path / "draft")
    args = ("--target", tmp_path, "--draft", draft, "--gpu", "H200", "--tau", "7=3", "--json")
    r = cli("predict", *args, "--input-len", "131000", "--output-len", "4000")
    assert r.code == 0 and r.json()["predictions"][0]["speedup"] > 0, r.err
    assert ("--input-len 131000 + --output-len 4000 = 135000 tokens pass the target's max_position_embeddings "
            "(131072): an engine refuses such requests unless its max_model_len is raised (with RoPE scaling the "
            "model supports)") in r.json()["notes"]
    within = cli("predict", *args, "--input-len", "131000", "--output-len", "72")
    assert not any("max_position_embeddings" in n for n in within.json()["notes"]), within.out


def test_the_launch_line_names_the_model_directory_not_its_config_file(cli, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    draft = draft_for(LLAMA_8B, tmp_path / "draft")
    r = cli("predict", "--target", tmp_path / "config.json", "--draft", draft, "--gpu", "H200", "--tau", "7=5",
            "--json")
    (rec,) = r.json()["recommendation"]
    assert rec["launch"] == (f"vllm serve {tmp_path} --speculative-config '{{\"method\": \"dflash\", \"model\": "
                             f"\"{draft.parent}\", \"num_speculative_tokens\": 7}}'"), rec


def test_revision_is_the_draft_s_as_validate_s(cli):
    """A local target is read as is: the --revision the draft takes is not applied to it."""
    r = cli("predict", *PAIR_ARGS, "--tau", "7=3", "--revision", "v1")
    assert (r.code, r.err.strip()) == (
        2, f"Error: --revision v1 applies to Hub repo ids, but {PAIR / 'draft'} is a local path"), r.err


def test_a_gpu_named_twice_is_refused_exit_2(cli):
    r = cli("predict", "--target", PAIR / "target", "--draft", PAIR / "draft", "--gpu", "H100,h100", "--tau", "7=3")
    assert (r.code, r.err.strip()) == (2, "Error: --gpu H100,h100: H100 and h100 are both H100-SXM"), r.err
    spec = cli("predict", *PAIR_ARGS, "--gpu-spec", "name=H200,bw=1,bf16=1", "--tau", "7=3")
    assert (spec.code, spec.err.strip()) == (
        2, "Error: --gpu-spec name=H200,bw=1,bf16=1: name H200 is --gpu's H200 too (name it otherwise)"), spec.err


KNOWN = ("H100-SXM, H100-PCIe, H200, H20, A100-40GB, A100-80GB, A800, L40S, L4, RTX-4090, RTX-PRO-6000, B200, "
         "GB200, MI300X, MI355X")


@pytest.mark.parametrize("args, line", [
    (("validate", PAIR / "draft", "--predict-gpu", "X100"), f"--predict-gpu X100: unknown GPU; known: {KNOWN}"),
    (("validate", PAIR / "draft", "--predict-gpu", ","), "--predict-gpu names no GPU (give NAME[,NAME...])"),
    (("validate", PAIR / "draft", "--predict-gpu", "H100,h100"), "--predict-gpu H100,h100: H100-SXM is named twice"),
    (("inspect", PAIR / "draft", "--engine", "vllm", "--num-speculative-tokens", "7", "--max-num-seqs", "8", "--gpu",
      "X100"), f"--gpu X100: unknown GPU; known: {KNOWN}"),
    (("predict", *PAIR_ARGS[:4], "--gpu", "X100", "--tau", "7=3"),
     f"--gpu X100: unknown GPU; known: {KNOWN} (or describe it with --gpu-spec name=...,bw=GB/s,bf16=TFLOP/s"
     "[,fp8=TFLOP/s][,mem=GB][,link=GB/s])"),
])
def test_an_unknown_gpu_names_the_flag_typed_and_only_that_command_s_flags_exit_2(cli, args, line):
    r = cli(*args)
    assert (r.code, r.err.strip().splitlines()) == (2, [f"Error: {line}"]), r.err
