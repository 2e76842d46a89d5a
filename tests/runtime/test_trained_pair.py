"""The shipped trained pair (examples/pair, made by examples/train_pair.py).

What a user relies on: greedy speculative decoding through the bundled runtime reproduces the
target's own greedy output token for token, and the draft is good enough for acceptance to mean
something (tau >= 3 at block size 8 or more on the held-out prompts shipped with it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime_helpers import one_torch_thread  # noqa: F401 (autouse: tiny models decode fastest on one thread)

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
MAX_NEW = 48
NUM_PROMPTS = 6  # keeps the module well under 30 s on 2 idle cores
MIN_TAU = 3.0
MISWIRED_SHARE = 0.5  # fed from the wrong target layers, the draft keeps less than this share of its tau


def read_prompts(path: Path) -> list[list[int]]:
    return [[int(t) for t in line.split()] for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return read_prompts(PAIR / "prompts.txt")


@pytest.fixture(scope="module")
def pair():
    from dflash_runtime.draft_load import load_draft
    from dflash_runtime.target_load import load_target

    return load_draft(PAIR / "draft"), load_target(PAIR / "target")


@pytest.fixture(scope="module")
def baselines(pair, prompts) -> list[list[int]]:
    """Target-only greedy outputs, through the same loop (computed once for every block size)."""
    from dflash_runtime.decode import target_generate

    _, target = pair
    return [target_generate(target, p, max_new_tokens=MAX_NEW).tokens for p in prompts[:NUM_PROMPTS]]


def test_shipped_pair_is_shaped_like_a_real_one():
    """Speculators-format draft, block >= 8, target with several times the draft's layers, <= 10 MB."""
    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_convert.io.reading import read_json
    from dflash_convert.format.mapping import target_info

    ckpt = open_checkpoint(PAIR / "draft")
    assert ckpt.format == "speculators"
    assert ckpt.raw_config["architectures"] == ["DFlashDraftModel"]  # a model save, not a config-only save
    spec = ckpt.spec
    assert spec.block_size >= 8
    info = target_info(read_json(PAIR / "target" / "config.json"), str(PAIR / "target"))
    assert info.num_layers >= 4 * spec.num_layers
    assert spec.hidden_size == info.hidden_size
    assert max(spec.target_layer_ids) < info.num_layers
    size = sum(f.stat().st_size for d in ("draft", "target") for f in (PAIR / d).iterdir() if f.is_file())
    assert size <= 10 * 2**20


def test_prompts_are_token_ids_of_the_target_vocab(prompts):
    from dflash_convert.io.checkpoint import open_checkpoint

    spec = open_checkpoint(PAIR / "draft").spec
    assert len(prompts) >= 8
    assert all(p and all(0 <= t < spec.vocab_size and t != spec.mask_token_id for t in p) for p in prompts)


@pytest.mark.filterwarnings("ignore:run-time block size")  # expected: 8 differs from the trained 16
@pytest.mark.parametrize("block_size", [None, 8])  # the checkpoint's own block size, and the minimum the bar names
def test_greedy_is_lossless_and_tau_at_least_3(pair, prompts, baselines, block_size):
    draft, target = pair
    tau = greedy_tau(draft, target, prompts, baselines, block_size=block_size)
    assert tau >= MIN_TAU, f"tau {tau:.2f} < {MIN_TAU} at block size {block_size or draft.spec.block_size}"


def greedy_tau(draft, target, prompts, baselines, block_size: int | None = None) -> float:
    """Greedy tau over the prompts; every output must still be the target's own."""
    from dflash_runtime.decode import speculative_generate

    drafts = accepted = 0
    for i, (prompt, base) in enumerate(zip(prompts, baselines)):
        spec = speculative_generate(draft, target, prompt, max_new_tokens=MAX_NEW, block_size=block_size)
        assert len(base) == MAX_NEW
        assert spec.tokens == base, f"prompt {i}: speculative output differs from target greedy"
        drafts += spec.stats.num_drafts
        accepted += spec.stats.accepted
    return 1 + accepted / drafts


@pytest.mark.parametrize("wiring", ["every id one layer up", "every id one layer down", "ids in the wrong order",
                                    "the last id from the final layer"])
def test_miswired_draft_loses_most_of_its_acceptance(pair, prompts, baselines, wiring):
    """The pair's draft reads its continuation from the target's features of the context, so the common wiring
    bugs (a lost +1 between the formats' layer ids either way, a reordered list, the final layer's states
    instead of the right one) show as a collapse in acceptance, which is what validate's threshold catches."""
    from dflash_runtime.draft_load import load_draft

    draft, target = pair
    good = greedy_tau(draft, target, prompts, baselines)
    wrong = load_draft(PAIR / "draft")
    wrong.target_layer_ids = _train_pair_module().miswirings(draft.target_layer_ids, target.num_layers)[wiring]
    tau = greedy_tau(wrong, target, prompts, baselines)
    assert tau < MISWIRED_SHARE * good, f"{wiring} {wrong.target_layer_ids}: tau {tau:.2f} vs {good:.2f} wired right"


def _train_pair_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_pair", PAIR.parent / "train_pair.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repeats_continuations_are_in_the_context_only():
    """The shipped pair's corpus: after the first span every token is the one a period back (so only the
    context predicts it), and spans are fresh random draws across documents (nothing to memorise)."""
    import random

    tp = _train_pair_module()
    corpus = tp.Repeats(0, num_words=128, period=8)
    g = random.Random(0)
    docs = [corpus.sample_with_oracle(g, 64) for _ in range(50)]
    for toks, best in docs:
        assert len(toks) == len(best) == 64
        assert all(0 <= t < tp.NUM_WORDS for t in toks)
        assert best[:7] == [-1] * 7  # inside the first span nothing is determined
        assert all(toks[i + 1] == best[i] == toks[i - 7] for i in range(7, 63))
    assert len({tuple(toks[:8]) for toks, _ in docs}) == len(docs)


def test_train_pair_defaults_are_the_shipped_pairs_recipe():
    """`python examples/train_pair.py` with no arguments remakes the shipped pair: its defaults are the arguments
    the pair's record says it was made with (gamma: the default rule's value for its block size)."""
    import json

    tp = _train_pair_module()
    record = json.loads((PAIR / "training_record.json").read_text())
    assert record["command"] == "python examples/train_pair.py"
    defaults = {k: (tp._rel(v) if isinstance(v, Path) else v) for k, v in vars(tp.parser().parse_args([])).items()}
    assert defaults.pop("gamma") is None and record["args"].pop("gamma") == 7.0
    assert defaults == record["args"]


def test_miswirings_are_the_common_wiring_bugs():
    tp = _train_pair_module()
    assert tp.miswirings([1, 5], 8) == {"every id one layer up": [2, 6], "every id one layer down": [0, 4],
                                        "ids in the wrong order": [5, 1], "the last id from the final layer": [1, 7]}
    assert tp.miswirings([0, 7], 8) == {"ids in the wrong order": [7, 0]}  # shifts leave the target: skipped
    assert tp.miswirings([3], 8) == {"every id one layer up": [4], "every id one layer down": [2],
                                     "the last id from the final layer": [7]}


@pytest.mark.parametrize("ids", [["5", "1"], ["1", "1"], ["1", "10"]])
def test_train_pair_refuses_target_layer_ids_the_target_lacks(ids, tmp_path, capsys):
    """--target-layer-ids is checked before any training starts (usage error, nothing written)."""
    tp = _train_pair_module()
    with pytest.raises(SystemExit) as e:
        tp.main(["--target-layer-ids", *ids, "--target-layers", "10", "--out", str(tmp_path / "pair")])
    assert e.value.code == 2 and "--target-layer-ids" in capsys.readouterr().err
    assert not (tmp_path / "pair").exists()
