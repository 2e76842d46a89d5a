"""Hostile configs and inputs, one class at a time: every value a config can hold wrongly (a type, a
range, a relation between fields, a disagreement with the tensors) is refused when the config is
read, by every command, with one `Error:` line naming the file and the field, exit 1, no
traceback and nothing at or beside the destination. Each test builds its hostile input itself."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from factories import read_config


def copy_of(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def write_config(path: Path, cfg: dict) -> None:
    (path / "config.json").write_text(json.dumps(cfg))  # json.dumps writes NaN/Infinity as Python does


def edited(src: Path, dst: Path, edit) -> Path:
    copy_of(src, dst)
    cfg = read_config(dst)
    edit(cfg)
    write_config(dst, cfg)
    return dst


def assert_refused(r, out: Path | None, *needles: str, code: int = 1) -> str:
    """The CLI's contract for bad input; returns the error line."""
    assert r.code == code, (r.code, r.err, r.out)
    lines = [line for line in r.err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, r.err  # one line, no traceback, no warning noise
    line = lines[0]
    assert line.startswith("Error: ") and "Traceback" not in r.err
    assert not any(f"Error: {t}" in line for t in ("TypeError", "ValueError", "RecursionError", "KeyError",
                                                   "ZeroDivisionError", "MemoryError", "UnicodeDecodeError",
                                                   "ValidationError", "AttributeError", "OverflowError"))
    for n in needles:
        assert n in line, (n, line)
    if out is not None:
        assert not out.exists()
        assert not any(p.name.startswith(f".{out.name}") for p in out.parent.iterdir())
    return line


def tlc(**kw):
    """An edit of the nested decoder config (transformer_layer_config)."""
    return lambda c: c["transformer_layer_config"].update(kw)


def top(**kw):
    return lambda c: c.update(kw)


# Each row: an edit of a speculators 0.9.0 config and what the error line must name.
SPECULATORS_CASES = {
    # types: bool is not int, a string is not a number, a list is not a string, an object is not a list
    "block_size_bool": (top(block_size=True), ["block_size", "integer"]),
    "block_size_string": (top(block_size="8"), ["block_size"]),
    "block_size_float": (top(block_size=8.0), ["block_size"]),
    "mask_bool": (top(mask_token_id=False), ["mask_token_id"]),
    "aux_id_bool": (top(aux_hidden_state_layer_ids=[1, True, 6]), ["aux_hidden_state_layer_ids"]),
    "aux_ids_object": (top(aux_hidden_state_layer_ids={"a": 1}), ["aux_hidden_state_layer_ids"]),
    "hidden_string": (tlc(hidden_size="64"), ["transformer_layer_config.hidden_size"]),
    "eps_string": (tlc(rms_norm_eps="1e-6"), ["transformer_layer_config.rms_norm_eps"]),
    "attention_bias_int": (tlc(attention_bias=1), ["transformer_layer_config.attention_bias"]),
    "layer_types_string": (tlc(layer_types="sliding_attention"), ["transformer_layer_config.layer_types"]),
    "decoder_list": (top(transformer_layer_config=[1, 2]), ["transformer_layer_config"]),
    "verifier_list": (lambda c: c["speculators_config"]["verifier"].update(name_or_path=["a", "b"]),
                      ["speculators_config.verifier.name_or_path"]),
    "model_type_list": (top(speculators_model_type=["dflash"]), ["speculators_model_type"]),
    "architectures_int": (top(architectures=5), ["architectures"]),
    "dtype_int": (top(dtype=16), ["dtype"]),
    "sliding_flag_string": (top(sliding_window_non_causal="false"), ["sliding_window_non_causal"]),
    "eos_string": (tlc(eos_token_id="</s>"), ["transformer_layer_config.eos_token_id"]),
    # ranges: NaN, infinities, zero, negative, absurd sizes
    "eps_nan": (tlc(rms_norm_eps=float("nan")), ["transformer_layer_config.rms_norm_eps", "NaN"]),
    "eps_inf": (tlc(rms_norm_eps=float("inf")), ["transformer_layer_config.rms_norm_eps", "Infinity"]),
    "eps_zero": (tlc(rms_norm_eps=0.0), ["transformer_layer_config.rms_norm_eps"]),
    "eps_negative": (tlc(rms_norm_eps=-1e-6), ["transformer_layer_config.rms_norm_eps"]),
    "rope_theta_nan": (tlc(rope_parameters={"rope_theta": float("nan"), "rope_type": "default"}),
                       ["transformer_layer_config.rope_parameters.rope_theta"]),
    "rope_theta_zero": (tlc(rope_parameters={"rope_theta": 0, "rope_type": "default"}),
                        ["transformer_layer_config.rope_parameters.rope_theta"]),
    "block_negative": (top(block_size=-4), ["block_size"]),
    "block_zero": (top(block_size=0), ["block_size"]),
    "block_one": (top(block_size=1), ["block_size"]),
    "block_huge": (top(block_size=10**9), ["block_size"]),
    "layers_negative": (tlc(num_hidden_layers=-1), ["transformer_layer_config.num_hidden_layers"]),
    "layers_zero": (tlc(num_hidden_layers=0), ["transformer_layer_config.num_hidden_layers"]),
    "layers_huge": (tlc(num_hidden_layers=10**8), ["transformer_layer_config.num_hidden_layers"]),
    "heads_zero": (tlc(num_attention_heads=0), ["transformer_layer_config.num_attention_heads"]),
    "kv_heads_zero": (tlc(num_key_value_heads=0), ["transformer_layer_config.num_key_value_heads"]),
    "head_dim_zero": (tlc(head_dim=0), ["transformer_layer_config.head_dim"]),
    "hidden_huge": (tlc(hidden_size=10**12), ["transformer_layer_config.hidden_size"]),
    "intermediate_negative": (tlc(intermediate_size=-128), ["transformer_layer_config.intermediate_size"]),
    "vocab_zero": (tlc(vocab_size=0), ["transformer_layer_config.vocab_size"]),
    "vocab_huge": (tlc(vocab_size=10**12), ["transformer_layer_config.vocab_size"]),
    "sliding_window_zero": (tlc(sliding_window=0), ["transformer_layer_config.sliding_window"]),
    "draft_vocab_zero": (top(draft_vocab_size=0), ["draft_vocab_size"]),
    "target_hidden_negative": (top(target_hidden_size=-64), ["target_hidden_size"]),
    "speculative_tokens_zero": (lambda c: c["speculators_config"]["proposal_methods"][0].update(speculative_tokens=0),
                                ["speculative_tokens"]),
    # token ids and layer ids
    "mask_negative": (top(mask_token_id=-1), ["mask_token_id", "[0, 512)"]),
    "mask_is_vocab": (top(mask_token_id=512), ["mask_token_id", "[0, 512)"]),
    "aux_duplicate": (top(aux_hidden_state_layer_ids=[1, 4, 4]), ["aux_hidden_state_layer_ids", "repeats"]),
    "aux_negative": (top(aux_hidden_state_layer_ids=[-3, 4, 6]), ["aux_hidden_state_layer_ids"]),
    "aux_zero": (top(aux_hidden_state_layer_ids=[0, 4, 6]), ["aux_hidden_state_layer_ids", "embedding"]),
    "aux_huge": (top(aux_hidden_state_layer_ids=[1, 4, 10**6]), ["aux_hidden_state_layer_ids"]),
    "aux_empty": (top(aux_hidden_state_layer_ids=[]), ["aux_hidden_state_layer_ids", "empty"]),
    "aux_beyond_target": (top(num_target_layers=5), ["aux_hidden_state_layer_ids", "5 layers"]),
    # relations between fields
    "heads_not_dividing_hidden": (lambda c: (c["transformer_layer_config"].pop("head_dim"),
                                             c["transformer_layer_config"].update(num_attention_heads=3)),
                                  ["transformer_layer_config.num_attention_heads", "hidden_size"]),
    "kv_not_dividing_heads": (tlc(num_key_value_heads=3), ["transformer_layer_config.num_key_value_heads"]),
    "layer_types_length": (tlc(layer_types=["sliding_attention"] * 3), ["transformer_layer_config.layer_types"]),
    "sliding_layers_without_window": (tlc(sliding_window=None), ["transformer_layer_config.sliding_window"]),
    "draft_vocab_over_vocab": (top(draft_vocab_size=513), ["draft_vocab_size", "513"]),
    "block_vs_speculative_tokens": (top(block_size=10), ["block_size", "speculative_tokens"]),
    "block_absent_vs_speculative_tokens": (lambda c: (c.pop("block_size"),
                                                      c["speculators_config"]["proposal_methods"][0]
                                                      .update(speculative_tokens=15)),
                                           ["block_size", "speculative_tokens", "default"]),
    # with the tensors present: the weights hold 2 layers
    "fewer_layers_than_tensors": (lambda c: c["transformer_layer_config"].update(
        num_hidden_layers=1, layer_types=["sliding_attention"]), ["num_hidden_layers", "layers.1."]),
}


@pytest.mark.parametrize("case", list(SPECULATORS_CASES))
def test_hostile_speculators_config_is_refused(cli, speculators_drafts, tmp_path, case):
    edit, needles = SPECULATORS_CASES[case]
    src = edited(speculators_drafts["full"], tmp_path / "src", edit)
    out = tmp_path / "out"
    assert_refused(cli("convert", src, "-o", out), out, "config.json", *needles)


# A sample of the classes above, through every command that reads a checkpoint: one validation.
EVERY_COMMAND_CASES = ["eps_nan", "block_zero", "heads_zero", "mask_bool", "aux_duplicate", "fewer_layers_than_tensors",
                       "layers_huge"]


@pytest.mark.parametrize("case", EVERY_COMMAND_CASES)
def test_every_command_applies_the_same_validation(cli, speculators_drafts, tiny_target, tmp_path, case):
    edit, needles = SPECULATORS_CASES[case]
    src = edited(speculators_drafts["full"], tmp_path / "src", edit)
    lines = {
        "inspect": assert_refused(cli("inspect", src), None, *needles),
        "diff": assert_refused(cli("diff", speculators_drafts["full"], src), None, *needles),
        "validate": assert_refused(cli("validate", src, "--target", tiny_target / "config.json", "--levels", "static"),
                                   None, *needles),
        "push": assert_refused(cli("push", src, "someone/draft"), None, *needles),
    }
    r = cli("inspect", src, "--json")
    assert r.code == 1 and "Traceback" not in r.err
    assert len(set(lines.values())) == 1, lines  # the same line from each command


def hf_checkpoint(cli, speculators_drafts, tiny_target, root: Path) -> Path:
    out = root / "hf-base"
    if not out.exists():
        assert cli("convert", speculators_drafts["full"], "-o", out, "--verifier", tiny_target).code == 0
    return out


HF_CASES = {
    "block_sizes_disagree": (lambda c: c.update(block_size=16), ["block_size", "dflash_config.block_size"]),
    "nested_block_zero": (lambda c: c["dflash_config"].update(block_size=0), ["dflash_config.block_size"]),
    "target_ids_duplicate": (lambda c: c["dflash_config"].update(target_layer_ids=[0, 3, 3]),
                             ["dflash_config.target_layer_ids", "repeats"]),
    "target_ids_negative": (lambda c: c["dflash_config"].update(target_layer_ids=[-1, 3, 5]),
                            ["dflash_config.target_layer_ids"]),
    "target_ids_beyond_target": (lambda c: c["dflash_config"].update(target_layer_ids=[0, 3, 8]),
                                 ["dflash_config.target_layer_ids", "8 layers"]),
    "mask_bool": (lambda c: c["dflash_config"].update(mask_token_id=True), ["dflash_config.mask_token_id"]),
    "mask_beyond_vocab": (lambda c: c["dflash_config"].update(mask_token_id=10**6), ["dflash_config.mask_token_id"]),
    "is_causal_string": (lambda c: c.update(is_causal="yes"), ["is_causal"]),
    "dflash_config_list": (lambda c: c.update(dflash_config=[1]), ["dflash_config"]),
    "architectures_string": (lambda c: c.update(architectures="DFlashDraftModel"), ["architectures"]),
    "eps_nan": (lambda c: c.update(rms_norm_eps=float("nan")), ["rms_norm_eps", "NaN"]),
    "heads_zero": (lambda c: c.update(num_attention_heads=0), ["num_attention_heads"]),
    "num_target_layers_zero": (lambda c: c.update(num_target_layers=0), ["num_target_layers"]),
    # a float key (ConfigKey.typed "float") is a number: never a string, a bool or carried unchecked
    "float_key_string": (lambda c: c["dflash_config"].update(output_multiplier="0.5"),
                         ["dflash_config.output_multiplier"]),
    "float_key_bool": (lambda c: c["dflash_config"].update(final_logit_softcapping=True),
                       ["dflash_config.final_logit_softcapping"]),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hostile_hf_config_is_refused(cli, speculators_drafts, tiny_target, tmp_path_factory, tmp_path, case):
    edit, needles = HF_CASES[case]
    base = hf_checkpoint(cli, speculators_drafts, tiny_target, tmp_path_factory.getbasetemp())
    src = edited(base, tmp_path / "src", edit)
    out = tmp_path / "out"
    assert_refused(cli("convert", src, "-o", out), out, "config.json", *needles)


# ----------------------------------------------------------------------------- the JSON itself

def raw_config_cases(cfg: dict) -> dict[str, tuple[bytes, list[str]]]:
    text = json.dumps(cfg)
    return {
        "deeply_nested": (text[:-1].encode() + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                          ["nested"]),
        "nested_past_the_limit": (json.dumps({**cfg, "x": json.loads("[" * 40 + "]" * 40)}).encode(),
                                  ["nested", "`x"]),
        "integer_of_5000_digits": (text.replace('"block_size": 8', '"block_size": 1' + "0" * 5000).encode(),
                                   ["integer"]),
        "integer_of_300_digits_in_an_unknown_key": (text[:-1].encode() + b', "x": 1' + b"0" * 300 + b"}",
                                                    ["`x`", "digits"]),
        "infinity_as_1e400": (text[:-1].encode() + b', "x": 1e400}', ["`x`", "Infinity"]),
        "nan_in_an_unknown_key": (text[:-1].encode() + b', "x": [1, NaN]}', ["`x[1]`", "NaN"]),
        "duplicate_key": (text[:-1].encode() + b', "block_size": 16}', ["block_size", "twice"]),
        "not_utf8": (b"\xff\xfe" + text.encode("utf-16-le"), ["UTF-8"]),
        "binary": (bytes(range(256)) * 4, ["UTF-8"]),
        "top_level_array": (b"[1, 2, 3]", ["JSON object"]),
        "too_large": (text[:-1].encode() + b', "x": "' + b"a" * (9 << 20) + b'"}', ["larger than"]),
        "truncated": (text[: len(text) // 2].encode(), ["not valid JSON"]),
        "empty": (b"", ["not valid JSON"]),
    }


@pytest.mark.parametrize("case", list(raw_config_cases({"block_size": 8})))
def test_hostile_json_is_refused(cli, speculators_drafts, tmp_path, case):
    src = copy_of(speculators_drafts["full"], tmp_path / "src")
    data, needles = raw_config_cases(read_config(src))[case]
    (src / "config.json").write_bytes(data)
    out = tmp_path / "out"
    assert_refused(cli("convert", src, "-o", out), out, "config.json", *needles)
    assert_refused(cli("inspect", src), None, "config.json", *needles)


def test_hostile_index_json_is_refused(cli, speculators_drafts, tmp_path):
    src = copy_of(speculators_drafts["full"], tmp_path / "src")
    index = src / "model.safetensors.index.json"
    index.write_bytes(b'{"weight_map": {"fc.weight": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}")
    out = tmp_path / "out"
    assert_refused(cli("convert", src, "-o", out), out, "model.safetensors.index.json", "nested")


# ----------------------------------------------------------------------------- tensors vs config (issue 8)

def rewrite_tensor(path: Path, name: str, dtype: str) -> None:
    """Change one tensor's dtype in the header (same byte size), keeping the file well formed."""
    f = path / "model.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header[name]["dtype"] = dtype
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


@pytest.mark.parametrize("name, dtype, needles", [
    ("fc.weight", "I32", ["fc.weight", "I32", "float"]),
    ("layers.0.mlp.up_proj.weight", "U32", ["layers.0.mlp.up_proj.weight", "U32"]),
    ("norm.weight", "I32", ["norm.weight"]),
])
def test_integer_weights_are_refused(cli, speculators_drafts, tmp_path, name, dtype, needles):
    src = copy_of(speculators_drafts["full"], tmp_path / "src")
    rewrite_tensor(src, name, dtype)
    out = tmp_path / "out"
    assert_refused(cli("convert", src, "-o", out), out, "model.safetensors", *needles)
    assert_refused(cli("inspect", src), None, *needles)


def test_float_vocab_map_is_refused(cli, speculators_drafts, tmp_path):
    src = copy_of(speculators_drafts["pruned"], tmp_path / "src")
    rewrite_tensor(src, "d2t", "F64")  # int64 -> float64: same size, but ids are not floats
    out = tmp_path / "out"
    assert_refused(cli("convert", src, "-o", out), out, "model.safetensors", "d2t", "F64")


def test_pruned_vocab_maps_stay_integer(cli, speculators_drafts, tiny_target, tmp_path):
    """The rule refuses only non-float weights: a pruned draft's int64 d2t / bool t2d convert."""
    out = tmp_path / "out"
    assert cli("convert", speculators_drafts["pruned"], "-o", out, "--verifier", tiny_target).code == 0


def test_speculators_output_needs_a_verifier(cli, speculators_drafts, tiny_target, tmp_path):
    hf = tmp_path / "hf"
    assert cli("convert", speculators_drafts["full"], "-o", hf).code == 0
    cfg = read_config(hf)
    cfg["dflash_config"].pop("verifier")  # as z-lab publishes it
    write_config(hf, cfg)
    out = tmp_path / "spec"
    assert_refused(cli("convert", hf, "-o", out), out, "config.json", "speculators_config.verifier.name_or_path",
                   "--verifier", "--no-verifier")
    r = cli("convert", hf, "-o", out, "--no-verifier")
    assert r.code == 0 and "verifier" in r.err  # written, and the user still hears vLLM cannot serve it
    assert read_config(out)["speculators_config"]["verifier"]["name_or_path"] is None
    assert cli("convert", hf, "-o", tmp_path / "spec2", "--verifier", tiny_target).code == 0


def test_same_format_writes_a_normalized_copy_and_says_so(cli, speculators_drafts, tmp_path):
    out = tmp_path / "again"
    r = cli("convert", speculators_drafts["legacy"], "-o", out, "--to", "speculators", "--json")
    assert r.code == 0
    assert any("normalized copy" in w for w in r.json()["warnings"])
    assert "normalized copy" in r.err
    record = json.loads((out / "conversion.json").read_text())
    assert record["source_format"] == record["destination_format"] == "speculators"
    assert any("normalized copy" in w for w in record["warnings"])
    assert "embed_tokens.weight" in record["tensors_dropped"]  # what "normalized" means here


# ----------------------------------------------------------------------------- overrides and what is written

@pytest.mark.parametrize("args, code, needles", [
    (["--block-size", "1000000000"], 2, ["--block-size", "1024"]),
    (["--block-size", "0"], 2, ["--block-size"]),
    (["--mask-token-id", "512"], 1, ["dflash_config.mask_token_id", "[0, 512)"]),
    (["--mask-token-id", "-1"], 1, ["dflash_config.mask_token_id"]),
    (["--target-layer-ids", "1,1,3"], 1, ["dflash_config.target_layer_ids", "repeats"]),
    (["--target-layer-ids", "-2,3,5"], 1, ["dflash_config.target_layer_ids"]),
])
def test_overrides_pass_the_same_validation(cli, speculators_drafts, tmp_path, args, code, needles):
    out = tmp_path / "out"
    assert_refused(cli("convert", speculators_drafts["full"], "-o", out, *args), out, *needles, code=code)


def strict_json(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("kind", ["full", "pruned", "mixed", "dflash2"])
def test_written_configs_are_strict_json_and_read_back(cli, speculators_drafts, tiny_target, tmp_path, kind):
    from dflash_convert.io.checkpoint import open_checkpoint

    hf, back = tmp_path / "hf", tmp_path / "back"
    assert cli("convert", speculators_drafts[kind], "-o", hf).code == 0
    assert cli("convert", hf, "-o", back).code == 0
    for d in (hf, back):
        strict_json((d / "config.json").read_text())
        strict_json((d / "conversion.json").read_text())
        open_checkpoint(d)


# ----------------------------------------------------------------------------- the target's config

@pytest.mark.parametrize("edit, needles", [
    (lambda c: c.update(num_hidden_layers=True), ["num_hidden_layers"]),
    (lambda c: c.update(hidden_size="64"), ["hidden_size"]),
    (lambda c: c.update(vocab_size=0), ["vocab_size"]),
    (lambda c: c.update(vocab_size=10**30), ["vocab_size"]),
    (lambda c: c.pop("num_hidden_layers"), ["num_hidden_layers", "missing"]),
    (lambda c: c.update(eos_token_id=[1, "x"]), ["eos_token_id"]),
    (lambda c: c.update(pad_token_id=False), ["pad_token_id"]),
    (lambda c: c.update(text_config={"hidden_size": 64}), ["text_config.num_hidden_layers"]),
    # more KV heads than heads: the bound predict applies too (format/sizes.py), not MAX_HEADS
    (lambda c: c.update(num_key_value_heads=c["num_attention_heads"] + 1), ["num_key_value_heads",
                                                                            "num_attention_heads"]),
])
def test_hostile_target_config_is_refused(cli, speculators_drafts, tiny_target, tmp_path, edit, needles):
    cfg = read_config(tiny_target)
    edit(cfg)
    target = tmp_path / "target"
    target.mkdir()
    write_config(target, cfg)
    out = tmp_path / "out"
    assert_refused(cli("convert", speculators_drafts["full"], "-o", out, "--verifier", target), out,
                   str(target / "config.json"), *needles)
    assert_refused(cli("validate", speculators_drafts["full"], "--target", target / "config.json", "--levels",
                       "static"), None, *needles)


# ----------------------------------------------------------------------------- validate's prompts

PROMPT_CASES = {
    "binary": (bytes(range(256)) * 64, ["prompts.txt", "UTF-8"]),
    "single_20MB_line": (b"a" * (20 << 20), ["prompts.txt", "line 1", "characters"]),
    "bool_ids_jsonl": (b'{"prompt": [true, false, 3]}\n', ["prompts.txt", "line 1", "token ids"]),
    "bool_ids_list": (b"[1, true]\n", ["prompts.txt", "line 1", "token ids"]),
    "deep_json": (b"[" * 100_000 + b"]" * 100_000 + b"\n", ["prompts.txt", "line 1", "JSON"]),
    "huge_int_json": (b"[1" + b"0" * 5000 + b"]\n", ["prompts.txt", "line 1", "JSON"]),
    "huge_int_plain": (b"5 7 1" + b"0" * 5000 + b"\n", ["prompts.txt", "line 1", "range"]),
    "id_outside_vocab": (b"5 7 100000\n", ["prompts.txt", "prompt 1", "100000"]),
    "too_many_tokens": ((" ".join(["5"] * 10_000) + "\n").encode(), ["prompts.txt", "prompt 1", "tokens"]),
    "prompt_field_object": (b'{"prompt": {"a": 1}}\n', ["prompts.txt", "line 1", "`prompt`"]),
    "no_prompts": (b"\n\n  \n", ["prompts.txt", "no prompts"]),
}


@pytest.mark.parametrize("case", list(PROMPT_CASES))
def test_hostile_prompts_are_refused_before_any_work(cli, speculators_drafts, tiny_target, tmp_path, case):
    data, needles = PROMPT_CASES[case]
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(data)
    r = cli("validate", speculators_drafts["full"], "--target", tiny_target, "--prompts", prompts)
    assert_refused(r, None, *needles)


def test_validate_block_size_is_bounded(cli, speculators_drafts, tmp_path):
    r = cli("validate", speculators_drafts["full"], "--block-size", str(10**9), "--levels", "static")
    assert_refused(r, None, "--block-size", code=2)


# ----------------------------------------------------------------------------- numeric flags

@pytest.mark.parametrize("args, needle", [
    (["diff", "{d}", "{d}", "--tolerance", "nan"], "--tolerance"),
    (["diff", "{d}", "{d}", "--tolerance", "-1"], "--tolerance"),
    (["validate", "{d}", "--levels", "static", "--temperature", "nan"], "--temperature"),
    (["validate", "{d}", "--levels", "static", "--temperature", "-0.5"], "--temperature"),
    (["validate", "{d}", "--levels", "static", "--min-acceptance-length", "nan"], "--min-acceptance-length"),
    (["validate", "{d}", "--levels", "static", "--min-acceptance-length", "inf"], "--min-acceptance-length"),
    (["validate", "{d}", "--levels", "static", "--min-position-rates", "0.9,nan"], "--min-position-rates"),
    (["validate", "{d}", "--levels", "static", "--min-position-rates", "1.5"], "--min-position-rates"),
    (["validate", "{d}", "--levels", "static", "--max-new-tokens", str(10**9)], "--max-new-tokens"),
    (["convert", "{d}", "-o", "{out}", "--max-shard-size", "1" + "0" * 400 + "GB"], "--max-shard-size"),
    (["convert", "{d}", "-o", "{out}", "--max-shard-size", "0.001B"], "--max-shard-size"),
])
def test_numeric_flags_are_bounded(cli, speculators_drafts, tmp_path, args, needle):
    """NaN passes every `<` test: a NaN threshold or tolerance would pass anything. Each is a usage error."""
    out = tmp_path / "out"
    argv = [a.format(d=speculators_drafts["full"], out=out) for a in args]
    assert_refused(cli(*argv), out if "-o" in argv else None, needle, code=2)


@pytest.mark.parametrize("edit, needles", [
    (lambda c: c["speculators_config"]["verifier"].update(name_or_path="\x1b]0;owned\x07\x1b[2J"),
     ["speculators_config.verifier.name_or_path", "control character"]),
    (lambda c: c["transformer_layer_config"].update(model_type="qwen3\x1b[1A"), ["model_type", "control"]),
    (lambda c: c.update(architectures=["DFlashDraftModel\x9b2J"]), ["architectures[0]", "control"]),
    (lambda c: c["transformer_layer_config"].update(rope_parameters={"rope_type": "default\r"}), ["rope_type"]),
    (lambda c: c.update({"unknown\x1b[31m": 1}), ["key `unknown\\x1b[31m`", "control"]),  # diff lists unknown keys
    (lambda c: c.update(notes="\x1b[2J"), ["field `notes`", "control"]),
])
def test_terminal_escapes_in_config_strings_are_refused(cli, speculators_drafts, tmp_path, edit, needles):
    """inspect and diff print names and keys from the config: an escape sequence in one could rewrite
    the user's terminal."""
    src = edited(speculators_drafts["full"], tmp_path / "src", edit)
    for r in (cli("inspect", src), cli("diff", speculators_drafts["full"], src)):
        line = assert_refused(r, None, "config.json", *needles)
        assert not any(c in line for c in "\x1b\x9b\r\x07")  # the error shows it escaped


def test_the_same_names_are_refused_by_the_model_itself():
    """Configs built in code (not read from a file) get the same check from the pydantic models."""
    from pydantic import ValidationError

    from dflash_convert.format.configs import VerifierRef

    with pytest.raises(ValidationError, match="U\\+001B"):
        VerifierRef(name_or_path="a\x1b[2J")


@pytest.mark.parametrize("tokenizer", [b'{"a": 1}', b"[" * 100_000 + b"]" * 100_000, bytes(range(256))])
def test_a_corrupt_target_tokenizer_is_one_line(cli, speculators_drafts, tiny_target, tmp_path, tokenizer):
    target = copy_of(tiny_target, tmp_path / "target")
    (target / "tokenizer.json").write_bytes(tokenizer)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\n")
    r = cli("validate", speculators_drafts["full"], "--target", target, "--prompts", prompts)
    assert_refused(r, None, str(target), "tokenizer")
