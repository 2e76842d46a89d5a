"""Prompt categories (a JSONL `category` field, as SpecBench and SPEED-Bench files carry): tau, per-position
rates and outputs equal per category, and --min-acceptance-length CATEGORY=X gates that exit 3 naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_convert.errors import DFlashError
from dflash_convert.validate.prompts import read_prompts

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
CATEGORIES = ["code", "prose", "code", "code"]  # unequal groups: a category given another's prompts shows

pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup


def test_categories_align_with_the_prompts_they_come_with(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("a plain line\n" + json.dumps({"prompt": "x", "category": "code"}) + "\n"
                 + json.dumps({"prompt": [1, 2]}) + "\n[3, 4]\n" + json.dumps({"prompt": "y", "category": "qa"}) + "\n")
    categories: list = []
    assert len(read_prompts(f, categories)) == 5
    assert categories == [None, "code", None, None, "qa"]
    f.write_text(json.dumps({"prompt": "x", "category": 3}) + "\n")
    with pytest.raises(DFlashError, match="line 1: `category` must be non-empty text"):
        read_prompts(f, [])


@pytest.fixture(scope="module")
def categorized(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("categories") / "prompts.jsonl"
    lines = PAIR.joinpath("prompts.txt").read_text().splitlines()[:4]
    f.write_text("".join(json.dumps({"prompt": [int(t) for t in line.split()], "category": CATEGORIES[i]})
                         + "\n" for i, line in enumerate(lines)))
    return f


def _run(cli, prompts: Path, *thresholds: str):
    return cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", prompts, "--levels",
               "end_to_end", "--sampling", "greedy", "--max-new-tokens", "16", *thresholds, "--json")


def test_per_category_figures_and_a_category_gate_that_fails_by_name(cli, categorized):
    r = _run(cli, categorized, "--min-acceptance-length", "1.5,code=99,prose=1.5")
    assert r.code == 3, r.err
    a = r.json()["acceptance"]
    assert list(r.failed_checks()) == ["acceptance_length[code]"]
    assert "category code: tau" in r.failed_checks()["acceptance_length[code]"] and "over" in \
        r.failed_checks()["acceptance_length[code]"] and "3 prompts (block 16); required >= 99" in \
        r.failed_checks()["acceptance_length[code]"]
    prose = next(c for c in r.json()["checks"] if c["name"] == "acceptance_length[prose]")
    assert prose["status"] == "pass"
    cats = {c["category"]: c for c in a["per_category"]}
    assert list(cats) == ["code", "prose"]
    for name in cats:  # each category's counts are its prompts' own, recomputed from them
        mine = [p for p, c in zip(a["per_prompt"], CATEGORIES) if c == name]
        assert cats[name]["prompts"] == cats[name]["outputs_equal"] == CATEGORIES.count(name)
        assert cats[name]["num_drafts"] == sum(p["steps"] for p in mine)
        assert cats[name]["accepted"] == sum(k * n for p in mine for k, n in enumerate(p["accepted_histogram"]))
        assert cats[name]["accepted_histogram"] == [sum(h) for h in zip(*(p["accepted_histogram"] for p in mine))]
    profile = r.json()["speculation_profile"]["per_category"]
    assert profile["code"]["mean_accept_length"] == pytest.approx(cats["code"]["acceptance_length"], abs=1e-4)
    assert "tau per prompt category" in r.err and "min 99 LOW" in r.err


def test_a_category_no_prompt_carries_is_a_usage_error_not_a_pass(cli, categorized):
    r = _run(cli, categorized, "--min-acceptance-length", "math=3")
    assert r.code == 2 and "names category 'math', which no prompt in" in r.err, r.err
    assert "'code', 'prose'" in r.err and len(r.err.strip().splitlines()) == 1 and "did you mean" not in r.err
    r = _run(cli, categorized, "--min-acceptance-length", '{"": 1, "Code": 3}')
    assert r.code == 2 and "'Code' (did you mean 'code'?)" in r.err, r.err
    r = _run(cli, categorized, "--min-acceptance-length", "code=x")
    assert r.code == 2 and "CATEGORY=X" in r.err


@pytest.mark.parametrize("value", ["9,3", "3,code=4,code=5", "3,=4"])
def test_a_threshold_given_twice_or_unnamed_is_a_usage_error(cli, value):
    """A second value for the same gate would replace the first (9,3 gated at 3: a draft at tau 7 passed): exit 2,
    before anything runs."""
    r = cli("validate", "examples/pair/draft", "--min-acceptance-length", value)
    assert r.code == 2 and "--min-acceptance-length" in r.err, r.err


def test_two_reports_on_one_path_are_a_usage_error(cli, tmp_path):
    """--junit and --profile-out on one file: the JUnit would hold the profile (CI cannot read it): exit 2."""
    same = tmp_path / "same.xml"
    r = cli("validate", "examples/pair/draft", "--junit", same, "--profile-out", same)
    assert r.code == 2 and "writes that file too" in r.err, r.err


def test_thresholds_as_a_json_object_name_any_category():
    """A category holding `,` or `=` cannot be named in X,CATEGORY=X; a JSON object names it, key "" the whole run."""
    import typer

    from dflash_convert.cli._params import thresholds

    assert thresholds('{"": 3, "qa, misc": 4, "a=b": 2.5}') == {"": 3.0, "qa, misc": 4.0, "a=b": 2.5}
    assert thresholds("3,code=4") == {"": 3.0, "code": 4.0}  # the plain form unchanged
    for bad, words in (('{"qa": 4, "qa": 3}', "two thresholds for category 'qa'"), ('{"qa": "4"}', "numbers"),
                       ('{"qa": true}', "numbers"), ('{"qa": 4', "not JSON")):
        with pytest.raises(typer.BadParameter, match=words):
            thresholds(bad)


def test_a_category_named_with_a_comma_is_gated_by_json(cli, tmp_path):
    f = tmp_path / "prompts.jsonl"
    lines = PAIR.joinpath("prompts.txt").read_text().splitlines()[:2]
    f.write_text("".join(json.dumps({"prompt": [int(t) for t in line.split()], "category": name}) + "\n"
                         for line, name in zip(lines, ["qa, misc", "x=y"])))
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", f, "--levels", "end_to_end",
            "--sampling", "greedy", "--max-new-tokens", "8", "--min-acceptance-length",
            '{"": 1, "qa, misc": 99, "x=y": 1}', "--json")
    assert r.code == 3 and list(r.failed_checks()) == ["acceptance_length[qa, misc]"], r.err
    assert next(c for c in r.json()["checks"] if c["name"] == "acceptance_length[x=y]")["status"] == "pass"
    assert r.json()["options"]["min_category_acceptance_length"] == {"qa, misc": 99.0, "x=y": 1.0}
