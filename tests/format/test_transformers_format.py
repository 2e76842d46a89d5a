"""transformers' own DFlash layout (MuseGlimmerAssistantConfig / MuseGlimmerAssistantModel): conversion to it and
back, what it refuses, and the converted drafts run by transformers itself -- AutoModel without remote code, its
forward against the runtime's, and generate(speculation_type="dflash") against the target's greedy output and the
acceptance our decode loop says transformers has, step by step (float32)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from factories import assert_bit_identical, copy_with_config, read_config, tensors_of
from runtime_helpers import close, one_torch_thread, speculators_draft, write_hf_draft  # noqa: F401 (autouse fixture)

from dflash_convert.format import kinds, mapping
from dflash_convert.io.checkpoint import open_checkpoint
from dflash_convert.validate.engine import transformers_engine as te

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "examples" / "pair"
NEW_TOKENS = 24

pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup


def _prompts(n: int) -> list[list[int]]:
    return [[int(t) for t in line.split()][:16] for line in (PAIR / "prompts.txt").read_text().splitlines()[:n]]


@pytest.fixture(scope="module")
def native_drafts(tmp_path_factory, cli, tiny_target) -> dict[str, tuple[Path, Path]]:
    """name -> (draft in transformers' layout, its target): the bundled draft made non-causal, and a draft saved by
    speculators 0.9.0 (random non-identity weights, a full and a sliding layer, non-causal)."""
    root = tmp_path_factory.mktemp("native")
    saved = speculators_draft(tiny_target, "tf-sliding", full_attention_indices=(0,), sliding_window_non_causal=True)
    for name, src in (("bundled", PAIR / "draft"), ("speculators", saved)):
        r = cli("convert", src, "-o", root / name, "--to", "transformers", "--non-causal", "--dtype", "float32")
        assert r.code == 0, r.err
    return {"bundled": (root / "bundled", PAIR / "target"), "speculators": (root / "speculators", tiny_target)}


def test_the_native_config_says_what_the_draft_was_trained_with(native_drafts):
    cfg = read_config(native_drafts["bundled"][0])
    assert cfg["model_type"] == "muse_glimmer_assistant" and cfg["architectures"] == ["MuseGlimmerAssistantModel"]
    # transformers' target_layer_ids are z-lab's (layer outputs): speculators' aux ids [2, 6] minus one
    assert cfg["target_layer_ids"] == [1, 5] and cfg["block_size"] == 16 and cfg["mask_token_id"] == 511
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}  # not the class's 500000
    assert cfg["head_dim"] == 32 and cfg["num_key_value_heads"] == 1 and cfg["rms_norm_eps"] == 1e-6
    assert cfg["layer_types"] == ["sliding_attention"] * 2 and cfg["sliding_window"] == 2048
    # for vLLM: 0.32 resolves causality from these (0.33 forces non-causal itself); its V1 model runner takes the
    # ids from dflash_config only
    assert cfg["is_causal"] is False and cfg["dflash_config"] == {"causal": False, "target_layer_ids": [1, 5]}
    sliding = read_config(native_drafts["speculators"][0])
    assert sliding["layer_types"] == ["full_attention", "sliding_attention"]
    assert set(tensors_of(native_drafts["bundled"][0])) >= {"encoder.fc.weight", "encoder.output_norm_enc.weight"}


@pytest.mark.parametrize("name", ["bundled", "speculators"])
def test_transformers_loads_it_with_no_remote_code_and_every_weight_used(native_drafts, name):
    from transformers import AutoModel

    model, info = AutoModel.from_pretrained(str(native_drafts[name][0]), output_loading_info=True)
    assert type(model).__name__ == "MuseGlimmerAssistantModel"
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info


@pytest.mark.parametrize("name", ["bundled", "speculators"])
def test_its_forward_equals_the_runtimes_draft_forward(native_drafts, name):
    from transformers.cache_utils import DFlashCache

    from dflash_runtime import load_draft, load_target

    path, target_dir = native_drafts[name]
    model, _ = te.load_pair(path, target_dir)
    draft, target = load_draft(path), load_target(target_dir)
    target.set_capture(draft.target_layer_ids)
    target.reset()
    n, size = 11, draft.block_size
    ids = torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(5))
    _, features = target.forward(ids, 0)
    block = torch.full((size,), draft.mask_token_id)
    block[0] = ids[-1]
    draft.reset()
    draft.add_context(features, 0)
    ours = draft.logits(draft.block_hidden(target.embed(block), n), target.lm_head)
    cache = DFlashCache(config=model.config)
    cache.set_previous_accepted_tokens(n)
    with torch.no_grad():
        hidden = model(noise_embeds=target.embed(block)[None], context_hidden_states=features[None],
                       position_ids=torch.arange(n + size)[None], **{te.forward_keyword(): cache}).last_hidden_state
    assert close(target.lm_head(hidden[0]), ours, torch.float32)


@pytest.mark.parametrize("name, prompts", [("bundled", 2), ("speculators", 1)])
def test_transformers_generate_gives_the_targets_output_and_our_acceptance_step_by_step(native_drafts, name,
                                                                                          prompts):
    from dflash_runtime import load_draft, load_target, speculative_generate

    path, target_dir = native_drafts[name]
    model, target_model = te.load_pair(path, target_dir)
    draft, target = load_draft(path), load_target(target_dir)
    accepted = 0
    for prompt in _prompts(prompts):
        run = te.observed_generate(target_model, model, prompt, NEW_TOKENS)
        ours = speculative_generate(draft, target, prompt, max_new_tokens=NEW_TOKENS, full_last_block=True)
        assert run.tokens == te.target_greedy(target_model, prompt, NEW_TOKENS) == ours.tokens
        assert set(run.drafted_per_step) == {draft.block_size - 1}
        assert run.accepted_per_step == te.emulated_steps(ours.accepted_per_step, len(ours.tokens), NEW_TOKENS)
        accepted += sum(run.accepted_per_step)
    assert name != "bundled" or accepted > NEW_TOKENS // 2  # the trained pair accepts: the comparison means something


def test_counts_of_steps_give_tau_and_per_position_rates():
    """Position k was accepted in the steps that accepted more than k proposals: [[3, 0, 1], [2]] over a block of 4
    (3 proposals per step) is 4 steps, 6 accepted, tau 2.5, rates 3/4, 2/4, 1/4."""
    counts = te.counts_of([[3, 0, 1], [2]], 4)
    assert (counts.num_drafts, counts.drafted, counts.accepted) == (4, 12, 6)
    assert counts.acceptance_length == 2.5 and counts.per_position_rates == [0.75, 0.5, 0.25]
    assert te.counts_of([], 4).per_position_rates == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("steps, new, limit, want", [
    ([3, 0, 15], 20, 20, [3, 0, 13]),  # 6 tokens before the last step, 14 left: it keeps 13 drafts + its own
    ([3, 0, 12, 4], 20, 20, [3, 0, 12]),  # one token was left: transformers did not draft
    ([2, 4], 6, 24, [2, 1]),  # an eos second in the last step's tokens ended it
])
def test_emulated_steps_crop_the_last_step_as_transformers_does(steps, new, limit, want):
    assert te.emulated_steps(steps, new, limit) == want


# ----------------------------------------------------------------------------- refusals

def test_a_causal_draft_is_refused_with_the_flag_that_serves_it_non_causal(cli, tmp_path):
    r = cli("convert", PAIR / "draft", "-o", tmp_path / "out", "--to", "transformers")
    assert r.code == 1 and "layers [0, 1] are causal" in r.err and "--non-causal" in r.err
    assert not (tmp_path / "out").exists()


def test_attention_biases_are_refused(cli, tmp_path):
    src = write_hf_draft(tmp_path / "bias", bias=True, causal=False)
    r = cli("convert", src, "-o", tmp_path / "out", "--to", "transformers")
    assert r.code == 1 and "attention_bias is true" in r.err


def test_an_engine_read_key_with_no_place_is_refused_by_name(cli, tmp_path):
    src = write_hf_draft(tmp_path / "plain", bias=False, causal=False)
    scaled = copy_with_config(src, tmp_path / "scaled", lambda c: c["dflash_config"].update(output_multiplier=2.0))
    r = cli("convert", scaled, "-o", tmp_path / "out", "--to", "transformers")
    assert r.code == 1 and "dflash_config.output_multiplier=2.0" in r.err


def test_a_pruned_vocabulary_is_refused(cli, tmp_path):
    src = write_hf_draft(tmp_path / "plain", bias=False, causal=False)
    tensors = load_file(src / "model.safetensors")
    tensors["lm_head.weight"] = torch.randn(128, 64)
    tensors["d2t"] = torch.zeros(128, dtype=torch.int64)
    save_file(tensors, src / "model.safetensors")
    pruned = copy_with_config(src, tmp_path / "pruned", lambda c: c.update(draft_vocab_size=128))
    r = cli("convert", pruned, "-o", tmp_path / "out", "--to", "transformers")
    assert r.code == 1 and "a pruned vocabulary" in r.err and "target's output embeddings" in r.err


@pytest.mark.parametrize("variant", [k for k in kinds.BUILT_IN if kinds.of(k).modules])
def test_dflash2_and_dspark_modules_are_refused(tmp_path, variant):
    """A kind with modules of its own (dflash2's, dspark's: Kind.modules) has no place in transformers' layout."""
    spec = open_checkpoint(write_hf_draft(tmp_path / "d", bias=False, causal=False)).spec
    with pytest.raises(Exception, match=f"a {variant} draft: .*{re.escape(kinds.of(variant).modules)}"):
        mapping.spec_to_transformers(spec.model_copy(update={"variant": variant}))


@pytest.mark.parametrize("key, value, field", [
    ("is_causal", True, "is_causal"), ("dflash_config", {"causal": True}, "dflash_config.causal"),
    ("dflash_config", {"target_layer_ids": [1, 4]}, "dflash_config.target_layer_ids"),
    ("dflash_config", {"swa_window_size": 4}, "dflash_config.swa_window_size")])
def test_reading_refuses_keys_vllm_applies_unlike_transformers(cli, native_drafts, tmp_path, key, value, field):
    bad = copy_with_config(native_drafts["bundled"][0], tmp_path / "bad", lambda c: c.update({key: value}))
    r = cli("inspect", bad)
    assert r.code == 1 and f"field `{field}`" in r.err and "vLLM reads it" in r.err


# ----------------------------------------------------------------------------- reading it back

def test_round_trips_through_it_are_bit_exact(cli, native_drafts, tmp_path):
    native = native_drafts["bundled"][0]
    for fmt in ("speculators", "hf"):
        there, back = tmp_path / fmt, tmp_path / f"{fmt}-back"
        assert cli("convert", native, "-o", there, "--to", fmt).code == 0
        assert cli("convert", there, "-o", back, "--to", "transformers").code == 0
        a, b = tensors_of(native), tensors_of(back)
        assert set(a) == set(b)
        assert_bit_identical(a, b)
        assert read_config(back) == read_config(native), fmt
    src = tensors_of(tmp_path / "speculators")
    assert_bit_identical(src, {n.replace("encoder.output_norm_enc", "hidden_norm").replace("encoder.fc", "fc"): t
                               for n, t in tensors_of(native).items()})


@pytest.mark.parametrize("absent", ["omitted", "null"])
def test_a_native_config_without_layer_types_reads_as_transformers_reads_it(native_drafts, tmp_path, absent):
    """transformers' MuseGlimmerAssistantConfig makes every layer sliding when `layer_types` is omitted or null (not
    Qwen3's rule, which would make them full attention without use_sliding_window): the draft reads as it does."""
    from transformers import AutoConfig

    def edit(cfg):
        if absent == "omitted":
            del cfg["layer_types"]
        else:
            cfg["layer_types"] = None

    copy = copy_with_config(native_drafts["speculators"][0], tmp_path / absent, edit)
    theirs = AutoConfig.from_pretrained(str(copy)).layer_types
    assert theirs == ["sliding_attention"] * 2  # the class's default, not the saved [full, sliding]
    spec = open_checkpoint(copy).spec
    assert spec.layer_types == theirs and spec.layer_causal == [False, False]
    assert spec.sliding_window == AutoConfig.from_pretrained(str(copy)).sliding_window


def test_inspect_and_diff_know_the_layout(cli, native_drafts, tmp_path):
    native = native_drafts["bundled"][0]
    r = cli("inspect", native, "--json")
    assert r.code == 0 and r.json()["format"] == "transformers"
    assert {"encoder.fc.weight", "encoder.output_norm_enc.weight"} <= {t["name"] for t in r.json()["tensors"]}
    assert cli("convert", native, "-o", tmp_path / "hf", "--to", "hf").code == 0
    r = cli("diff", native, tmp_path / "hf", "--json")
    assert r.code == 0, r.out + r.err
    record = json.loads((tmp_path / "hf" / "conversion.json").read_text())
    assert record["tensors_renamed"] == {"encoder.fc.weight": "fc.weight",
                                         "encoder.output_norm_enc.weight": "hidden_norm.weight"}


def test_the_model_card_names_the_layout(native_drafts):
    from dflash_convert.hub.card import model_card

    card = model_card(open_checkpoint(native_drafts["bundled"][0]).spec, repo_id="org/d")
    assert "transformers' own (`MuseGlimmerAssistantConfig`" in card


# ----------------------------------------------------------------------------- the engine row

def test_inspect_engine_transformers_says_what_it_does_with_each_format(cli, native_drafts):
    r = cli("inspect", native_drafts["bundled"][0], "--engine", "transformers", "--json")
    view = r.json()["engines"][0]
    assert r.code == 0 and view["engine"] == "transformers" and view["loads"] and not view["via_conversion"]
    assert view["target_layer_ids"] == [1, 5] and view["layer_causal"] == [False, False] and view["block_size"] == 16
    assert view["window_semantics"] == "symmetric"
    r = cli("inspect", PAIR / "draft", "--engine", "transformers", "--json")  # causal, in the speculators format
    view = r.json()["engines"][0]
    assert r.code == 3, r.err  # asked for, an engine that cannot hold the draft is a problem: exit 3
    assert "engine_view.transformers" in {c["name"] for c in r.json()["checks"] if c["status"] == "fail"}
    assert view["via_conversion"] and not view["loads"]
    assert "--non-causal" in next(d["consequence"] for d in view["divergences"] if d["field"] == "format")


def test_the_engine_table_says_which_engines_read_the_layout():
    from dflash_convert.format.engines import ENGINES_BY_KEY, NativeLayout

    assert {k: e.native_layout for k, e in ENGINES_BY_KEY.items()} == {
        "vllm-speculators": NativeLayout.READ, "vllm-hf": NativeLayout.READ, "sglang": NativeLayout.ALIAS,
        "zlab": NativeLayout.NOT_READ, "transformers": NativeLayout.OWN}


def test_an_id_of_the_targets_last_layer_gets_its_post_norm_output_in_transformers(native_drafts):
    from dflash_convert.format import engine_views, engines

    spec = open_checkpoint(native_drafts["bundled"][0]).spec.model_copy(update={"target_layer_ids": [1, 7]})
    view = engine_views.engine_view(engines.ENGINES_BY_KEY["transformers"], spec, num_target_layers=8)
    assert "AFTER the final norm" in next(d.consequence for d in view.divergences if d.field == "target_layer_ids")


# ----------------------------------------------------------------------------- validate --engine transformers

def _validate(cli, draft, tmp_path, *extra):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(" ".join(map(str, p)) for p in _prompts(2)) + "\n")
    return cli("validate", draft, "--target", PAIR / "target", "--prompts", prompts, "--max-new-tokens",
               str(NEW_TOKENS), "--threads", "1", "--levels", "static,end_to_end", "--sampling", "greedy",
               "--dtype", "float32", "--engine", "transformers", "--json", *extra)


def test_validate_engine_transformers_runs_its_generate_beside_our_emulation(cli, native_drafts, tmp_path):
    r = _validate(cli, native_drafts["bundled"][0], tmp_path)
    report = r.json()
    checks = {c["name"]: c for c in report["checks"]}
    assert r.code == 0, r.failed_checks()
    assert checks["engine_outputs_equal"]["status"] == checks["engine_acceptance_agrees"]["status"] == "pass"
    run = report["engine_run"]
    assert run["engine"] == "transformers" and run["steps_equal"] == run["prompts"] == 2
    assert run["counts"] == run["emulated"] and run["counts"]["accepted"] > 0


def test_validate_engine_transformers_says_why_it_did_not_run(cli, tmp_path):
    r = _validate(cli, PAIR / "draft", tmp_path)  # causal: transformers would not load it in its layout
    assert "engine_fidelity" in r.json()["levels_skipped"]["end_to_end"] and "engine_fidelity" in r.failed_checks()
    hf = write_hf_draft(tmp_path / "hf", bias=False, causal=False, target_ids=(1, 5))  # loadable, another layout
    report = _validate(cli, hf, tmp_path).json()
    assert report["engine_run"] is None and "convert --to transformers" in report["levels_skipped"]["served"]


def test_validate_engine_transformers_does_not_compare_where_its_window_is_reached(cli, native_drafts, tmp_path):
    """transformers' sliding window (keys within W either side, over its own cache) is not one the runtime runs: a
    window the contexts reach is said, not compared (no verdict either way)."""
    short = copy_with_config(native_drafts["bundled"][0], tmp_path / "w8", lambda c: c.update(sliding_window=8))
    report = _validate(cli, short, tmp_path).json()
    assert report["engine_run"] is None and "sliding window (8)" in report["levels_skipped"]["served"]


def test_a_checkpoint_saved_by_transformers_itself_reads_as_the_same_draft(cli, native_drafts, tmp_path):
    from transformers import AutoModel

    AutoModel.from_pretrained(str(native_drafts["speculators"][0])).save_pretrained(str(tmp_path / "resaved"))
    r = cli("diff", native_drafts["speculators"][0], tmp_path / "resaved", "--json")
    assert r.code == 0 and r.json()["equivalent"], r.out


def test_validate_engine_transformers_quiet_shows_no_loading_bars(cli, native_drafts, tmp_path):
    """-q: the verdict, failures and warnings only; transformers' own loading bars (its target and draft loads for
    the engine run) are off as well."""
    r = _validate(cli, native_drafts["bundled"][0], tmp_path, "-q")
    assert r.code == 0 and r.json()["engine_run"] is not None, r.err
    assert "Loading weights" not in r.err and "%|" not in r.err, r.err
    assert r.err.strip().splitlines()[-1].startswith("PASSED"), r.err
