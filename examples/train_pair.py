#!/usr/bin/env python
"""Train, on CPU in minutes, a tiny Qwen3 target and a DFlash draft for it; ship them as a pair.

Random drafts accept nothing, so a runtime or a converter tested only on them proves little. This
script makes a pair whose acceptance means something:

1. A synthetic language whose continuation only the context determines (`Repeats`: one random span
   repeated, fresh per document), so the draft must read the target's features, and its target layer
   ids matter. (`--corpus phrases`, a memorisable phrase grammar, makes a draft that leans on the anchor
   token instead: mis-wired, it keeps most of its acceptance.)
2. A Qwen3ForCausalLM target trained on it until its greedy continuations are confident.
3. The target frozen and saved; a DFlash draft built with speculators 0.9.0's own classes and trained
   with the DFlash objective (docs/formats.md section 1): random anchors in target-generated text, context =
   target features at the chosen layers of the tokens before the anchor, block
   [token_at_anchor, MASK x (B-1)], cross-entropy of slots 1..B-1 against the target's own greedy
   next tokens. Saved with `save_pretrained`, i.e. a genuine speculators-format checkpoint.
4. Held-out prompts (same distribution) written to prompts.txt, greedy tau measured on them.

Usage (from the repository root; defaults reproduce the shipped pair):
    python examples/train_pair.py
    python examples/train_pair.py --out /tmp/pair --target-steps 200 --draft-steps 200   # quick try
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

VOCAB = 512
MASK_ID = 511  # reserved: never in the corpus; the draft's block filler
EOS_ID = 510  # reserved: never in the corpus (documents are windows of an endless stream)
PAD_ID = 509  # reserved: never in the corpus
NUM_WORDS = 480  # content tokens are 0..479


# ----------------------------------------------------------------------------- corpus

class PhraseGrammar:
    """A fixed book of phrases (short token sequences) chained by a sparse Markov chain.

    Inside a phrase every token is determined; after a phrase, one of its 3 successors follows
    with probability 0.6 / 0.3 / 0.1. Words are shared between phrases, so the current token alone
    does not say where one is: a model has to look back a few tokens.
    """

    def __init__(self, seed: int, num_words: int, num_phrases: int = 64, min_len: int = 3, max_len: int = 8):
        g = random.Random(seed)
        # ~360 phrase slots over num_words words: the fewer the words, the more a model must look at
        # the last few tokens (the draft: at the target's features) to know where it is
        words = g.sample(range(NUM_WORDS), num_words)
        self.phrases = [[g.choice(words) for _ in range(g.randint(min_len, max_len))] for _ in range(num_phrases)]
        self.successors = [g.sample(range(num_phrases), 3) for _ in range(num_phrases)]
        self.probs = (0.6, 0.3, 0.1)

    def sample(self, g: random.Random, length: int) -> list[int]:
        """A window of the endless stream, starting at a random point inside a random phrase."""
        p = g.randrange(len(self.phrases))
        out = self.phrases[p][g.randrange(len(self.phrases[p])):]
        while len(out) < length:
            p = g.choices(self.successors[p], weights=self.probs)[0]
            out += self.phrases[p]
        return out[:length]

    def sample_with_oracle(self, g: random.Random, length: int) -> tuple[list[int], list[int]]:
        """A window and, per position, the grammar's most likely NEXT token."""
        p = g.randrange(len(self.phrases))
        start = g.randrange(len(self.phrases[p]))
        toks, best = [], []
        while len(toks) < length + 1:
            phrase = self.phrases[p]
            for i in range(start, len(phrase)):
                toks.append(phrase[i])
                best.append(phrase[i + 1] if i + 1 < len(phrase) else self.phrases[self.successors[p][0]][0])
            start = 0
            p = g.choices(self.successors[p], weights=self.probs)[0]
        return toks[:length], best[:length]


class Repeats:
    """Documents that repeat one random span of `period` tokens: each token is the one `period` back.

    The span is fresh per document (uniform over `num_words` content words), so nothing can be
    memorised: after the first period the continuation is determined, but only by the context. A
    draft continues it only by reading the target's features of the context, which makes its layer
    ids matter; and copying at a fixed distance is learnt in a few hundred steps, unlike recall.
    """

    def __init__(self, seed: int, num_words: int = NUM_WORDS, period: int = 8):
        self.words = random.Random(seed).sample(range(NUM_WORDS), num_words)
        self.period = period

    def sample_with_oracle(self, g: random.Random, length: int) -> tuple[list[int], list[int]]:
        """A document and, per position, its determined NEXT token (-1 inside the first period)."""
        span = [g.choice(self.words) for _ in range(self.period)]
        toks = [span[i % self.period] for i in range(length + 1)]
        return toks[:length], [-1] * (self.period - 1) + toks[self.period:]

    def sample(self, g: random.Random, length: int) -> list[int]:
        return self.sample_with_oracle(g, length)[0]


def sample_batch(grammar: PhraseGrammar, g: random.Random, batch: int, length: int) -> torch.Tensor:
    return torch.tensor([grammar.sample(g, length) for _ in range(batch)], dtype=torch.long)  # [batch, length]


# ----------------------------------------------------------------------------- target

def make_target_model(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, qk_norm_gain: float = 1.0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                      max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      eos_token_id=EOS_ID, pad_token_id=PAD_ID, bos_token_id=None, attn_implementation="sdpa")
    model = Qwen3ForCausalLM(cfg)
    set_qk_norm_gain(model.model.layers, qk_norm_gain)
    return model


@torch.no_grad()
def set_qk_norm_gain(layers, gain: float) -> None:
    """Qwen3 normalises q and k per head, so an attention logit is at most gain^2 * sqrt(head_dim): at gain 1 no
    head can attend sharply to one earlier position. A larger initial gain lifts that cap from the first step."""
    for layer in layers:
        layer.self_attn.q_norm.weight.fill_(gain)
        layer.self_attn.k_norm.weight.fill_(gain)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train_target(model, grammar: PhraseGrammar, args, log) -> dict:
    g = random.Random(args.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=args.target_lr, betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    t0 = time.time()
    loss_ema = None
    for step in range(args.target_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.target_steps, args.target_lr, warmup=30)
        ids = sample_batch(grammar, g, args.target_batch, args.target_seq)  # [batch, T]
        logits = model(input_ids=ids).logits  # [batch, T, V]
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        if step % 50 == 0 or step == args.target_steps - 1:
            log(f"target step {step:5d}  loss {loss_ema:.4f}  {time.time() - t0:6.1f}s")
    model.eval()
    return {"target_steps": args.target_steps, "target_final_loss_ema": round(loss_ema, 4),
            "target_train_s": round(time.time() - t0, 1)}


@torch.no_grad()
def target_quality(model, grammar: PhraseGrammar, seed: int) -> dict:
    """How sure and how right the target is on held-out text.

    `oracle_agreement`: fraction of positions where the target's argmax equals the most likely
    next token under the grammar (the determined word inside a phrase, the first word of the 0.6
    successor after one). `greedy_confidence`: mean top probability along greedy continuations.
    """
    g = random.Random(seed)
    agree = total = 0
    for _ in range(4):
        batch = [grammar.sample_with_oracle(g, 128) for _ in range(32)]
        ids = torch.tensor([b[0] for b in batch])
        oracle = torch.tensor([b[1] for b in batch])
        pred = model(input_ids=ids).logits.argmax(-1)  # [32, T]
        # skip the first 16 positions: a window may start mid-phrase with too little context;
        # -1: no determined next token (span recall: fresh spans and span ends)
        known = oracle[:, 16:-1] >= 0
        agree += (pred[:, 16:-1] == oracle[:, 16:-1])[known].sum().item()
        total += known.sum().item()
    prompts = sample_batch(grammar, g, 32, 32)
    out = model.generate(prompts, max_new_tokens=64, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=PAD_ID)
    top = torch.stack([s.softmax(-1).max(-1).values for s in out.scores], 1)  # [32, 64]
    return {"oracle_agreement": round(agree / total, 4), "greedy_confidence_mean": round(top.mean().item(), 4),
            "greedy_confidence_min": round(top.min().item(), 4)}


# ----------------------------------------------------------------------------- target features

class FeatureTap:
    """Hidden states the draft consumes, captured from a transformers Qwen3 forward.

    aux id k (speculators) = residual stream entering decoder layer k = HF hidden_states[k].
    The pre-norm output of the last layer (what speculators calls verifier_last_hidden_states)
    is taken by a hook on the final norm, since HF's hidden_states[-1] is after the norm.
    """

    def __init__(self, model, aux_ids: list[int]):
        self.model, self.aux_ids, self.last = model, aux_ids, None
        model.model.norm.register_forward_pre_hook(self._hook)

    def _hook(self, module, inputs):
        self.last = inputs[0]

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor):  # ids [b, T]
        out = self.model(input_ids=ids, output_hidden_states=True)
        aux = torch.cat([out.hidden_states[k] for k in self.aux_ids], dim=-1)  # [b, T, len(aux)*H]
        return aux, self.last, out.logits  # last: [b, T, H]


@torch.no_grad()
def greedy_corpus(model, grammar: PhraseGrammar, args, seed: int, count: int) -> list[tuple[int, list[int]]]:
    """Prompts from the grammar continued by the target's own greedy decoding: (prompt_len, tokens)."""
    g = random.Random(seed)
    out = []
    lens = args.prompt_lens
    for i in range(0, count, 64):
        n = min(64, count - i)
        plen = lens[(i // 64) % len(lens)]
        prompts = sample_batch(grammar, g, n, plen)
        seqs = model.generate(prompts, max_new_tokens=args.gen_tokens, do_sample=False, pad_token_id=PAD_ID)
        out += [(plen, s.tolist()) for s in seqs]
    return out


# ----------------------------------------------------------------------------- draft

def make_draft(target_dir: Path, args, aux_ids: list[int]):
    from speculators.models.dflash import DFlashDraftModel
    from speculators.train.cli import create_transformer_layer_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # trainer default shaping: every layer sliding_attention (window 2048 > any context here),
        # sliding_window_non_causal false -> causal inside the block
        layer_cfg = create_transformer_layer_config(str(target_dir), args.draft_layers, "qwen3", None, 2048, [])
        draft = DFlashDraftModel.from_training_args(
            layer_cfg, draft_vocab_size=VOCAB, block_size=args.block_size, verifier_name_or_path=str(target_dir),
            target_layer_ids=aux_ids, mask_token_id=MASK_ID, draft_attn_impl="sdpa")
    set_qk_norm_gain(draft.layers, args.qk_norm_gain)
    return draft


def pack(corpus, feats, last, idx: list[int], block_size: int):
    """Concatenate several documents into the [1, total] row speculators' forward expects."""
    hs, ids, lm, doc, vl = [], [], [], [], []
    for d, i in enumerate(idx):
        plen, toks = corpus[i]
        T = len(toks)
        m = torch.zeros(T)
        m[plen:] = 1  # anchors only in target-generated text, as at decode time
        hs.append(feats[i]); vl.append(last[i]); ids.append(torch.tensor(toks)); lm.append(m)
        doc.append(torch.full((T,), d))
    return (torch.cat(hs)[None], torch.cat(ids)[None], torch.cat(lm)[None], torch.cat(vl)[None],
            torch.cat(doc)[None])


def train_draft(draft, corpus, feats, last, args, log) -> dict:
    B = args.block_size
    g = torch.Generator().manual_seed(args.seed + 3)
    torch.manual_seed(args.seed + 4)  # select_anchors draws from the global generator
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.draft_lr, betas=(0.9, 0.95), weight_decay=0.01)
    # z-lab's position decay: slot k weighs exp(-(k-1)/gamma); later slots matter less
    slot = torch.arange(B)
    weight = torch.where(slot > 0, torch.exp(-(slot - 1).clamp(min=0) / args.gamma), torch.zeros(B))
    draft.train()
    t0 = time.time()
    ema = {}
    for step in range(args.draft_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.draft_steps, args.draft_lr, warmup=50)
        idx = torch.randint(len(corpus), (args.draft_docs,), generator=g).tolist()
        hs, ids, lm, vl, doc = pack(corpus, feats, last, idx, B)
        _, logits, targets, mask, _ = draft._backbone_forward(hs, ids, lm, vl, doc, max_anchors=args.anchors)
        # logits, targets: [1, anchors*B, V]; mask: [1, anchors*B] (slot 0 and padding already 0)
        greedy = targets.argmax(-1)  # the target's own greedy next token for every slot
        ce = F.cross_entropy(logits[0], greedy[0], reduction="none")  # [anchors*B]
        w = mask[0].float() * weight.repeat(args.anchors)
        loss = (ce * w).sum() / w.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            hit = (logits.argmax(-1) == greedy)[0].view(-1, B)[:, 1:]  # [anchors, B-1]
            valid = mask[0].view(-1, B)[:, 1:].bool()
            full = valid.all(-1)  # blocks wholly inside generated text
            run = hit[full].long().cumprod(-1).sum(-1).float()  # accepted drafts per block
            stats = {"loss": loss.item(), "acc": hit[valid].float().mean().item(),
                     "tau": (run.mean().item() + 1) if run.numel() else float("nan")}
            for k, v in stats.items():
                ema[k] = v if k not in ema else 0.95 * ema[k] + 0.05 * v
        if step % 50 == 0 or step == args.draft_steps - 1:
            log(f"draft step {step:5d}  loss {ema['loss']:.4f}  slot acc {ema['acc']:.3f}  "
                f"train tau {ema['tau']:.2f}  {time.time() - t0:6.1f}s")
    draft.eval()
    return {"draft_steps": args.draft_steps, "draft_final_loss_ema": round(ema["loss"], 4),
            "draft_train_slot_acc_ema": round(ema["acc"], 4), "draft_train_tau_ema": round(ema["tau"], 3),
            "draft_train_s": round(time.time() - t0, 1)}


# ----------------------------------------------------------------------------- greedy tau, reference loop

@torch.no_grad()
def draft_propose_reference(draft, feats: torch.Tensor, tokens: list[int]) -> list[int]:
    """B-1 proposals through speculators' own anchored-block forward, one anchor, no caches.

    feats [1, s, F]: target features of the s committed tokens before the anchor tokens[s].
    """
    B = draft.block_size
    s = len(tokens) - 1
    n = s + 1 + B  # select_anchors never picks the last B positions: pad past the block
    hs = torch.zeros(1, n, feats.shape[-1])
    hs[:, :s] = feats
    ids = torch.full((1, n), MASK_ID)
    ids[0, : s + 1] = torch.tensor(tokens)
    lm = torch.zeros(1, n)
    lm[0, s] = 1
    vl = torch.zeros(1, n, draft.hidden_size)
    _, logits, _, _, _ = draft._backbone_forward(hs, ids, lm, vl, torch.zeros(1, n, dtype=torch.long), max_anchors=1)
    return logits[0, 1:B].argmax(-1).tolist()  # slots 1..B-1


@torch.no_grad()
def speculative_reference(draft, tap: FeatureTap, prompt: list[int], max_new: int):
    """docs/formats.md section 7, greedy, batch 1, recomputing everything (slow, simple, independent of the runtime)."""
    aux, _, logits = tap(torch.tensor([prompt]))
    toks = prompt + [logits[0, -1].argmax().item()]
    accepted_lengths = []
    while len(toks) - len(prompt) < max_new:
        s = len(toks) - 1
        # like the runtime: never verify more than can still be emitted (a causal draft's first
        # slots do not depend on the block length, so this only trims)
        size = min(draft.block_size, max_new - (len(toks) - len(prompt)) + 1)
        proposals = draft_propose_reference(draft, aux[:, :s], toks)[: size - 1]
        block = [toks[-1]] + proposals
        aux, _, logits = tap(torch.tensor([toks[:-1] + block]))
        pred = logits[0, s:].argmax(-1).tolist()  # pred[i] = target's token after block[i]
        a = 0
        while a < len(proposals) and proposals[a] == pred[a]:
            a += 1
        toks += proposals[:a] + [pred[a]]
        accepted_lengths.append(a + 1)
    return toks[len(prompt):][:max_new], accepted_lengths


@torch.no_grad()
def target_greedy_reference(model, prompt: list[int], max_new: int) -> list[int]:
    toks = list(prompt)
    for _ in range(max_new):
        toks.append(model(input_ids=torch.tensor([toks])).logits[0, -1].argmax().item())
    return toks[len(prompt):]


def per_position_rates(accepted_lengths: list[int], B: int) -> list[float]:
    """Rate at which draft position k (1-based) was accepted, over all drafts (vLLM's definition)."""
    n = len(accepted_lengths)
    return [round(sum(1 for L in accepted_lengths if L - 1 >= k) / n, 4) for k in range(1, B)]


def measure_reference(draft, target, aux_ids, prompts, max_new, log) -> dict:
    tap = FeatureTap(target, aux_ids)
    lengths, same = [], 0
    for p in prompts:
        spec, acc = speculative_reference(draft, tap, p, max_new)
        base = target_greedy_reference(target, p, max_new)
        same += spec == base
        lengths += acc
    res = {"loop": "examples/train_pair.py reference loop (speculators forward, no caches)",
           "prompts": len(prompts), "max_new_tokens": max_new, "num_drafts": len(lengths),
           "tau": round(sum(lengths) / len(lengths), 3), "outputs_equal_target_greedy": f"{same}/{len(prompts)}",
           "per_position_rates": per_position_rates(lengths, draft.block_size)}
    log(f"reference loop: tau {res['tau']}  equal {res['outputs_equal_target_greedy']}")
    return res


def measure_runtime(draft_dir: Path, target_dir: Path, prompts, max_new, log, layer_ids: list[int] | None = None,
                    label: str = "") -> dict | None:
    """Greedy tau with the project's own runtime, when it is installed; `layer_ids` mis-wires the draft on purpose
    (its context fed from those target layers instead of its own)."""
    try:
        from dflash_runtime.decode import speculative_generate, target_generate
        from dflash_runtime.draft_load import load_draft
        from dflash_runtime.target_load import load_target
    except ImportError as e:
        log(f"dflash_runtime not available ({e}); only the reference loop measured tau")
        return None
    draft = load_draft(str(draft_dir))
    target = load_target(str(target_dir))
    if layer_ids is not None:
        draft.target_layer_ids = list(layer_ids)
    drafts = accepted = same = 0
    pos = None
    for p in prompts:
        spec = speculative_generate(draft, target, p, max_new_tokens=max_new)
        base = target_generate(target, p, max_new_tokens=max_new)
        same += spec.tokens == base.tokens
        st = spec.stats
        rates = [r * st.num_drafts for r in st.per_position_rates]
        pos = rates if pos is None else [a + b for a, b in zip(pos, rates)]
        drafts += st.num_drafts
        accepted += st.accepted
    res = {"loop": "dflash_runtime.decode.speculative_generate", "backend": draft.backend,
           "prompts": len(prompts), "max_new_tokens": max_new, "num_drafts": drafts,
           "tau": round(1 + accepted / drafts, 3), "outputs_equal_target_greedy": f"{same}/{len(prompts)}",
           "per_position_rates": [round(x / drafts, 4) for x in pos]}
    if layer_ids is not None:
        res["target_layer_ids"] = list(layer_ids)
    log(f"runtime{label}: tau {res['tau']}  equal {res['outputs_equal_target_greedy']}")
    return res


def miswirings(ids: list[int], num_layers: int) -> dict[str, list[int]]:
    """The common ways a draft's context gets fed from the wrong target layers (each that exists here)."""
    out = {"every id one layer up": [i + 1 for i in ids], "every id one layer down": [i - 1 for i in ids],
           "ids in the wrong order": ids[::-1], "the last id from the final layer": ids[:-1] + [num_layers - 1]}
    return {k: v for k, v in out.items() if v != ids and all(0 <= i < num_layers for i in v)}


def measure_miswired(draft_dir: Path, target_dir: Path, ids: list[int], num_layers: int, prompts, max_new, good: dict,
                     log) -> list[dict]:
    """Greedy tau with the draft deliberately fed from the wrong layers: how much the wiring matters."""
    rows = []
    for name, wrong in miswirings(ids, num_layers).items():
        r = measure_runtime(draft_dir, target_dir, prompts, max_new, log, layer_ids=wrong, label=f" ({name} {wrong})")
        rows.append({"wiring": name, "target_layer_ids": wrong, "tau": r["tau"],
                     "share_of_good_tau": round(r["tau"] / good["tau"], 3),
                     "outputs_equal_target_greedy": r["outputs_equal_target_greedy"]})
    return rows


# ----------------------------------------------------------------------------- main

def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "pair")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--corpus", choices=["repeats", "phrases"], default="repeats",
                    help="repeats: one random span repeated, so a draft must read the context (its target layers); "
                         "phrases: a memorisable phrase grammar, on which a draft leans on the anchor token instead")
    ap.add_argument("--period", type=int, default=8, help="repeats: span length")
    ap.add_argument("--words", type=int, default=192,
                    help="phrases: distinct words the 64 phrases are made of (fewer = more ambiguous tokens)")
    ap.add_argument("--span-words", type=int, default=128, help="repeats: distinct words spans are drawn from")
    ap.add_argument("--target-layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--intermediate", type=int, default=192)
    ap.add_argument("--qk-norm-gain", type=float, default=2.5, help="initial q/k norm weights of target and draft "
                    "(above 1: attention can be sharp from the start, which copying needs)")
    ap.add_argument("--target-steps", type=int, default=1500)
    ap.add_argument("--target-batch", type=int, default=16)
    ap.add_argument("--target-seq", type=int, default=128)
    ap.add_argument("--target-lr", type=float, default=5e-3)
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--target-layer-ids", type=int, nargs="+", default=None,
                    help="z-lab ids of the target layers the draft reads (default: the published rule)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--draft-steps", type=int, default=600)
    ap.add_argument("--draft-docs", type=int, default=8, help="documents packed per draft step")
    ap.add_argument("--anchors", type=int, default=64, help="anchors per draft step")
    ap.add_argument("--draft-lr", type=float, default=2e-3)
    ap.add_argument("--gamma", type=float, default=None, help="slot loss decay; default 7 / 5 / 4 for B >= 16 / 10 / 8")
    ap.add_argument("--draft-corpus", type=int, default=256, help="target-generated documents for the draft")
    ap.add_argument("--gen-tokens", type=int, default=64, help="greedy tokens generated per draft document")
    ap.add_argument("--prompt-lens", type=int, nargs="+", default=[16, 24, 32, 40])
    ap.add_argument("--eval-prompts", type=int, default=16)
    ap.add_argument("--eval-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="dtype of the saved pair")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.gamma is None:
        args.gamma = 7.0 if args.block_size >= 16 else 5.0 if args.block_size >= 10 else 4.0
    ids = args.target_layer_ids
    if ids is not None and (ids != sorted(set(ids)) or not 0 <= ids[0] <= ids[-1] < args.target_layers):
        ap.error(f"--target-layer-ids {ids}: must be increasing layers of the {args.target_layers}-layer target")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    t_start = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:7.1f}s] {msg}", flush=True)

    import transformers
    from loguru import logger
    from transformers import Qwen3ForCausalLM

    from dflash_convert.format.mapping import aux_ids_from_target, build_target_layer_ids

    transformers.utils.logging.disable_progress_bar()
    logger.disable("speculators")  # per-file INFO lines about where it loads the verifier from
    save_dtype = getattr(torch, args.dtype)
    out = args.out.resolve()
    target_dir, draft_dir = out / "target", out / "draft"
    out.mkdir(parents=True, exist_ok=True)
    grammar = (PhraseGrammar(args.seed, args.words) if args.corpus == "phrases"
               else Repeats(args.seed, args.span_words, args.period))
    record: dict = {"seed": args.seed, "command": "python " + " ".join([_rel(sys.argv[0])] + sys.argv[1:]),
                    "args": {k: (_rel(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}

    # 1-2. target
    target = make_target_model(args.target_layers, args.hidden, args.heads, args.kv_heads, args.intermediate,
                               args.qk_norm_gain)
    log(f"target: {sum(p.numel() for p in target.parameters()) / 1e6:.2f}M params, {args.target_layers} layers")
    record["target_training"] = train_target(target, grammar, args, log)
    target.to(save_dtype).save_pretrained(target_dir)
    # from here on the target is exactly what ships: reloaded from disk, computing in float32
    target = Qwen3ForCausalLM.from_pretrained(target_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    for p in target.parameters():
        p.requires_grad_(False)
    record["target_quality"] = target_quality(target, grammar, args.seed + 100)
    log(f"target quality: {record['target_quality']}")

    # 3. draft: z-lab target layer ids (by default the published rule), speculators aux ids = id + 1
    zlab_ids = args.target_layer_ids or build_target_layer_ids(args.target_layers, args.draft_layers)
    aux_ids = aux_ids_from_target(zlab_ids)
    record["target_layer_ids_zlab"], record["aux_hidden_state_layer_ids"] = zlab_ids, aux_ids
    corpus = greedy_corpus(target, grammar, args, args.seed + 2, args.draft_corpus)
    tap = FeatureTap(target, aux_ids)
    feats, last = [], []
    for i in range(0, len(corpus), 64):  # greedy_corpus makes runs of 64 documents of one length
        a, l, _ = tap(torch.tensor([c[1] for c in corpus[i:i + 64]]))
        feats += list(a)
        last += list(l)
    log(f"draft corpus: {len(corpus)} target-generated documents, features {tuple(feats[0].shape)}")
    draft = make_draft(target_dir, args, aux_ids)
    record["draft_training"] = train_draft(draft, corpus, feats, last, args, log)
    # the config records where the verifier lives: keep it relative to the repository root
    draft.config.speculators_config.verifier.name_or_path = _rel(target_dir)
    draft.to(save_dtype).save_pretrained(draft_dir)
    (draft_dir / "config.py").unlink(missing_ok=True)  # speculators writes a junk config.py; nothing reads it
    draft.to(torch.float32)  # the shipped weights, computing in float32 (the verifier's lm_head/embeddings too)

    # 5. held-out prompts: a seed the training never used
    g = random.Random(args.seed + 1000)
    prompts = [grammar.sample(g, g.choice(args.prompt_lens)) for _ in range(args.eval_prompts)]
    (out / "prompts.txt").write_text("".join(" ".join(map(str, p)) + "\n" for p in prompts))

    # 6. tau, on the pair as shipped (bf16-rounded weights, float32 compute)
    record["tau_reference"] = measure_reference(draft, target, aux_ids, prompts, args.eval_new_tokens, log)
    record["tau_runtime"] = measure_runtime(draft_dir, target_dir, prompts, args.eval_new_tokens, log)
    if record["tau_runtime"]:
        record["tau_miswired"] = measure_miswired(draft_dir, target_dir, zlab_ids, args.target_layers, prompts,
                                                  args.eval_new_tokens, record["tau_runtime"], log)
    record["sizes_bytes"] = {"target": _dir_size(target_dir), "draft": _dir_size(draft_dir)}
    record["versions"] = _versions()
    record["total_s"] = round(time.time() - t_start, 1)
    (out / "training_record.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "README.md").write_text(readme(record, args))
    log(f"done: {json.dumps(record['sizes_bytes'])}  total {record['total_s']}s -> {out}")
    return 0


def readme(r: dict, args) -> str:
    tq, td, dd = r["target_quality"], r["target_training"], r["draft_training"]
    runs = [x for x in (r.get("tau_runtime"), r["tau_reference"]) if x]
    tau_lines = "\n".join(
        f"| {x['loop']} | {x['prompts']} | {x['max_new_tokens']} | {x['num_drafts']} | **{x['tau']}** | "
        f"{x['outputs_equal_target_greedy']} |" for x in runs)
    rates = "\n".join(f"- {x['loop']}: " + ", ".join(f"{v:.3f}" for v in x["per_position_rates"]) for x in runs)
    v = r["versions"]
    return f"""# A trained target / DFlash draft pair (tiny, CPU-made)

Made by `examples/train_pair.py` so that acceptance means something: random drafts accept nothing.
Regenerate it with exactly (from the repository root, {args.threads} CPU threads, seed {r['seed']}):

```
{r['command']}
```

Versions: Python {v['python']}, torch {v['torch']}, transformers {v['transformers']},
speculators {v['speculators']}. Total run: {r['total_s']} s on this machine (2 cores, shared).
Sizes: target {r['sizes_bytes']['target'] / 1e6:.2f} MB, draft {r['sizes_bytes']['draft'] / 1e6:.2f} MB
(safetensors, {args.dtype}).

## What is in here

- `target/`: `Qwen3ForCausalLM`, {args.target_layers} layers, hidden {args.hidden}, {args.heads}/{args.kv_heads} heads,
  intermediate {args.intermediate}, vocab {VOCAB} (`save_pretrained`). Reserved ids: {MASK_ID} = mask (the
  draft's block filler), {EOS_ID} = eos, {PAD_ID} = pad; none occurs in the corpus.
- `draft/`: a DFlash draft in the speculators format, built and saved by speculators' own
  `DFlashDraftModel` (`from_training_args`, `save_pretrained`): {args.draft_layers} layers, same hidden size,
  block size {args.block_size}, mask token {MASK_ID}, full target vocab (no `lm_head` saved: it is the
  target's). Target layers (z-lab ids{', published rule `build_target_layer_ids`' if args.target_layer_ids is None else ''}): {r['target_layer_ids_zlab']},
  saved as speculators `aux_hidden_state_layer_ids` {r['aux_hidden_state_layer_ids']} (= id + 1).
  **Causality: causal.** It has the speculators trainer's default shape, every layer `sliding_attention`
  (window 2048, longer than any context here) with `sliding_window_non_causal: false`, so a block
  slot sees the context and the block slots up to itself. It was trained with that mask, so it is
  a "speculators-style" causal DFlash: converted to the z-lab format it needs
  `dflash_config.causal: true` (or its `layer_types`), or engines run it non-causally.
- `prompts.txt`: {args.eval_prompts} held-out prompts, one per line, token ids separated by spaces
  (what `dflash-convert validate --prompts` reads). Same distribution as training, from a seed
  training never used.
- `training_record.json`: every argument and figure below, machine-readable.

## The language

{language(r, args)}

## Training

1. Target: {td['target_steps']} steps of next-token cross-entropy, batch {args.target_batch} x {args.target_seq} fresh
   sequences, AdamW peak lr {args.target_lr}, cosine, q/k norm weights (target and draft) initialised to
   {args.qk_norm_gain}; final loss (EMA) {td['target_final_loss_ema']}
   ({"the grammar's entropy floor is about 0.16" if args.corpus == "phrases" else
     f"the first span cannot be predicted: {args.period - 1}/{args.target_seq - 1} of the positions at ln {args.span_words}, "
     f"{(args.period - 1) / (args.target_seq - 1) * math.log(args.span_words):.2f} nats per token on average"}); {td['target_train_s']} s.
   On held-out text its argmax equals {"the grammar's most likely next token" if args.corpus == "phrases" else
     "the determined next token (after the first span)"} at {tq['oracle_agreement'] * 100:.2f}%
   of {"positions" if args.corpus == "phrases" else "such positions"}; along greedy continuations its top probability
   is {tq['greedy_confidence_mean']:.3f} on average{" (phrase ends are at most 0.6 by construction)" if args.corpus == "phrases"
     else f" (minimum {tq['greedy_confidence_min']:.3f}): greedy decoding has no near-ties for bfloat16 to flip"}.
2. The target is saved in {args.dtype} and reloaded; everything after uses exactly the shipped weights.
3. Draft data: {args.draft_corpus} prompts from the corpus continued {args.gen_tokens} tokens by the target's own
   greedy decoding (so the teacher-forced target predictions below are the greedy rollout).
4. Draft: {dd['draft_steps']} steps of the DFlash objective through speculators' `_backbone_forward` (its own
   anchored-block mask, sdpa): per step {args.draft_docs} documents packed, {args.anchors} random anchors in the
   generated text; context = target features of the tokens before the anchor; block =
   [token at anchor, MASK x {args.block_size - 1}]; cross-entropy of slots 1..{args.block_size - 1} against the target's
   own greedy next tokens, slot k weighted exp(-(k-1)/{args.gamma}); AdamW peak lr {args.draft_lr}.
   Final loss (EMA) {dd['draft_final_loss_ema']}, slot accuracy {dd['draft_train_slot_acc_ema']}, training-block tau
   {dd['draft_train_tau_ema']}; {dd['draft_train_s']} s.

## Measured greedy tau on the held-out prompts (block size {args.block_size})

tau = mean over draft steps of (accepted drafts + 1); the block is shortened at the end so that no
more tokens are verified than can be emitted (as the runtime does).

| decode loop | prompts | new tokens | drafts | tau | output == target greedy |
|---|---|---|---|---|---|
{tau_lines}

Per-position acceptance rates (share of draft steps whose draft k was accepted, k = 1..{args.block_size - 1}):
{rates}
{miswired_table(r)}"""


def language(r: dict, args) -> str:
    if args.corpus == "phrases":
        return f"""`PhraseGrammar` (seed {r['seed']}): 64 fixed phrases of 3-8 tokens drawn from {args.words} distinct words
(about 360 phrase slots, so words recur across phrases), chained by a Markov chain: after each phrase
one of its 3 successors follows with probability 0.6 / 0.3 / 0.1. Documents are windows of the
endless stream (no eos). Inside a phrase the next token is determined; at a phrase end the most
likely next token is the first word of the 0.6 successor, so greedy continuations are
deterministic walks that a draft can learn."""
    if args.corpus == "repeats":
        return f"""`Repeats` (seed {r['seed']}): every document is one span of {args.period} tokens drawn uniformly from
{args.span_words} content words, repeated to the document's end: each token is the one {args.period} back. The span
is fresh per document, so nothing about it can be memorised: after the first period the continuation
is determined, but only by the context, and a draft continues it only by reading the target's
features of the context: its target layer ids matter (measured below)."""


def miswired_table(r: dict) -> str:
    rows = r.get("tau_miswired")
    if not rows:
        return ""
    good = r["tau_runtime"]
    lines = "\n".join(f"| {x['wiring']} | {x['target_layer_ids']} | {x['tau']} | {x['share_of_good_tau']:.2f} | "
                      f"{x['outputs_equal_target_greedy']} |" for x in rows)
    return f"""
## How much the wiring matters

The same prompts through `dflash_runtime.decode.speculative_generate` with the draft's context deliberately
fed from the wrong target layers (what a lost `+1` between the two formats' layer ids, or a reordered
list, does). Greedy decoding stays lossless; only acceptance shows the bug.

| draft fed from | target layer ids | tau | share of the right wiring's tau | output == target greedy |
|---|---|---|---|---|
| the right layers | {r['target_layer_ids_zlab']} | {good['tau']} | 1.00 | {good['outputs_equal_target_greedy']} |
{lines}
"""


def _rel(p) -> str:
    """A path relative to the repository root when it is inside it (portable records)."""
    root = Path(__file__).resolve().parents[1]
    p = Path(p).resolve()
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)


def _dir_size(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


def _versions() -> dict:
    import speculators
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "speculators": speculators.__version__ if hasattr(speculators, "__version__") else "0.9.0"}


if __name__ == "__main__":
    sys.exit(main())
