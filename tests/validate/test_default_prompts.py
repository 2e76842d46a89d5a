"""A run on prompts that are neither the user's nor a named set says so wherever its figures are read (the verdict
line, the JSON, the Markdown, the JUnit properties): tau on the built-in random token ids understates a trained draft
several times (the bundled pair: about 3.7 on them, about 14 on its own prompts)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from dflash_convert.validate.options import ValidateOptions
from dflash_convert.validate.prompts import BUILTIN_RANDOM_NOTE
from dflash_convert.validate.report import to_json, verdict_text
from dflash_convert.validate.report_junit import to_junit
from dflash_convert.validate.report_markdown import to_markdown
from dflash_convert.validate.run import validate

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"


def _run(**over):
    return validate(PAIR / "draft", ValidateOptions(target=PAIR / "target", levels=["end_to_end"], max_new_tokens=16,
                                                    sampling="greedy", timing_rounds=1, threads=1, **over))


def test_random_token_id_prompts_are_named_in_every_report():
    report = _run()  # the pair's target ships no tokenizer: the built-in prompts are random token ids
    assert report.passed and report.acceptance.builtin_prompts == BUILTIN_RANDOM_NOTE
    assert "understates a trained draft" in BUILTIN_RANDOM_NOTE and "--prompts" in BUILTIN_RANDOM_NOTE
    assert verdict_text(report).endswith(f", speedup {report.acceptance.speedup:.2f}x on {BUILTIN_RANDOM_NOTE}")
    assert to_json(report)["acceptance"]["builtin_prompts"] == BUILTIN_RANDOM_NOTE
    assert f"x on {BUILTIN_RANDOM_NOTE}" in to_markdown(report)
    props = {p.get("name"): p.get("value") for p in ET.fromstring(to_junit(report)).iter("property")}
    assert props["prompts"] == BUILTIN_RANDOM_NOTE


def test_the_users_prompts_carry_no_note():
    prompts = [[int(t) for t in line.split()] for line in PAIR.joinpath("prompts.txt").read_text().splitlines()[:2]]
    report = _run(prompts=prompts)
    assert report.acceptance.builtin_prompts is None and "built-in" not in verdict_text(report)
    assert 'name="prompts"' not in to_junit(report)
