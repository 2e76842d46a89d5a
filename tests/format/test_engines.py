"""The engine reading table: each rule on configs shaped like the engines' own fixtures and like the
checkpoints speculators 0.9.0 saves, our outputs read as trained in both directions, and the
`inspect` / `validate` / `diff` surfaces that report it."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from factories import read_config

from dflash_convert import regenerate
from dflash_convert.format import engine_reading, engine_views, engines, mapping
from dflash_convert.format.engine_views import engine_view
from dflash_convert.format.engines import ENGINES_BY_KEY

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = json.loads((ROOT / "tests" / "fixtures" / "speculators-0.9.0-tiny-config.json").read_text())


def views(raw: dict, tensors=(), fc_shape=None, trained: dict | None = None) -> dict[str, engine_views.EngineView]:
    """Every engine row that reads this config's format, on this config (the trained semantics from
    `trained` when given: for configs our own parser refuses, but an engine would still read)."""
    spec = mapping.spec_from_config(trained or raw)
    return {e.key: engine_view(e, spec, raw, tensors=tensors, fc_shape=fc_shape)
            for e in engines.ENGINES if e.reads == spec.source_format}


def errors(view) -> set[str]:
    return {d.field for d in view.divergences if d.severity == "error"}


def speculators_config(**top) -> dict:
    raw = copy.deepcopy(REFERENCE)
    raw["speculators_config"]["verifier"]["name_or_path"] = "Qwen/Qwen3-8B"
    tl = top.pop("transformer_layer_config", {})
    raw["transformer_layer_config"].update(tl)
    raw.update(top)
    return raw


def hf_config(**over) -> dict:
    """The shape z-lab publishes (Qwen3-8B-DFlash-b16): flat Qwen3 dims, dflash_config, no causal keys."""
    dc = over.pop("dflash_config", {})
    raw = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "vocab_size": 512, "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "use_sliding_window": False,
           "sliding_window": None, "max_window_layers": 2, "num_target_layers": 8, "block_size": 16,
           "layer_types": ["full_attention", "full_attention"],
           "dflash_config": {"mask_token_id": 511, "target_layer_ids": [0, 3, 5], **dc}}
    raw.update(over)
    return raw


# ----------------------------------------------------------------------------- causality

def test_vllm_speculators_applies_one_causality_flag_to_every_layer():
    full = {"layer_types": ["full_attention"] * 2}
    saved = views(speculators_config(sliding_window_non_causal=False, transformer_layer_config=full))
    v = saved["vllm-speculators"]
    assert v.layer_causal == [True, True] and "layer_causal" in errors(v)  # speculators trained them non-causal
    assert "sliding_window_non_causal: true" in next(d.fix for d in v.divergences if d.field == "layer_causal")
    ours = views(speculators_config(sliding_window_non_causal=True, transformer_layer_config=full))
    assert ours["vllm-speculators"].layer_causal == [False, False] and ours["vllm-speculators"].as_trained
    # absent key: vLLM's default is non-causal
    absent = speculators_config(transformer_layer_config=full)
    del absent["sliding_window_non_causal"]
    assert views(absent)["vllm-speculators"].layer_causal == [False, False]
    mixed = views(speculators_config(transformer_layer_config={"layer_types": ["full_attention", "sliding_attention"]}))
    v = mixed["vllm-speculators"]
    assert v.layer_causal == [True, True]
    assert "convert --to hf" in next(d.fix for d in v.divergences if d.field == "layer_causal")


@pytest.mark.parametrize("key", ["sglang", "zlab"])
def test_sglang_and_zlab_read_only_top_level_is_causal(key):
    sliding = {"layer_types": ["sliding_attention"] * 2, "use_sliding_window": True, "sliding_window": 64}
    only_nested = hf_config(**sliding, dflash_config={"causal": False})
    v = views(only_nested)
    assert v["vllm-hf"].layer_causal == [False, False] and v["vllm-hf"].causal_source == "dflash_config.causal"
    assert v[key].layer_causal == [True, True] and "layer_causal" in errors(v[key])  # sliding default: causal
    both = views(hf_config(**sliding, is_causal=False, dflash_config={"causal": False}))
    assert all(x.layer_causal == [False, False] and "layer_causal" not in errors(x) for x in both.values())


def test_vllm_hf_prefers_is_causal_over_dflash_config_causal():
    v = views(hf_config(is_causal=True, dflash_config={"causal": False}))
    assert all(x.layer_causal == [True, True] and x.causal_source == "is_causal" for x in v.values())


def test_mixed_layers_default_per_layer_and_need_vllm_v2_runner():
    v = views(hf_config(layer_types=["full_attention", "sliding_attention"], use_sliding_window=True,
                        sliding_window=64))
    assert {k: x.layer_causal for k, x in v.items()} == {k: [False, True] for k in v}
    assert all(x.as_trained for x in v.values())
    assert any(d.field == "layer_types" and d.severity == "warning" and "V1 model runner" in d.consequence
               and "VLLM_USE_V2_MODEL_RUNNER=1" in d.fix for d in v["vllm-hf"].divergences)
    assert not any("runner" in d.consequence for d in v["sglang"].divergences + v["zlab"].divergences)


# ----------------------------------------------------------------------------- layer ids

def test_unsorted_ids_are_concatenated_sorted_by_vllm_and_sglang_as_listed_by_zlab():
    v = views(hf_config(dflash_config={"target_layer_ids": [5, 0, 3]}))
    assert v["vllm-hf"].target_layer_ids == [0, 3, 5] and "target_layer_ids" in errors(v["vllm-hf"])
    assert v["sglang"].target_layer_ids == [0, 3, 5] and "target_layer_ids" in errors(v["sglang"])
    assert v["zlab"].target_layer_ids == [5, 0, 3] and "target_layer_ids" not in errors(v["zlab"])
    s = views(speculators_config(aux_hidden_state_layer_ids=[6, 1, 4]))["vllm-speculators"]
    assert s.target_layer_ids == [0, 3, 5] and "target_layer_ids" in errors(s)


def test_duplicate_ids_shrink_the_features_vllm_captures():
    v = views(hf_config(dflash_config={"target_layer_ids": [3, 3, 5]}), fc_shape=(64, 192), trained=hf_config())
    assert v["vllm-hf"].fc_input_width == 128 and not v["vllm-hf"].loads
    assert v["zlab"].fc_input_width == 192 and v["zlab"].loads


def test_last_target_layer_id():
    v = views(hf_config(dflash_config={"target_layer_ids": [1, 4, 7]}))  # 8-layer target: 7 is the last
    assert v["vllm-hf"].as_trained
    assert not v["sglang"].loads and "target_layer_ids" in errors(v["sglang"])
    assert v["zlab"].loads and "target_layer_ids" in errors(v["zlab"])
    assert "AFTER the final norm" in next(d.consequence for d in v["zlab"].divergences if d.field == "target_layer_ids")
    assert views(speculators_config(aux_hidden_state_layer_ids=[2, 5, 8], num_target_layers=8))[
        "vllm-speculators"].as_trained


def test_missing_ids():
    raw = hf_config()
    del raw["dflash_config"]["target_layer_ids"]
    v = views(raw)
    assert not v["zlab"].loads and v["sglang"].loads and v["vllm-hf"].loads
    assert all("target_layer_ids" in errors(x) for x in v.values())
    top = hf_config(target_layer_ids=[0, 3, 5])
    del top["dflash_config"]["target_layer_ids"]
    assert all(x.target_layer_ids == [0, 3, 5] and x.target_layer_ids_source == "target_layer_ids"
               for x in views(top).values())


# ----------------------------------------------------------------------------- block size, vocab, widths, window

def test_block_size_sources():
    raw = hf_config()
    del raw["block_size"]
    v = views(raw)
    assert v["sglang"].block_size == 16 and v["sglang"].block_size_source == "default 16"
    assert v["zlab"].block_size == 16
    nested = hf_config(dflash_config={"block_size": 8})
    del nested["block_size"]
    nested = views(nested)
    assert nested["sglang"].block_size == 8 and nested["sglang"].block_size_source == "dflash_config.block_size"
    assert nested["vllm-hf"].block_size is None  # from the serving flag
    assert any(d.field == "block_size" and "num_speculative_tokens=" in d.fix for d in nested["vllm-hf"].divergences)
    s = speculators_config()
    s["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 7  # block_size says 16
    sv = views(s, trained=speculators_config())["vllm-speculators"]
    assert sv.block_size == 8 and "block_size" in errors(sv)


def test_pruned_vocab_served_only_by_vllm():
    raw = hf_config(draft_vocab_size=128)
    v = views(raw, tensors={"lm_head.weight", "d2t", "fc.weight"})
    assert v["vllm-hf"].as_trained and v["vllm-hf"].vocab == "own lm_head + d2t"
    for key in ("sglang", "zlab"):
        assert "vocab" in errors(v[key]) and v[key].vocab.startswith("target lm_head")
    no_d2t = views(raw, tensors={"lm_head.weight", "fc.weight"})["vllm-hf"]
    assert "vocab" in errors(no_d2t) and "zeros" in no_d2t.vocab


def test_target_hidden_size_is_read_only_by_vllm():
    v = views(hf_config(target_hidden_size=128), fc_shape=(64, 384))
    assert v["vllm-hf"].fc_input_width == 384 and v["vllm-hf"].loads
    assert not v["sglang"].loads and not v["zlab"].loads


def test_sliding_window_needs_use_sliding_window_in_hf_configs():
    raw = hf_config(layer_types=["sliding_attention"] * 2, sliding_window=64, use_sliding_window=False, is_causal=True)
    v = views(raw)
    assert not v["vllm-hf"].loads and not v["sglang"].loads  # both refuse sliding layers without a window
    assert v["zlab"].loads and "sliding_window" in errors(v["zlab"])  # attends the whole context
    swa = hf_config(layer_types=["sliding_attention"] * 2, sliding_window=64, use_sliding_window=False,
                    is_causal=True, dflash_config={"swa_window_size": 64})
    assert views(swa)["vllm-hf"].sliding_window == 64


def test_sliding_window_semantics_differ_from_training():
    v = views(hf_config(layer_types=["sliding_attention"] * 2, sliding_window=64, use_sliding_window=True))
    for x in v.values():
        d = next(d for d in x.divergences if d.field == "sliding_window")
        assert d.severity == "warning" and x.window_semantics == "per_query" and x.as_trained


def test_speculators_layer_types_are_read_as_written_by_vllm():
    raw = speculators_config(transformer_layer_config={"layer_types": None, "max_window_layers": 0})
    del raw["transformer_layer_config"]["layer_types"]
    v = views(raw)["vllm-speculators"]
    assert v.layer_types == ["full_attention"] * 2 and "layer_types" in errors(v)


def test_mask_and_verifier():
    raw = hf_config()
    del raw["dflash_config"]["mask_token_id"]
    v = views(raw)
    assert v["sglang"].loads and not v["zlab"].loads and not v["vllm-hf"].loads
    local = views(speculators_config())
    assert local["vllm-speculators"].as_trained
    path = speculators_config()
    path["speculators_config"]["verifier"]["name_or_path"] = "/models/Qwen3-8B"
    d = next(d for d in views(path)["vllm-speculators"].divergences if d.field == "verifier")
    assert d.severity == "warning" and "local path" in d.consequence
    none = speculators_config()
    none["speculators_config"]["verifier"]["name_or_path"] = None
    assert "verifier" in errors(views(none)["vllm-speculators"])


def test_engine_reads_keys():
    assert not engines.engine_reads("auto_map") and not engines.engine_reads("transformers_version")
    assert not engines.engine_reads("dflash_config.verifier.name_or_path")
    assert engines.engine_reads("is_causal") and engines.engine_reads("dflash_config.causal")
    assert engines.engine_reads("transformer_layer_config.sliding_window")
    assert engines.engine_reads("speculators_config.proposal_methods")
    assert not engines.engine_reads("transformer_layer_config.initializer_range")


# ----------------------------------------------------------------------------- our outputs, both directions

# Differences from training an engine cannot avoid whatever config we write (the rest must be none).
INHERENT = {
    ("pruned", "sglang"): {"vocab"}, ("pruned", "zlab"): {"vocab"},
    ("last_layer", "sglang"): {"target_layer_ids"}, ("last_layer", "zlab"): {"target_layer_ids"},
    ("bias_last_layer", "sglang"): {"target_layer_ids"}, ("bias_last_layer", "zlab"): {"target_layer_ids"},
    ("mixed", "vllm-speculators"): {"layer_causal"},
}


@pytest.mark.parametrize("name", ["full", "pruned", "mixed", "non_causal", "all_full", "last_layer",
                                  "bias_last_layer"])
def test_outputs_are_read_as_trained_in_both_directions(cli, speculators_drafts, tiny_target, tmp_path, name):
    from dflash_convert.io.checkpoint import open_checkpoint

    hf, back = tmp_path / "hf", tmp_path / "back"
    assert cli("convert", speculators_drafts[name], "-o", hf, "--verifier", tiny_target).code == 0
    assert cli("convert", hf, "-o", back, "--verifier", tiny_target).code == 0
    for path in (hf, back):
        ckpt = open_checkpoint(path)
        for view in engine_views.checkpoint_views(ckpt):
            if view.via_conversion:
                continue
            assert errors(view) == INHERENT.get((name, view.engine), set()), (path.name, view.engine, view.divergences)
    cfg = read_config(hf)
    uniform = len(set(open_checkpoint(hf).spec.layer_causal)) == 1
    assert ("is_causal" in cfg) == uniform and cfg.get("is_causal") == cfg["dflash_config"].get("causal")
    assert cfg["use_sliding_window"] is True or "sliding_attention" not in cfg["layer_types"]


def test_attention_bias_last_layer_round_trip_is_bit_exact(cli, speculators_drafts, tiny_target, tmp_path):
    from factories import assert_bit_identical, tensors_of

    src, hf, back = speculators_drafts["bias_last_layer"], tmp_path / "hf", tmp_path / "back"
    assert cli("convert", src, "-o", hf, "--verifier", tiny_target).code == 0
    assert read_config(hf)["attention_bias"] is True and read_config(hf)["dflash_config"]["target_layer_ids"] == [0, 3, 7]
    assert cli("convert", hf, "-o", back, "--verifier", tiny_target).code == 0
    a, b = tensors_of(src), tensors_of(back)
    assert any(n.endswith("o_proj.bias") for n in b)
    assert_bit_identical(a, b, set(a) - {"verifier_lm_head.weight", "verifier_norm.weight", "embed_tokens.weight"})
    assert cli("diff", src, back).code == 0 and cli("diff", src, hf).code == 0


def test_conversion_record_lists_config_changes(cli, speculators_drafts, tmp_path):
    hf, back = tmp_path / "hf", tmp_path / "back"
    assert cli("convert", speculators_drafts["all_full"], "-o", hf).code == 0
    changes = {c["key"]: c for c in json.loads((hf / "conversion.json").read_text())["config_changes"]}
    assert changes["auto_map"]["change"] == "dropped" and changes["is_causal"]["change"] == "added"
    assert changes["sliding_window_non_causal"]["change"] == "dropped"
    assert "dflash_config.target_layer_ids" not in changes  # moved and renumbered: same meaning, not a change
    assert cli("convert", hf, "-o", back).code == 0
    back_changes = {c["key"]: c for c in json.loads((back / "conversion.json").read_text())["config_changes"]}
    assert back_changes["sliding_window_non_causal"] == {
        "key": "sliding_window_non_causal", "change": "added", "before": None, "after": True,
        "why": back_changes["sliding_window_non_causal"]["why"]}
    # diff: the round trip is equivalent; what no engine reads is listed, not counted
    r = cli("diff", speculators_drafts["all_full"], back, "--json")
    assert r.code == 0, r.err
    report = r.json()
    # speculators' save stamps the top level with the writer's transformers version on every version admitted
    # (5.24 stamps the decoder's sub-config too, which the HF config carries, so only the top-level one goes):
    # the round trip drops that stamp, and lists it, whichever version wrote it
    stamp = read_config(speculators_drafts["all_full"])["transformers_version"]
    informational = {c["key"]: c for c in report["informational"]}
    assert report["equivalent"] and "auto_map" in informational
    assert informational["transformers_version"] | {"why": None} == {
        "key": "transformers_version", "change": "dropped", "before": stamp, "after": None, "why": None}
    assert report["engines"]["vllm"] == {**report["engines"]["vllm"], "a": False, "b": True}  # vLLM: causal vs not
    r = cli("diff", speculators_drafts["all_full"], back)
    assert "auto_map" in r.out and "no engine reads it" in r.out


# ----------------------------------------------------------------------------- inspect / validate / README

def test_inspect_engine_views_and_schema(cli, speculators_drafts):
    import jsonschema

    r = cli("inspect", speculators_drafts["all_full"], "--json")
    assert r.code == 3, r.err  # vLLM reads this speculators config as causal: an engine view that errs fails
    report = r.json()
    assert set(r.failed_checks()) == {"engine_view.vllm-speculators"}, r.failed_checks()
    jsonschema.validate(report, json.loads((ROOT / "schemas" / "inspect-report.schema.json").read_text()))
    by_engine = {v["engine"]: v for v in report["engines"]}
    assert set(by_engine) == {"vllm-speculators", "vllm-hf", "sglang", "zlab", "transformers"}
    assert by_engine["vllm-speculators"]["layer_causal"] == [True, True]  # speculators wrote false
    assert by_engine["sglang"]["via_conversion"] and by_engine["sglang"]["layer_causal"] == [False, False]
    r = cli("inspect", speculators_drafts["all_full"], "--engine", "sglang", "--json")
    assert [v["engine"] for v in r.json()["engines"]] == ["sglang"]
    r = cli("inspect", speculators_drafts["all_full"], "--engine", "vllm")
    assert "vLLM (speculators format), by 0.33.0's rules: DIFFERS from training" in r.out and "layer_causal" in r.out
    assert cli("inspect", speculators_drafts["all_full"], "--engine", "tgi").code == 2


def test_validate_engine_runs_the_engine_semantics(cli, speculators_drafts, tmp_path):
    """vLLM serves speculators' own all-full save causally: validate --engine vllm fails engine_fidelity and its
    numeric probe sees causal layers; our conversion passes; without --engine the trained semantics run."""
    src = speculators_drafts["all_full"]
    r = cli("validate", src, "--engine", "vllm", "--levels", "static,numeric", "--backend", "eager", "--json")
    assert r.code == 3
    checks = {c["name"]: c for c in r.json()["checks"]}
    assert checks["engine_fidelity"]["status"] == "fail" and "sliding_window_non_causal" in \
        checks["engine_fidelity"]["message"]
    assert "0:causal, 1:causal" in checks["causality_behaviour.eager"]["message"]
    hf = tmp_path / "hf"
    assert cli("convert", src, "-o", hf).code == 0
    r = cli("validate", hf, "--engine", "vllm", "--levels", "static,numeric", "--backend", "eager", "--json")
    checks = {c["name"]: c for c in r.json()["checks"]}
    assert r.code == 0 and checks["engine_fidelity"]["status"] in ("pass", "warn")
    assert "0:non-causal, 1:non-causal" in checks["causality_behaviour.eager"]["message"]
    r = cli("validate", src, "--levels", "static,numeric", "--backend", "eager", "--json")
    assert r.code == 0 and "engine_fidelity" not in {c["name"] for c in r.json()["checks"]}
    assert cli("validate", src, "--engine", "vllm", "--causal").code == 2


def test_validate_engine_that_cannot_load_skips_the_runtime_levels(cli, speculators_drafts, tiny_target):
    """A last-layer id: SGLang never captures it. The target's config tells which layer is the last."""
    src = speculators_drafts["last_layer"]
    r = cli("validate", src, "--engine", "sglang", "--target", tiny_target / "config.json", "--json")
    assert r.code == 3
    report = r.json()
    fidelity = next(c for c in report["checks"] if c["name"] == "engine_fidelity")
    assert fidelity["status"] == "fail" and "id 7 is the target's last layer" in fidelity["message"]
    assert "SGLang" in report["levels_skipped"]["numeric"]
    r = cli("validate", src, "--engine", "vllm", "--target", tiny_target / "config.json", "--levels", "static")
    assert r.code == 0, r.err


def test_readme_engine_section_is_generated_from_the_table():
    page = (ROOT / "docs" / "engines.md").read_text()
    m = re.search(r"<!-- engines-table:start -->\n(.*?)<!-- engines-table:end -->", page, re.S)
    assert m, "docs/engines.md lacks its generated table's markers"
    assert m.group(1) == engines.render_markdown(), f"docs/engines.md's engine table is stale: run {regenerate.COMMAND}"


def test_every_rule_kind_has_its_text_and_every_engine_row_is_known():
    for e in engines.ENGINES:
        for field, texts in engines.RULE_TEXT.items():
            assert getattr(e, field) in texts, (e.key, field)
    assert {e.key: e.engine for e in engines.ENGINES} == {"vllm-speculators": "vllm", "vllm-hf": "vllm",
                                                          "sglang": "sglang", "zlab": "zlab",
                                                          "transformers": "transformers"}
    # one text per kind: the README table (tested above to be current) then pins every rule of every row,
    # shared ones (vLLM's two paths) included
    for field, texts in engines.RULE_TEXT.items():
        assert len(set(texts.values())) == len(texts), f"two kinds of {field} have the same text"


def test_a_mistyped_rule_kind_is_refused():
    """A rule kind outside its field's enum fails when the row is built (the table at import), instead of
    reading configs through whatever branch a misspelled string would have fallen into; a kind without its
    README text (engines.py) or its reader (engine_reading.py) fails those modules' import checks."""
    import dataclasses

    row = ENGINES_BY_KEY["sglang"]
    with pytest.raises(ValueError, match="'sglang': causality 'is_causal_then_slidnig' is not a rule kind"):
        dataclasses.replace(row, causality="is_causal_then_slidnig")
    with pytest.raises(ValueError, match="reads 'HF' is not a rule kind"):
        dataclasses.replace(row, reads="HF")
    assert dataclasses.replace(row, causality="is_causal_then_sliding") == row  # a name is taken as its kind
    text = {**engines.RULE_TEXT, "mixed": {k: v for k, v in engines.RULE_TEXT["mixed"].items() if k != "supported"}}
    with pytest.raises(ValueError, match="RULE_TEXT\\['mixed'\\] and the kinds of mixed differ: \\['supported'\\]"):
        engines._check_tables(text)
    readers = {**engine_reading.READERS, "window": {k: f for k, f in engine_reading.READ_WINDOW.items() if k != "raw"}}
    with pytest.raises(ValueError, match="the readers\\['window'\\] and the kinds of window differ: \\['raw'\\]"):
        engine_reading._check_readers(readers)


def test_vllm_hf_reads_eagle_aux_ids_first():
    v = views(hf_config(eagle_aux_hidden_state_layer_ids=[2, 5, 7]))
    assert v["vllm-hf"].target_layer_ids == [1, 4, 6] and "target_layer_ids" in errors(v["vllm-hf"])
    assert v["sglang"].target_layer_ids == [0, 3, 5] and v["sglang"].as_trained


def test_mask_embedding_file_is_used_by_vllm_and_sglang_only(cli, speculators_drafts, tmp_path):
    import shutil

    from dflash_convert.io.checkpoint import open_checkpoint

    hf = tmp_path / "hf"
    assert cli("convert", speculators_drafts["full"], "-o", hf).code == 0
    (hf / engines.MASK_EMBEDDING_FILE).write_bytes(b"not read: only its presence matters here")
    by = {v.engine: v for v in engine_views.checkpoint_views(open_checkpoint(hf))}
    assert "mask_embedding" in errors(by["zlab"])
    assert "mask_embedding" not in errors(by["sglang"]) | errors(by["vllm-hf"])
    assert "mask_embedding" not in errors(by["vllm-speculators"])  # via conversion: convert carries the file
    shutil.rmtree(hf)


def test_validate_engine_reports_the_acceptance_that_deployment_gets(tmp_path):
    """The trained (causal) pair in an HF config that states causality only in dflash_config.causal with
    full-attention layer types: vLLM runs it causal, as trained; SGLang reads only is_causal and runs the
    full layers non-causal. validate --engine sglang fails engine_fidelity and measures that deployment's
    acceptance (on this draft, which copies from its context, non-causal is no worse: 15.04 vs 14.61 causal on
    the pair's 16 prompts; what shows the run is the engine's is that it differs)."""
    from dflash_convert.convert.conversion import convert
    from dflash_convert.validate import ValidateOptions, validate

    hf = tmp_path / "pair-hf"
    convert(ROOT / "examples" / "pair" / "draft", hf)
    cfg = read_config(hf)
    del cfg["is_causal"]
    cfg.update(layer_types=["full_attention"] * cfg["num_hidden_layers"], use_sliding_window=False)
    (hf / "config.json").write_text(json.dumps(cfg))
    prompts = ROOT / "examples" / "pair" / "prompts.txt"
    runs = {e: validate(hf, ValidateOptions(target=ROOT / "examples" / "pair" / "target", prompts=prompts,
                                            max_new_tokens=64, levels=["static", "end_to_end"], timing_rounds=1,
                                            engine=e, sampling="greedy")) for e in ("vllm", "sglang")}
    fidelity = {e: next(c for c in r.checks if c.name == "engine_fidelity") for e, r in runs.items()}
    assert fidelity["vllm"].status != "fail" and runs["vllm"].passed
    assert fidelity["sglang"].status == "fail" and "layer_causal" in fidelity["sglang"].message
    assert runs["sglang"].acceptance.outputs_equal == runs["sglang"].acceptance.prompts  # lossless either way
    assert runs["sglang"].acceptance.acceptance_length != runs["vllm"].acceptance.acceptance_length


def test_validate_engine_zlab_feeds_a_last_layer_id_after_the_final_norm(tmp_path):
    """The trained pair re-wired to read the target's last layer (ids [1, 7] of 8): vLLM feeds that layer's raw
    output, z-lab its output after the final norm (output_hidden_states[-1]). Everything else the two apply to
    this draft is the same, so the acceptance each measures differs only through that feature."""
    from dflash_convert.validate import ValidateOptions, validate
    from factories import copy_draft

    pair = ROOT / "examples" / "pair"
    draft = copy_draft(pair / "draft", tmp_path / "draft", spec_update={"target_layer_ids": [1, 7]})
    runs = {e: validate(draft, ValidateOptions(target=pair / "target", prompts=pair / "prompts.txt", max_new_tokens=32,
                                               levels=["static", "end_to_end"], timing_rounds=1, engine=e,
                                               sampling="greedy"))
            for e in ("vllm", "zlab")}
    fidelity = {e: next(c for c in r.checks if c.name == "engine_fidelity") for e, r in runs.items()}
    assert fidelity["vllm"].status != "fail"
    assert fidelity["zlab"].status == "fail" and "AFTER the final norm" in fidelity["zlab"].message
    assert all(r.acceptance.outputs_equal == r.acceptance.prompts for r in runs.values())
    assert runs["zlab"].acceptance.acceptance_length != runs["vllm"].acceptance.acceptance_length


def test_zlab_needs_num_target_layers_beside_the_ids(cli, tmp_path):
    """z-lab's DFlashDraftModel evaluates build_target_layer_ids(config.num_target_layers, ...) as the default of
    dflash_config.get("target_layer_ids", ...), so a config without num_target_layers fails to load there even with
    its ids: a conversion without --verifier. `inspect --engine zlab` fails naming it (exit 3) and the fix; the
    other engines load it, so a plain inspect notes it without failing; with --verifier it is recorded."""
    pair = ROOT / "examples" / "pair"
    cli("convert", pair / "draft", "-o", tmp_path / "bare")
    cli("convert", pair / "draft", "-o", tmp_path / "known", "--verifier", pair / "target")
    r = cli("inspect", tmp_path / "bare", "--engine", "zlab")
    assert r.code == 3 and "ERROR num_target_layers" in r.out and "--verifier" in r.out, r.out
    r = cli("inspect", tmp_path / "bare")
    assert r.code == 0 and "needs `num_target_layers`" in r.out, r.out
    r = cli("inspect", tmp_path / "known", "--engine", "zlab")
    assert r.code == 0 and "num_target_layers" not in r.out.split("z-lab", 1)[-1], r.out
