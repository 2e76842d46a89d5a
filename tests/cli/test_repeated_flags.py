"""A flag given more than once, in every command: a list-valued one adds up, a single-valued one given with
different values is one line naming it, exit 2 (the user who wrote it twice meant something; keeping the last
one, as click does, silently runs another setting), before anything is read or downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
DRAFT, TARGET = PAIR / "draft", PAIR / "target"

# every command, a single-valued flag of it given twice with two values (Hub ids: nothing may be downloaded)
TWICE = [
    ("convert", ("convert", "org/never-read", "-o", "a", "--output", "b"), "--output given twice: a, b"),
    ("validate", ("validate", DRAFT, "--predict-gpu", "h100", "--engine", "vllm", "--engine", "sglang"),
     "--engine given twice: vllm, sglang"),
    ("validate-generated", ("validate", DRAFT, "--max-new-tokens", "8", "--max-new-tokens=16"),
     "--max-new-tokens given twice: 8, 16"),
    ("inspect", ("inspect", DRAFT, "--engine", "vllm", "--engine", "sglang"), "--engine given twice: vllm, sglang"),
    ("diff", ("diff", DRAFT, DRAFT, "--tolerance", "0", "--tolerance", "0.1"), "--tolerance given twice: 0, 0.1"),
    ("pull", ("pull", "org/never-read", "--revision", "v1", "--revision", "v2"), "--revision given twice: v1, v2"),
    ("push", ("push", DRAFT, "org/never-read", "--revision", "dev", "--revision", "main"),
     "--revision given twice: dev, main"),
    ("predict", ("predict", "--target", TARGET, "--draft", DRAFT, "--gpu", "H100", "--tau", "7=3", "--engine",
                 "vllm", "--engine", "sglang"), "--engine given twice: vllm, sglang"),
    ("predict-three", ("predict", "--target", TARGET, "--target", DRAFT, "--target", TARGET, "--draft", DRAFT),
     f"--target given 3 times: {TARGET}, {DRAFT}, {TARGET}"),
    ("former-spelling", ("validate", DRAFT, "--engine-kv-cache-gib", "2", "--engine-kv-cache", "3"),
     "--engine-kv-cache-gib given twice: 2, 3"),
    ("switch", ("validate", DRAFT, "--causal", "--levels", "static", "--non-causal"),
     "--causal and --non-causal both given: give one"),
]


@pytest.mark.parametrize("args, line", [case[1:] for case in TWICE], ids=[case[0] for case in TWICE])
def test_a_single_valued_flag_given_twice_is_one_line_naming_it_exit_2(cli, args, line):
    r = cli(*args)
    assert (r.code, r.err.strip().splitlines(), r.out) == (2, [f"Error: {line}"], ""), r.err
    as_json = cli(*args, "--json")
    assert (as_json.code, as_json.json()) == (2, {"error": {"message": line, "file": None, "exit_code": 2}}), \
        as_json.out


@pytest.mark.parametrize("args", [
    ("inspect", DRAFT, "--engine", "vllm", "--engine", "vllm", "-q", "--quiet", "--json", "--json"),
    ("validate", DRAFT, "--levels", "static", "--causal", "--causal", "--max-new-tokens", "8", "--max-new-tokens=8",
     "--json"),
], ids=["inspect", "validate"])
def test_the_same_value_given_twice_is_the_one_setting(cli, args):
    r = cli(*args)
    assert r.code == 0, r.err


PREDICT = ("predict", "--target", TARGET, "--draft", DRAFT, "--tau", "3=2")


@pytest.mark.parametrize("args", [
    (*PREDICT, "--gpu", "H100", "--output-len", "16384", "--output-len=16k"),  # a token count: k = 1024
    (*PREDICT, "--gpu", "H100", "--input-len", "1k", "--input-len", "1024"),
    (*PREDICT, "--gpu", "H100", "--target", f"{TARGET}/../target"),  # one directory, resolved
    (*PREDICT, "--gpu", "H100", "--tp", "1", "--tp", "01"),  # the flag's own conversion: one integer
    ("inspect", DRAFT, "--engine", "vllm", "--num-speculative-tokens", "15", "--max-num-seqs", "64", "--gpu", "h100",
     "--gpu", "H100"),  # one GPU part
], ids=["token-count", "token-count-k", "path", "integer", "gpu-part"])
def test_texts_that_read_as_one_value_are_the_one_setting(cli, args):
    """Compared as the flag reads them, not as typed: refusing these as "given twice" named no real conflict."""
    r = cli(*args, "--json")
    assert r.code == 0, r.err


def test_a_repeat_with_a_value_the_flag_refuses_is_that_value_s_error(cli):
    """--engine VLLM --engine vllm: VLLM is no engine (the error one alone gets), not a repeat."""
    r = cli(*PREDICT, "--gpu", "H100", "--engine", "VLLM", "--engine", "vllm")
    assert r.code == 2 and "Invalid value for '--engine': 'VLLM' is not one of the choices: vllm, sglang" in r.err, \
        r.err
    assert "given twice" not in r.err
    differ = cli(*PREDICT, "--gpu", "H100", "--input-len", "1k", "--input-len", "2k")
    assert (differ.code, differ.err.strip()) == (2, "Error: --input-len given twice: 1k, 2k"), differ.err


def test_a_list_flag_given_twice_adds_up(cli):
    """validate's generated list flags read every time they are given, as one comma-separated value would."""
    r = cli("validate", DRAFT, "--levels", "static", "--num-speculative-tokens", "3", "--num-speculative-tokens",
            "5,7", "--concurrency", "1", "--concurrency", "8", "--predict-gpu", "h100", "--predict-gpu", "rtx 4090",
            "--json")
    assert r.code == 0, r.err
    options = r.json()["options"]
    assert (options["num_speculative_tokens"], options["concurrency"], options["predict_gpu"]) == (
        [3, 5, 7], [1, 8], ["H100-SXM", "RTX-4090"])
    # the items added up are held to the field's rules as one value is
    twice = cli("validate", DRAFT, "--levels", "static", "--concurrency", "4", "--concurrency", "4")
    assert (twice.code, twice.err.strip()) == (2, "Error: --concurrency must be distinct values, got [4, 4]"), twice.err
