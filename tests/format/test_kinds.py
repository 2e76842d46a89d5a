"""A draft kind is one unit: a kind defined only in this file plugs into convert, inspect and the runtime through
the two registries (dflash_convert.format.kinds.KINDS and dflash_runtime.heads.KINDS) and nothing else.

The kind, `dflashx`, is the plain DFlash draft with one more key and one more tensor: `logit_bias.weight` [Vd], a
bias over the draft vocabulary that its head adds to every proposing slot's logits, scaled by the required key
`logit_bias_scale`. Its format side is a subclass of the dflash kind (as dflash2's is); its runtime side a head."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dflash_convert.format import catalogue, keys, kinds
from dflash_convert.format.kinds.base import ConfigKey, Tensor
from dflash_convert.format.kinds.dflash import DFlash
from dflash_runtime import heads, load_draft, load_target, speculative_generate, target_generate
from factories import assert_bit_identical, assert_hf_round_trip_is_bit_exact, read_config, tensors_of
from runtime_helpers import BiasedHead, assert_decode_alike, first_proposals

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
FAVOURITE = 7  # the token the bias pushes
BIAS = "logit_bias.weight"


class DFlashX(DFlash):
    """The format side of the test kind: its names, its one key and its one tensor."""

    name = "dflashx"
    title = "DFlash-X"
    hf_architecture = "DFlashXDraftModel"
    speculators_architecture = "DFlashXDraftModel"
    keys = (*DFlash.keys, ConfigKey("logit_bias_scale", "this test's head", "scales logit_bias.weight",
                                    speculators="logit_bias_scale", required=True))
    tensors = (Tensor("logit_bias", BIAS, "dflashx logit bias [draft_vocab]", lambda s: (s.draft_vocab,),
                      check="family_shapes"),)
    modules = "logit bias"
    legacy_block_writer = False


def load_bias_head(draft) -> BiasedHead:
    scale = float(draft.spec.variant_fields["logit_bias_scale"])
    return BiasedHead(scale * draft.tensors[catalogue.name("logit_bias")].float())


@pytest.fixture
def dflashx(monkeypatch):
    """The test kind registered in both registries for one test, removed after it."""
    monkeypatch.setitem(heads.KINDS, DFlashX.name, heads.Kind(load_bias_head))
    with kinds.registered(DFlashX()) as kind:
        yield kind
    assert "dflashx" not in kinds.KINDS and all("dflashx" not in k.kinds for k in keys.config_keys())


def make_dflashx(dst: Path, scale: float) -> Path:
    """The example pair's draft (speculators format) as a dflashx draft: its config renamed with the key set, and a
    one-hot bias at FAVOURITE beside its tensors."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(PAIR / "draft", dst)
    cfg = read_config(dst)
    cfg.update(speculators_model_type="dflashx", architectures=["DFlashXDraftModel"], logit_bias_scale=scale)
    cfg["speculators_config"]["algorithm"] = "dflashx"
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = load_file(dst / "model.safetensors")
    bias = torch.zeros(cfg["draft_vocab_size"], dtype=tensors[catalogue.name("fc")].dtype)
    bias[FAVOURITE] = 1.0
    save_file({**tensors, BIAS: bias}, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def pair_target():
    return load_target(PAIR / "target")


def test_convert_both_ways_is_bit_exact(dflashx, cli, tmp_path):
    """speculators -> HF -> speculators keeps every tensor (the kind's own included) bit for bit and the config;
    the HF config names the kind's architecture and keeps its key in dflash_config; diff finds nothing; and from
    the HF checkpoint, HF -> speculators -> HF is bit-exact too."""
    src, hf, back = make_dflashx(tmp_path / "src", 0.5), tmp_path / "hf", tmp_path / "back"
    assert cli("convert", src, "-o", hf).code == 0
    r = cli("convert", hf, "-o", back)
    assert r.code == 0, r.err
    a, h, b = tensors_of(src), tensors_of(hf), tensors_of(back)
    assert BIAS in h and set(a) == set(h) == set(b)
    assert_bit_identical(a, h)
    assert_bit_identical(a, b)
    cfg = read_config(hf)
    assert cfg["architectures"] == ["DFlashXDraftModel"] and cfg["dflash_config"]["logit_bias_scale"] == 0.5
    ca, cb = read_config(src), read_config(back)
    for key in ("speculators_model_type", "architectures", "logit_bias_scale", "speculators_config", "block_size",
                "aux_hidden_state_layer_ids", "mask_token_id", "transformer_layer_config"):
        assert ca[key] == cb[key], key
    record = json.loads((back / "conversion.json").read_text())
    assert not [c for c in record["config_changes"] if "logit_bias_scale" in c["key"]]  # it only moved
    assert cli("diff", src, hf).code == 0 and cli("diff", src, back).code == 0
    assert_hf_round_trip_is_bit_exact(cli, hf, tmp_path / "from-hf")  # HF -> speculators -> HF as well


def test_inspect_knows_the_kind(dflashx, cli, tmp_path):
    """inspect passes the kind's draft and names its tensor; without the tensor it fails naming it."""
    src = make_dflashx(tmp_path / "src", 1.0)
    r = cli("inspect", src, "--json")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["variant"] == "dflashx" and BIAS in {t["name"] for t in report["tensors"]}
    from safetensors.torch import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    del tensors[BIAS]
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    r = cli("inspect", src, "--json")
    assert r.code == 3 and BIAS in r.failed_checks()["missing_tensors"], (r.code, r.err)


def test_unregistered_the_kind_is_refused(cli, tmp_path):
    """Without the registry line the same checkpoint is no draft this tool knows (one line, exit 1)."""
    r = cli("inspect", make_dflashx(tmp_path / "src", 1.0), "--json")
    assert r.code == 1 and "dflashx" in r.err and "only dflash, dflash2 and dspark drafts" in r.err, r.err


def test_the_runtime_runs_the_kind(dflashx, pair_target, tmp_path):
    """With scale 0 the kind decodes as the plain draft (token for token, acceptance for acceptance); with a large
    scale its head decides every proposal, and greedy output is still the target's own."""
    assert_decode_alike(load_draft(PAIR / "draft"), load_draft(make_dflashx(tmp_path / "zero", 0.0)), pair_target)
    draft = load_draft(make_dflashx(tmp_path / "big", 1e4))
    assert isinstance(draft.head, BiasedHead)
    prompt = [5, 6, 7, 8]
    ids, _ = first_proposals(draft, pair_target, prompt)
    assert ids.tolist() == [FAVOURITE] * draft.proposals()
    out = speculative_generate(draft, pair_target, prompt, max_new_tokens=24)
    assert out.tokens == target_generate(pair_target, prompt, max_new_tokens=24).tokens
