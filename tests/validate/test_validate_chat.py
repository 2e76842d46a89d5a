"""validate on the traffic a deployment sees: chat templates applied as vLLM's chat endpoint applies them,
the target's sampling defaults from generation_config.json (and every eos id as a stop), standard
prompt sets pulled from a (loopback) Hub dataset repo, reported per set."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from dflash_convert.errors import DFlashError, UsageError
from factories import TEMPLATE, WORDS, chat_target
from runtime_helpers import one_torch_thread  # noqa: F401 (autouse fixture)


# ----------------------------------------------------------------------------- chat templates

def test_text_and_messages_render_as_the_chat_endpoint_does(tiny_target, tmp_path):
    """Text prompts become one user turn; messages render as given; the generation prompt is added and
    the template's BOS is the only one (add_special_tokens=False after rendering); the ids equal
    transformers' own apply_chat_template(tokenize=True), which vLLM 0.33 calls. A planted
    add_special_tokens=True doubles the BOS and fails here."""
    from transformers import AutoTokenizer

    from dflash_convert.validate.prompts import chat_template, load_tokenizer, read_prompts, tokenize_prompts

    target = chat_target(tiny_target, tmp_path / "target")
    prompts = tmp_path / "p.jsonl"
    chat = [{"role": "system", "content": "the cat"}, {"role": "user", "content": "hello world"}]
    prompts.write_text('{"prompt": "hello world"}\n' + json.dumps({"messages": chat}) + "\n3 4 0\n")
    tokenizer = load_tokenizer(target)
    template, described = chat_template(tokenizer, "auto", target)
    assert template == TEMPLATE and "chat template" in described
    ids, _ = tokenize_prompts(read_prompts(prompts), target, 512, set(), tokenizer=tokenizer, template=template)
    w = {x: i for i, x in enumerate(WORDS)}
    assert ids[0] == [w["<s>"], w["user"], w["hello"], w["world"], w["assistant"]]
    assert ids[1] == [w["<s>"], w["system"], w["the"], w["cat"], w["user"], w["hello"], w["world"], w["assistant"]]
    assert ids[2] == [3, 4, 0]  # token ids are taken as given
    own = AutoTokenizer.from_pretrained(target)
    assert ids[1] == own.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    kw_ids, _ = tokenize_prompts(["hello"], target, 512, set(), tokenizer=tokenizer, template=template,
                                 template_kwargs={"enable_thinking": False})
    assert kw_ids[0][-1] == w["nothink"]  # chat_template_kwargs reach the template
    raw, _ = tokenize_prompts(["hello world"], target, 512, set(), tokenizer=tokenizer, template=None)
    assert raw[0] == [w["<s>"], w["hello"], w["world"]]  # no template: the completion endpoint's tokenization


def test_chat_prompts_end_to_end_and_the_template_in_the_report(speculators_drafts, tiny_target, tmp_path, cli):
    target = chat_target(tiny_target, tmp_path / "target")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "the cat sat"}]}) + "\n")
    args = ["validate", speculators_drafts["full"], "--target", target, "--prompts", prompts, "--levels",
            "end_to_end", "--max-new-tokens", "4", "--threads", "1", "--sampling", "greedy", "--json"]
    r = cli(*args, "--chat-template-kwargs", '{"enable_thinking": false}')
    assert r.code == 0, r.err[-2000:]
    a = r.json()["acceptance"]
    assert a["prompts"] == 1 and "chat template" in a["prompt_format"] and "enable_thinking" in a["prompt_format"]
    assert r.json()["options"]["chat_template_kwargs"] == {"enable_thinking": False}
    r = cli(*args[:-1], "--chat-template", "none", "--json")  # messages need a template
    assert r.code == 1 and "messages" in r.err and "--chat-template" in r.err
    assert cli(*args, "--chat-template-kwargs", "[1]").code == 2
    assert cli(*args, "--chat-template-kwargs", '{"tokenize": true}').code == 2


@pytest.mark.parametrize("body,needle", [
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),  # sandboxed, as transformers renders
    ("{{ raise_exception('no system role') }}", "no system role"),
    ("{% for m in messages %}", "TemplateSyntaxError"),
])
def test_a_failing_template_is_one_line_naming_it(speculators_drafts, tiny_target, tmp_path, cli, body, needle):
    target = chat_target(tiny_target, tmp_path / "target", template=None)
    template = tmp_path / "bad.jinja"
    template.write_text(body)
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\n")
    r = cli("validate", speculators_drafts["full"], "--target", target, "--prompts", prompts, "--levels",
            "end_to_end", "--chat-template", template)
    errors = [line for line in r.err.splitlines() if line.startswith("Error:")]
    assert r.code == 1 and len(errors) == 1 and "Traceback" not in r.err, r.err
    assert str(template) in errors[0] and needle in errors[0] and "chat template" in errors[0]


def test_messages_lines_are_checked(tmp_path):
    from dflash_convert.validate.prompts import read_prompts

    p = tmp_path / "p.jsonl"
    for line, needle in [('{"messages": [{"role": "robot", "content": "x"}]}', "messages"),
                         ('{"messages": []}', "messages"),
                         ('{"messages": [{"role": "user", "content": 5}]}', "messages"),
                         ('{"prompt": "x", "messages": [{"role": "user", "content": "x"}]}', "one of them")]:
        p.write_text(line + "\n")
        with pytest.raises(DFlashError, match=needle):
            read_prompts(p)


# ----------------------------------------------------------------------------- sampling defaults

QWEN3_GENERATION = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [510, 7]}


def test_sampling_resolves_as_vllm_does():
    """Flag, else generation_config.json, else vLLM's default (temperature 1.0: vLLM samples when neither
    the request nor the model says otherwise); greedy forces temperature 0; each value says its source."""
    from dflash_convert.validate.options import ValidateOptions
    from dflash_convert.validate.sampling import resolve_sampling

    used = resolve_sampling(ValidateOptions(), QWEN3_GENERATION, "g.json")
    assert (used.temperature, used.top_k, used.top_p, used.min_p) == (0.6, 20, 0.95, 0.0)
    assert used.sources == {"temperature": "generation_config.json", "top_k": "generation_config.json",
                            "top_p": "generation_config.json", "min_p": "vLLM default",
                            "repetition_penalty": "vLLM default", "presence_penalty": "vLLM default",
                            "frequency_penalty": "vLLM default"}
    used = resolve_sampling(ValidateOptions(top_k=5, min_p=0.1), QWEN3_GENERATION, "g.json")
    assert (used.top_k, used.min_p, used.sources["top_k"], used.sources["min_p"]) == (5, 0.1, "--top-k", "--min-p")
    used = resolve_sampling(ValidateOptions(sampling="greedy"), QWEN3_GENERATION, "g.json")
    assert used.temperature == 0 and used.sources["temperature"] == "--sampling greedy"
    used = resolve_sampling(ValidateOptions(), {}, None)
    assert used.temperature == 1.0 and used.sources["temperature"] == "vLLM default" and used.top_k == 0
    assert resolve_sampling(ValidateOptions(top_k=-1), {}, None).top_k == 0  # vLLM's "off", either spelling
    with pytest.raises(DFlashError, match="g.json.*top_p|top_p.*g.json"):
        resolve_sampling(ValidateOptions(), {"top_p": 0}, "g.json")
    with pytest.raises(UsageError, match="greedy"):
        ValidateOptions(sampling="greedy", temperature=0.7).check()


@pytest.mark.parametrize("bad", [dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=-0.1),
                                 dict(temperature=float("inf"))])
def test_sampling_flags_out_of_range_are_usage_errors(tmp_path, bad):
    from dflash_convert.validate import ValidateOptions, validate

    with pytest.raises(UsageError, match="--" + next(iter(bad)).replace("_", "-")):
        validate(tmp_path / "does-not-exist", ValidateOptions(**bad))


def test_the_targets_defaults_and_every_eos_id_are_used(speculators_drafts, tiny_target, tmp_path, cli):
    """A Qwen3-style generation_config.json: the run samples at its temperature / top-k / top-p and says so;
    its extra eos id stops decoding (planted: config.json's eos alone, and the prompt runs on)."""
    import torch

    from dflash_runtime import load_target, target_generate

    prompt = [5, 6, 7, 8, 9, 10]
    first = target_generate(load_target(tiny_target, device="cpu", dtype=torch.float32), prompt,
                            max_new_tokens=1).tokens[0]  # the target's greedy first token
    generation = dict(QWEN3_GENERATION, eos_token_id=[510, first])
    target = chat_target(tiny_target, tmp_path / "target", generation=generation)
    prompts = tmp_path / "p.txt"
    prompts.write_text(" ".join(map(str, prompt)) + "\n")
    args = ["validate", speculators_drafts["full"], "--target", target, "--prompts", prompts, "--levels",
            "end_to_end", "--max-new-tokens", "6", "--threads", "1", "--json"]
    r = cli(*args)
    assert r.code == 0, r.err[-2000:]
    a = r.json()["acceptance"]
    s = a["sampling"]
    assert (s["mode"], s["temperature"], s["top_k"], s["top_p"], s["min_p"]) == ("auto", 0.6, 20, 0.95, 0.0)
    assert s["sources"]["temperature"] == "generation_config.json" and a["temperature"] == 0.6
    assert s["stop_token_sources"] == {"config.json": [510], "generation_config.json": [510, first], "tokenizer": [2]}
    assert s["stop_token_ids"] == sorted({2, 510, first})
    r = cli(*args, "--sampling", "greedy")
    a = r.json()["acceptance"]
    assert r.code == 0 and a["sampling"]["temperature"] == 0 and a["outputs_equal"] == 1
    assert a["new_tokens"] == 1  # greedy's first token is a generation_config eos: decoding stops there


# ----------------------------------------------------------------------------- datasets from the Hub
# against the loopback Hub: tests/conftest.py's hub (the server) and hub_env (its endpoint, cache and token)

def parquet(rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


QUESTIONS = [f"question {i} about the cat" for i in range(10)]


@pytest.mark.usefixtures("hub_env")
def test_a_dataset_pulled_from_the_hub_is_pinned_sampled_and_verified(hub, monkeypatch):
    from huggingface_hub import constants

    from dflash_convert.hub.datasets import DATASETS, dataset_prompts

    sha = hub.seed_repo("openai/gsm8k", {"main/test-00000-of-00001.parquet": parquet(
        [{"question": q, "answer": "42"} for q in QUESTIONS]), "README.md": b"# gsm8k\n"})
    got = dataset_prompts("gsm8k", num_prompts=3, seed=0)
    assert got.commit_sha == sha and got.total == 10 and len(got.prompts) == 3
    assert got.files == ["main/test-00000-of-00001.parquet"] and sha[:12] in got.source
    worded = [DATASETS["gsm8k"].template.replace("{prompt}", q) for q in QUESTIONS]
    assert set(got.prompts) <= set(worded) and got.prompts[0].endswith("within \\boxed{}.")
    assert dataset_prompts("gsm8k", num_prompts=3, seed=0).prompts == got.prompts  # the same rows every run
    assert dataset_prompts("gsm8k", num_prompts=3, seed=1).prompts != got.prompts
    assert dataset_prompts(f"gsm8k@{sha}").total == 10  # a pinned commit
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # offline: the cache, at the commit recorded
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert dataset_prompts("gsm8k", num_prompts=3, seed=0).prompts == got.prompts
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    cached = next(Path(constants.HF_HUB_CACHE).rglob("test-00000-of-00001.parquet")).resolve()
    cached.write_bytes(cached.read_bytes()[:-1] + b"\0")  # a corrupt copy in the cache
    with pytest.raises(DFlashError, match="does not match the hash"):
        dataset_prompts("gsm8k")
    with pytest.raises(UsageError, match="gsm8k, math500"):
        dataset_prompts("gsm9k")


@pytest.mark.usefixtures("hub_env")
def test_a_dataset_revision_naming_no_ref_is_refused_before_any_request(hub):
    """`--dataset NAME@REVISION` passes the same check as --revision: the client would write `a/../../b`
    under the cache's refs/ directory, so it is a usage error before the Hub is asked anything."""
    from dflash_convert.hub.datasets import dataset_prompts

    hub.seed_repo("openai/gsm8k", {"main/test-00000-of-00001.parquet": parquet([{"question": "q"}])})
    for revision in ("a/../../b", "main/", "a b"):
        with pytest.raises(UsageError, match="--dataset gsm8k@REVISION .* is not a branch, tag or commit id"):
            dataset_prompts(f"gsm8k@{revision}")
    assert hub.requests == []


@pytest.mark.usefixtures("hub_env")
def test_datasets_table_tau_per_set_end_to_end(hub, speculators_drafts, tiny_target, tmp_path, cli):
    """`--dataset` twice: prompts from each repo (Parquet and JSONL), tau and per-position rates per set, which
    merge to the whole run's."""
    hub.seed_repo("openai/gsm8k", {"main/test-00000-of-00001.parquet": parquet([{"question": q} for q in QUESTIONS])})
    hub.seed_repo("HuggingFaceH4/MATH-500", {"test.jsonl": "".join(json.dumps({"problem": f"hello world {i}"}) + "\n"
                                                                   for i in range(5)).encode()})
    target = chat_target(tiny_target, tmp_path / "target")
    r = cli("validate", speculators_drafts["full"], "--target", target, "--dataset", "gsm8k", "--dataset", "math500",
            "--num-prompts", "2", "--levels", "end_to_end", "--max-new-tokens", "4", "--threads", "1",
            "--sampling", "greedy", "--json")
    assert r.code == 0, r.err[-2000:]
    a = r.json()["acceptance"]
    sets = a["per_prompt_set"]
    assert list(sets) == ["gsm8k", "math500"] and a["prompts"] == 4
    assert all(s["prompts"] == 2 and len(s["per_position_rates"]) == a["block_size"] - 1 for s in sets.values())
    assert "openai/gsm8k@" in sets["gsm8k"]["source"] and "test.jsonl" in sets["math500"]["source"]
    assert sum(s["num_drafts"] for s in sets.values()) == a["num_drafts"]
    assert sum(s["accepted"] for s in sets.values()) == a["accepted"]
    r = cli("validate", speculators_drafts["full"], "--target", target, "--dataset", "humaneval", "--levels",
            "end_to_end")
    assert r.code == 1 and "openai/openai_humaneval" in r.err  # no such repo on this Hub: one line naming it


MT_BENCH = [{"prompt": [f"hello world {i}", f"the cat sat {i}"]} for i in range(4)]


@pytest.mark.usefixtures("hub_env")
def test_mbpp_and_mt_bench_second_turns(hub, speculators_drafts, tiny_target, tmp_path, cli):
    """mbpp as z-lab's benchmark reads it (sanitized config, test split, `prompt` as the user turn); MT-Bench's
    second turn after the target's own answer to the first (decoded without special tokens and rendered as
    the assistant turn, as z-lab's benchmark feeds it back): the measured prompt holds the first turn, the
    target's greedy answer and the second turn."""
    from transformers import AutoTokenizer

    from dflash_convert.hub.datasets import dataset_prompts
    from dflash_runtime import Sampling, load_target, target_generate
    import torch

    hub.seed_repo("google-research-datasets/mbpp", {"sanitized/test-00000-of-00001.parquet": parquet(
        [{"prompt": f"the cat {i}", "code": "x"} for i in range(3)])})
    hub.seed_repo("HuggingFaceH4/mt_bench_prompts", {"data/train-00000-of-00001.parquet": parquet(MT_BENCH)})
    assert dataset_prompts("mbpp").prompts == ["the cat 0", "the cat 1", "the cat 2"]
    second = dataset_prompts("mt-bench-2").prompts
    assert second[0] == [{"role": "user", "content": "hello world 0"},
                         {"role": "assistant", "content": None, "generate": True},
                         {"role": "user", "content": "the cat sat 0"}]
    target = chat_target(tiny_target, tmp_path / "target", every_id=True)  # the answers decode to text
    r = cli("validate", speculators_drafts["full"], "--target", target, "--dataset", "mt-bench-2", "--dataset",
            "mbpp", "--num-prompts", "2", "--levels", "end_to_end", "--max-new-tokens", "5", "--threads", "1",
            "--sampling", "greedy", "--json")
    assert r.code == 0, r.err[-2000:]
    a = r.json()["acceptance"]
    assert list(a["per_prompt_set"]) == ["mt-bench-2", "mbpp"] and a["prompts"] == 4
    # the first measured prompt, rebuilt: the target's greedy answer to its first turn, then its second turn
    tok = AutoTokenizer.from_pretrained(target)
    rows = dataset_prompts("mt-bench-2", num_prompts=2).prompts
    model = load_target(target, device="cpu", dtype=torch.float32)
    first = tok.apply_chat_template([rows[0][0]], add_generation_prompt=True, tokenize=False)
    answer = target_generate(model, tok(first, add_special_tokens=False)["input_ids"], max_new_tokens=5,
                             sampling=Sampling(stop_token_ids=(2, 510))).tokens
    text = tok.decode(answer, skip_special_tokens=True)
    assert text.strip()  # a real answer to feed back, not an empty turn
    chat = [rows[0][0], {"role": "assistant", "content": text}, rows[0][2]]
    full = tok(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False),
               add_special_tokens=False)["input_ids"]
    unanswered = tok(tok.apply_chat_template([rows[0][0], {"role": "assistant", "content": ""}, rows[0][2]],
                                             add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)["input_ids"]
    assert a["per_prompt"][0]["prompt_tokens"] == len(full) > len(unanswered)
