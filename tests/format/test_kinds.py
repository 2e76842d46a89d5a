"""A draft kind is one unit: a kind defined outside the package (tests/toy_kind: `dflash_bias`, one module per side)
plugs into convert, inspect, the runtime and the generated docs through the two registries
(dflash_convert.format.kinds and dflash_runtime.heads) and nothing else.

The kind is the plain DFlash draft with one more key and one more tensor: `logit_bias.weight` [Vd], a bias over
the draft vocabulary that its head adds to every proposing slot's logits, scaled by the required float key
`logit_bias_scale`. No engine serves it (engine_support "runtime only"). The registries refuse a kind that would
change what another means: a tensor key or name taken, engine support not chosen, a head without a kind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dflash_convert import regenerate
from dflash_convert.format import catalogue, engines, keys, kinds
from dflash_convert.format.kinds.base import BACKBONE_RULES, RUNTIME_ONLY, Tensor
from dflash_convert.format.kinds.dflash import DFlash
from dflash_runtime import heads, load_draft, load_target, speculative_generate, target_generate
from factories import assert_bit_identical, assert_hf_round_trip_is_bit_exact, read_config, tensors_of
from runtime_helpers import BiasedHead, assert_decode_alike, first_proposals
from toy_kind import dflash_bias, dflash_bias_head

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
FAVOURITE = 7  # the token the bias pushes
BIAS = dflash_bias.BIAS
NAME = dflash_bias.NAME


@pytest.fixture
def toy():
    """The toy kind in both registries for one test (its two modules' objects, nothing else), removed after it."""
    with kinds.registered(dflash_bias.KIND) as kind, heads.registered(NAME, dflash_bias_head.KIND):
        yield kind
    assert NAME not in kinds.KINDS and NAME not in heads.KINDS
    assert all(NAME not in k.kinds for k in keys.config_keys())


def make_toy(dst: Path, scale: float) -> Path:
    """The example pair's draft (speculators format) as a dflash_bias draft: its config renamed with the key set,
    and a one-hot bias at FAVOURITE beside its tensors."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(PAIR / "draft", dst)
    cfg = read_config(dst)
    cfg.update(speculators_model_type=NAME, architectures=[dflash_bias.KIND.speculators_architecture],
               logit_bias_scale=scale)
    cfg["speculators_config"]["algorithm"] = NAME
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = load_file(dst / "model.safetensors")
    bias = torch.zeros(cfg["draft_vocab_size"], dtype=tensors[catalogue.name("fc")].dtype)
    bias[FAVOURITE] = 1.0
    save_file({**tensors, BIAS: bias}, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def pair_target():
    return load_target(PAIR / "target")


def test_convert_both_ways_is_bit_exact(toy, cli, tmp_path):
    """speculators -> HF -> speculators keeps every tensor (the kind's own included) bit for bit and the config;
    the HF config names the kind's architecture and keeps its key in dflash_config; diff finds nothing; and from
    the HF checkpoint, HF -> speculators -> HF is bit-exact too."""
    src, hf, back = make_toy(tmp_path / "src", 0.5), tmp_path / "hf", tmp_path / "back"
    assert cli("convert", src, "-o", hf).code == 0
    r = cli("convert", hf, "-o", back)
    assert r.code == 0, r.err
    a, h, b = tensors_of(src), tensors_of(hf), tensors_of(back)
    assert BIAS in h and set(a) == set(h) == set(b)
    assert_bit_identical(a, h)
    assert_bit_identical(a, b)
    cfg = read_config(hf)
    assert cfg["architectures"] == ["DFlashBiasDraftModel"] and cfg["dflash_config"]["logit_bias_scale"] == 0.5
    ca, cb = read_config(src), read_config(back)
    for key in ("speculators_model_type", "architectures", "logit_bias_scale", "speculators_config", "block_size",
                "aux_hidden_state_layer_ids", "mask_token_id", "transformer_layer_config"):
        assert ca[key] == cb[key], key
    record = json.loads((back / "conversion.json").read_text())
    assert not [c for c in record["config_changes"] if "logit_bias_scale" in c["key"]]  # it only moved
    assert cli("diff", src, hf).code == 0 and cli("diff", src, back).code == 0
    assert_hf_round_trip_is_bit_exact(cli, hf, tmp_path / "from-hf")  # HF -> speculators -> HF as well


def test_inspect_knows_the_kind_and_notes_that_no_engine_serves_it(toy, cli, tmp_path):
    """inspect passes the kind's draft and names its tensor; every engine view says the kind is runtime only, as
    one note, not a problem (exit 0), and never "as trained"; asked for an engine (--engine vllm), that engine's
    view is the problem (exit 3). Without the tensor it fails naming it."""
    src = make_toy(tmp_path / "src", 1.0)
    r = cli("inspect", src, "--json")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["variant"] == NAME and BIAS in {t["name"] for t in report["tensors"]}
    assert report["engines"] and not any(v["loads"] or v["as_trained"] for v in report["engines"])
    assert all(v["divergences"][0]["field"] == "engine_support" for v in report["engines"])
    assert report["ok"] and not [c for c in report["checks"] if c["name"].startswith("engine_view.")]
    r = cli("inspect", src)
    assert r.code == 0 and "as trained" not in r.out, r.out
    assert "note (every engine) runtime only: no engine serves DFlash-bias drafts" in r.out, r.out
    assert r.out.count("not served (runtime only: no engine serves this kind)") == len(report["engines"])
    r = cli("inspect", src, "--engine", "vllm", "--json")
    assert r.code == 3 and any(name.startswith("engine_view.vllm") for name in r.failed_checks()), r.out
    from safetensors.torch import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    del tensors[BIAS]
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    r = cli("inspect", src, "--json")
    assert r.code == 3 and BIAS in r.failed_checks()["missing_tensors"], (r.code, r.err)


def test_unregistered_the_kind_is_refused(cli, tmp_path):
    """Without the registry line the same checkpoint is no draft this tool knows (one line, exit 1)."""
    r = cli("inspect", make_toy(tmp_path / "src", 1.0), "--json")
    assert r.code == 1 and NAME in r.err and f"only {kinds.said()} drafts" in r.err, r.err


def test_the_runtime_runs_the_kind(toy, pair_target, tmp_path):
    """With scale 0 the kind decodes as the plain draft (token for token, acceptance for acceptance); with a large
    scale its head decides every proposal, and greedy output is still the target's own."""
    assert_decode_alike(load_draft(PAIR / "draft"), load_draft(make_toy(tmp_path / "zero", 0.0)), pair_target)
    draft = load_draft(make_toy(tmp_path / "big", 1e4))
    assert isinstance(draft.head, BiasedHead)
    prompt = [5, 6, 7, 8]
    ids, _ = first_proposals(draft, pair_target, prompt)
    assert ids.tolist() == [FAVOURITE] * draft.proposals()
    out = speculative_generate(draft, pair_target, prompt, max_new_tokens=24)
    assert out.tokens == target_generate(pair_target, prompt, max_new_tokens=24).tokens


def test_the_one_regeneration_command_takes_the_kind(toy):
    """With the kind registered, the generated docs (what `python -m dflash_convert.regenerate` writes) hold its row
    of the kinds table, naming its two modules, and its row of the engine table: not served by any engine."""
    formats = regenerate.current("docs/formats.md")
    row = next(line for line in formats.splitlines() if line.startswith(f"| `{NAME}` |"))
    assert "`toy_kind.dflash_bias`" in row and "`toy_kind.dflash_bias_head`" in row and "runtime only" in row, row
    table = engines.render_markdown()
    assert f"| {toy.title} drafts | " + " | ".join([engines.RUNTIME_ONLY_TEXT] * len(engines.ENGINES)) in table
    assert regenerate.stale() == ["docs/formats.md", "docs/engines.md"]  # the built-in docs lack it, rightly


class Inherits(DFlash):
    """A kind built on DFlash's module that never says which engines serve it."""

    name = "inherits"
    hf_architecture = speculators_architecture = "InheritsDraftModel"


def test_a_kind_must_choose_its_engine_support():
    """A kind inheriting DFlash's engine support is refused at registration (it once inherited DFlash's engine
    views, and inspect said vLLM and SGLang served it as trained); choosing in its own class is accepted."""
    with pytest.raises(ValueError, match="inherits: engine_support must be set in its own class"):
        with kinds.registered(Inherits()):
            pass
    assert "inherits" not in kinds.KINDS

    class Chosen(Inherits):
        engine_support = BACKBONE_RULES

    with kinds.registered(Chosen()):
        assert kinds.KINDS["inherits"].engine_support == BACKBONE_RULES
    assert "inherits" not in kinds.KINDS


def other_kind(*tensors: Tensor):
    class Other(DFlash):
        name = "other"
        hf_architecture = speculators_architecture = "OtherDraftModel"
        engine_support = RUNTIME_ONLY

    Other.tensors = tensors
    return Other()


def vector(key: str, name: str) -> Tensor:
    return Tensor(key, name, "a vector", lambda s: (s.hidden_size,), check="family_shapes")


@pytest.mark.parametrize("tensor, needle", [
    (vector("logit_bias", "other_bias.weight"), "collides with kind dflash_bias's 'logit_bias'"),  # same key
    (vector("other_bias", BIAS), "collides with kind dflash_bias's 'logit_bias'"),  # same name
    (vector("fc", "other.fc.weight"), "collides with the backbone's 'fc'"),
    (vector("extra_norm", "norm.weight"), "collides with the backbone's 'norm'"),
    (vector("selector_rank_x", "candidate_selector.hidden_projection.weight"), "collides with kind dflash2's"),
], ids=["kind_key", "kind_name", "backbone_key", "backbone_name", "built_in_kind"])
def test_a_tensor_another_kind_claims_is_refused_at_registration(toy, tensor, needle):
    """The catalogue finds a key or a name across every kind, first match first: a kind whose tensor takes another
    kind's (or the backbone's) key or name, as another entry, is refused when registered, and the catalogue keeps
    meaning what it meant."""
    with pytest.raises(ValueError, match=needle):
        with kinds.registered(other_kind(tensor)):
            pass
    assert "other" not in kinds.KINDS and catalogue.entry("logit_bias").name == BIAS
    with kinds.registered(other_kind(vector("other_bias", "other_bias.weight"))):  # its own key and name: fine
        assert catalogue.entry("other_bias").name == "other_bias.weight"


def test_a_head_names_a_registered_kind(monkeypatch):
    """The runtime's registry names kinds of the format side's: a head under a name the format side lacks is
    refused when registered, and the built-in registries are checked against each other at import."""
    with pytest.raises(ValueError, match="no draft kind 'nokind' is registered on the format side"):
        with heads.registered("nokind", dflash_bias_head.KIND):
            pass
    heads.check_registries()
    monkeypatch.setitem(heads.KINDS, "nokind", dflash_bias_head.KIND)
    with pytest.raises(ValueError, match=r"heads without a kind \['nokind'\]"):
        heads.check_registries()
    monkeypatch.delitem(heads.KINDS, "nokind")
    monkeypatch.delitem(heads.KINDS, "dspark")
    with pytest.raises(ValueError, match=r"kinds without a head \['dspark'\]"):
        heads.check_registries()


@pytest.mark.parametrize("value", ["0.5", True, [0.5]], ids=["string", "bool", "list"])
def test_the_kinds_float_key_is_checked(toy, cli, tmp_path, value):
    """The kind's float key (ConfigKey.typed "float") is checked as a built-in kind's is, though the kind was
    registered after the config models were built: a string, a bool or a list is refused naming it (exit 1,
    nothing written)."""
    src = make_toy(tmp_path / "src", 1.0)
    cfg = read_config(src)
    cfg["logit_bias_scale"] = value
    (src / "config.json").write_text(json.dumps(cfg))
    r = cli("convert", src, "-o", tmp_path / "hf")
    assert r.code == 1 and "field `logit_bias_scale`" in r.err and not (tmp_path / "hf").exists(), (r.code, r.err)


def test_a_refused_architecture_names_every_registered_kind(toy):
    """An architecture of another algorithm is refused naming what the tool handles: every registered kind's HF
    architecture, the plug-in's included (the list was written by hand and knew three)."""
    from dflash_convert.errors import DFlashError
    from dflash_convert.format import mapping

    with pytest.raises(DFlashError) as exc:
        mapping.detect_format({"architectures": ["Qwen3XPressModel"]})
    assert "handles DFlashDraftModel, DFlash2DraftModel, Qwen3DSparkModel and DFlashBiasDraftModel drafts" in \
        str(exc.value), str(exc.value)


def test_the_model_card_gives_no_engine_command_for_a_runtime_only_kind(toy, tmp_path):
    """A runtime-only kind's model card says that no engine serves it, instead of vLLM and SGLang commands that
    would not load it."""
    from dflash_convert.hub.card import model_card
    from dflash_convert.io.checkpoint import open_checkpoint

    card = model_card(open_checkpoint(make_toy(tmp_path / "src", 1.0)).spec, repo_id="someone/draft")
    assert "No serving engine has a model of DFlash-bias drafts" in card
    assert "vllm serve" not in card and "sglang.launch_server" not in card
