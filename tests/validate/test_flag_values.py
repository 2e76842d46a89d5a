"""The text of validate's list, count, threshold and JSON flags: what is refused (exit 2, one line naming the flag and
saying what to give) and the one token-count syntax --context-lengths and both commands' --max-model-len share."""

from __future__ import annotations

from pathlib import Path

import pytest

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"


def _usage_error(cli, *flags: str) -> str:
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--levels", "static", *flags)
    assert r.code == 2, (r.code, r.err)
    assert r.out == ""
    return r.err.strip().splitlines()[-1]


@pytest.mark.parametrize("flags, line", [
    (("--context-lengths", "64,,128"), "Error: Invalid value for '--context-lengths': '64,,128' has an empty entry "
     "(entry 2): give comma-separated values, e.g. 1024,2k,32k"),
    (("--context-lengths", "\u0663\u0662"), "Error: Invalid value for '--context-lengths': expected comma-separated "
     "token count (1024, 2k, 32k) values, got '\u0663\u0662'"),  # Arabic-Indic 32: int() would read it
    (("--context-lengths", "32\u00b2"), "Error: Invalid value for '--context-lengths': expected comma-separated "
     "token count (1024, 2k, 32k) values, got '32\u00b2'"),
    (("--max-model-len", "0"), "Error: Invalid value for '--max-model-len': must be at least 1 token, got '0'"),
    (("--min-acceptance-length", "code=nan"), "Error: Invalid value for '--min-acceptance-length': the threshold for "
     "category 'code' must be a finite number >= 0, got nan"),
    (("--min-acceptance-length", '{"code": -1}'), "Error: Invalid value for '--min-acceptance-length': the threshold "
     "for category 'code' must be a finite number >= 0, got -1"),
    (("--min-acceptance-length", "{}"), "Error: Invalid value for '--min-acceptance-length': '{}' gives no "
     "threshold: give X, CATEGORY=X or '{\"\": X, \"CATEGORY\": X}'"),
    (("--min-acceptance-length", '3,{"code":1}'), "Error: Invalid value for '--min-acceptance-length': "
     "'3,{\"code\":1}' mixes the two forms: the JSON form must be the whole value, e.g. '{\"\": 3, \"code\": 2.5}'"),
    (("--chat-template-kwargs", "[]"), "Error: Invalid value for '--chat-template-kwargs': a JSON object is needed, "
     "e.g. '{\"enable_thinking\": false}'"),
    (("--engine", "vllm", "--engine-python", "self", "--engine-args", "[]"), "Error: Invalid value for "
     "'--engine-args': a JSON object is needed, e.g. '{\"dtype\": \"float32\"}'"),
])
def test_a_malformed_flag_value_is_one_usage_line_naming_the_flag(cli, flags, line):
    assert _usage_error(cli, *flags) == line


def test_max_model_len_takes_the_token_count_syntax_of_context_lengths_in_validate_and_inspect(cli):
    """One parser: 2k is 2048 tokens for --context-lengths and for both commands' --max-model-len."""
    r = cli("inspect", PAIR / "draft", "--max-model-len", "2k", "--json")
    assert r.code == 0, r.err
    check = next(c for c in r.json()["checks"] if c["name"] == "trained_context")
    assert "(--max-model-len: 2048 tokens)" in check["message"]
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--levels", "static", "--max-model-len", "2K",
            "--json")
    assert r.code == 0, r.err
    assert r.json()["options"]["max_model_len"] == 2048
    r = cli("inspect", PAIR / "draft", "--max-model-len", "\u0662k")
    assert r.code == 2 and r.err.strip().splitlines()[-1] == (
        "Error: Invalid value for '--max-model-len': expected a token count (32768, 32k; k = 1024), got '\u0662k'")


@pytest.mark.parametrize("content, why", [("", "the file is empty"), ("\n  \n", "the file is empty"),
                                          (None, "file is larger than 64 MB")])
def test_a_long_context_file_error_names_the_flag_and_what_the_file_should_be(cli, tmp_path, content, why):
    """Not the prompts file's wording ("no prompts in the file", "not a prompts file"): the user gave two files."""
    f = tmp_path / "long.txt"
    if content is None:
        with f.open("wb") as out:
            out.truncate((64 << 20) + 1)  # sparse: nothing written
    else:
        f.write_text(content)
    prompts = tmp_path / "p.txt"
    prompts.write_text(PAIR.joinpath("prompts.txt").read_text().splitlines()[0] + "\n")
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--levels", "end_to_end", "--prompts", prompts,
            "--max-new-tokens", "8", "--context-lengths", "64", "--long-context-file", f)
    assert r.code == 1 and r.out == "", r.err
    assert r.err.strip().splitlines()[-1] == (
        f"Error: {f}: {why}: not a --long-context-file (the long text --context-lengths cuts its prompts from: a "
        "document, code; token ids, space-separated ints or a JSON list per line, when the target ships no tokenizer)")


def test_chat_template_kwargs_on_token_id_prompts_warn_that_they_have_no_effect(cli, tmp_path):
    """The pair ships no tokenizer: its prompts are token ids and no template renders them, so the variables the
    user set change nothing; a warning says so (the verdict stands) and the profile does not claim them."""
    prompts = tmp_path / "p.txt"
    prompts.write_text(PAIR.joinpath("prompts.txt").read_text().splitlines()[0] + "\n")
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--levels", "end_to_end", "--prompts", prompts,
            "--sampling", "greedy", "--max-new-tokens", "8", "--chat-template-kwargs", '{"enable_thinking": false}',
            "--json")
    assert r.code == 0, r.err
    check = next(c for c in r.json()["checks"] if c["name"] == "chat_template_kwargs")
    assert check["status"] == "warn" and check["message"] == (
        '--chat-template-kwargs {"enable_thinking": false} has no effect: the target ships no tokenizer: its prompts '
        "are token ids")
    assert "chat_template_kwargs" not in r.json()["speculation_profile"]["measurement_conditions"]
