"""What a validation run prepares before any slow work: the target's config, the engine's reading of the draft,
the mask embedding, the block of each end-to-end run, the prompts as token ids and the sampling. Everything that
can fail on bad input fails here, before a weight is loaded.

Multi-turn prompts (MT-Bench's second turn, or any chat with an assistant turn marked `"generate": true`) are
finished once the target is loaded (`answer_earlier_turns`): the target answers the conversation so far, its
answer (decoded without special tokens, as z-lab's benchmark feeds it back) becomes that assistant turn, and the
chat is rendered again up to the next such turn or in full. The answer is the target's own decoding (target-only,
the run's sampling, penalties, stop ids and seed): the same for every draft, so two runs of one target measure
the same prompts.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.format import catalogue, engine_views, engines, kinds, mapping, serving
from dflash_convert.io.checkpoint import Checkpoint
from dflash_convert.io.reading import read_json
from dflash_convert.validate.baseline import SAMPLING_KEYS, check_same_settings, load_baseline, prompt_ids_sha256
from dflash_convert.validate.end_to_end import Prompts
from dflash_convert.validate.gpu_prediction import check_prediction_configs
from dflash_convert.validate.options import ValidateOptions
from dflash_convert.validate.prompts import (chat_template, load_tokenizer, pending_turn, read_prompts, render_chat,
                                             tokenize_prompts)
from dflash_convert.validate.report import SamplingUsed, ValidationReport
from dflash_convert.validate.sampling import generation_config, resolve_sampling, runtime_sampling, stop_token_ids
from dflash_convert.validate.static import Check


@dataclass
class Target:
    """The --target as read: its folder, its config.json, whether weights sit beside it, what its config says."""

    dir: Path
    config: Path
    has_weights: bool
    info: mapping.TargetInfo


@dataclass
class Prepared:
    """What a validation run was given, and what it read of it before any slow work."""

    path: str | Path  # the checkpoint, as named
    opts: ValidateOptions
    say: Callable[[str], None]
    quiet: bool  # no progress wanted: transformers' own loading bar stays off too
    given: Checkpoint  # the checkpoint as given (the static level reads it)
    ckpt: Checkpoint  # as run: the engine's reading of it under --engine
    blocks: list[int | None] = field(default_factory=list)  # the block (slots) of each end-to-end run, one per K
    target: Target | None = None
    view: Any = None  # engine_views.EngineView under --engine
    draft_options: dict[str, Any] = field(default_factory=dict)  # how load_draft runs the draft as served
    last_layer_post_norm: bool = False  # the engine feeds the draft the target's last layer after the final norm
    mask_check: Check | None = None
    prompts: Prompts | None = None  # token ids, named sets and format, when end to end is wanted with weights
    chats: dict[int, list] = field(default_factory=dict)  # prompt index -> chat with turns the target answers
    rendering: dict[str, Any] = field(default_factory=dict)  # how prompts were rendered (tokenizer, template, ...)
    template_skipped: str | None = None  # why no chat template rendered any prompt (--chat-template-kwargs unused)
    sampling: SamplingUsed | None = None
    baseline: ValidationReport | None = None  # --baseline, read before any slow work

    @property
    def block(self) -> int | None:
        """The run's block: --block-size or the first K's, else the draft's own (as run). The numeric level,
        --baseline's settings and the first end-to-end run use it; each later K runs at its own."""
        return self.blocks[0]

    @property
    def target_has_weights(self) -> bool:
        return self.target is not None and self.target.has_weights


def prepare(prep: Prepared) -> None:
    """Read the target's config, the engine's reading, the mask embedding and the prompts: everything that can
    fail on bad input, before any slow work. Fills `prep` in place, so that a Ctrl-C keeps what was read."""
    opts = prep.opts
    if opts.target is not None:
        target_dir, config, weights = _target_paths(opts.target)
        prep.target = Target(target_dir, config, weights,
                             mapping.target_info(read_json(config), target_name(opts), file=str(config)))
        if opts.context_lengths and opts.max_model_len is None:  # past the target's own positions: exit 2 now
            from dflash_convert.validate.trained_context import check_context_lengths, target_positions

            positions, stated = target_positions(read_json(config))
            check_context_lengths(opts.context_lengths, opts.max_new_tokens, positions=positions, stated=stated)
    if opts.engine is not None:
        prep.view = engine_views.serving_view(prep.ckpt, opts.engine, num_target_layers=prep.target.info.num_layers
                                              if prep.target is not None else None)
        prep.ckpt = engine_views.applied_checkpoint(prep.ckpt, prep.view)
    if "end_to_end" in opts.levels and prep.target_has_weights:  # where --predict-gpu will have a tau to predict
        check_prediction_configs(opts, prep.target.config, prep.ckpt.raw_config, str(prep.ckpt.config_file))
    own = prep.ckpt.spec.block_size
    prep.blocks = [b or own for b in opts.blocks(serving.anchor_proposes(prep.given.spec))]
    rule = engines.ENGINES_BY_KEY[prep.view.engine] if prep.view is not None else None
    per_query = prep.view is not None and prep.view.window_semantics == engines.WindowSemantics.PER_QUERY
    prep.draft_options = {"window_per_query": per_query}
    prep.mask_check, prep.draft_options["mask_embedding"] = _mask_embedding(
        prep.ckpt, allow_pickle=opts.allow_pickle,
        # vLLM 0.33's and SGLang 0.5.23's DSpark loaders drop a mask embedding (the mask slots embed the vocab row)
        ignored=rule is not None and rule.mask_embedding == engines.MaskEmbedding.IGNORED
        or kinds.of(prep.ckpt.spec.variant).drops_mask_embedding)
    prep.last_layer_post_norm = rule is not None and rule.last_layer == engines.LastLayer.POST_NORM
    prompts = opts.prompts
    categories: list[str | None] = []  # each file prompt's JSONL `category` (None: none)
    prompt_list = read_prompts(prompts, categories) if isinstance(prompts, (str, Path)) else prompts
    _check_gated_categories(opts, categories)
    if opts.baseline is not None:
        prep.baseline = load_baseline(opts.baseline)
    if "end_to_end" in opts.levels and prep.target_has_weights:
        _prepare_decoding(prep, prompt_list, str(prompts) if isinstance(prompts, (str, Path)) else "prompts")
        prep.prompts.categories = checked_categories(opts, categories, len(prep.prompts.ids))
        if prep.baseline is not None and not prep.chats:  # else once the target answered the earlier turns
            check_same_settings(prep.baseline, opts.baseline, settings(prep))


def target_name(opts: ValidateOptions) -> str | None:
    return opts.target_name or (str(opts.target) if opts.target is not None else None)


def settings(prep: Prepared) -> dict[str, Any]:
    """This run's settings as baseline.settings names them, known before decoding."""
    s, ids = prep.sampling, prep.prompts.ids
    out = {"prompt token ids (SHA-256)": prompt_ids_sha256(ids), "prompts": len(ids), "block size": prep.block,
           "max new tokens": prep.opts.max_new_tokens, "draft sampling": prep.opts.draft_sampling,
           "prompt lengths": [len(p) for p in ids]}
    return out | {k: getattr(s, k) for k in SAMPLING_KEYS}


def _prepare_decoding(prep: Prepared, prompt_list, source: str) -> None:
    """Token ids of the prompts (and of each named prompt set), through the chat template as the engine
    applies it; the sampling parameters and stop ids, as vLLM resolves them for the target."""
    opts, target_dir, info = prep.opts, prep.target.dir, prep.target.info
    avoid = {i for i in (prep.ckpt.spec.mask_token_id, info.pad_token_id, *info.eos_token_ids) if i is not None}
    tokenizer = load_tokenizer(target_dir)
    template, prompt_format = (chat_template(tokenizer, opts.chat_template, target_dir) if tokenizer is not None
                               else (None, "token ids (the target ships no tokenizer)"))
    if template is not None and opts.chat_template_kwargs:
        prompt_format += f" with {json.dumps(opts.chat_template_kwargs, sort_keys=True)}"
    how = dict(tokenizer=tokenizer, template=template, template_kwargs=opts.chat_template_kwargs,
               template_name=opts.chat_template if opts.chat_template not in ("auto", "none") else str(target_dir))
    groups: list[tuple[str | None, str, list[list[int]], list]] = []
    if prompt_list is not None or not opts.prompt_sets:
        ids, described = tokenize_prompts(prompt_list, target_dir, info.vocab_size, avoid, source=source, **how)
        groups.append((None, described, ids, list(prompt_list or [])))
    for named in opts.prompt_sets:
        ids, _ = tokenize_prompts(named.prompts, target_dir, info.vocab_size, avoid, source=named.source, **how)
        groups.append((named.name, named.source, ids, named.prompts))
    prep.template_skipped = _template_skipped(tokenizer, template, prompt_list is None and not opts.prompt_sets,
                                              [p for *_, raw in groups for p in raw])
    prep.prompts = Prompts([], format=prompt_format, builtin=groups[0][1] if prompt_list is None and
                           not opts.prompt_sets else None)
    prep.rendering = how
    for name, described, ids, raw in groups:
        first = len(prep.prompts.ids)
        prep.chats |= {first + k: p for k, p in enumerate(raw) if pending_turn(p) is not None}
        if name is not None:
            prep.prompts.sets.append((name, described, first, first + len(ids)))
        prep.prompts.ids += ids
    if opts.context_lengths:
        from dflash_convert.validate.breakdown import long_contexts

        prep.prompts.long = long_contexts(opts.context_lengths, opts.long_context_file, tokenizer, prompt_list,
                                          prep.prompts.ids, info.vocab_size)
    gen, gen_path = generation_config(target_dir)
    prep.sampling = resolve_sampling(opts, gen, gen_path)
    stops = stop_token_ids(info.eos_token_ids, gen, gen_path, tokenizer)
    prep.sampling.stop_token_sources = stops
    prep.sampling.stop_token_ids = sorted({i for ids in stops.values() for i in ids})


def _template_skipped(tokenizer: Any, template: str | None, builtin: bool, prompts: list) -> str | None:
    """Why no chat template renders any of the prompts (token ids go to the target as they are), else None."""
    if tokenizer is None:
        return "the target ships no tokenizer: its prompts are token ids"
    if template is None:
        return "no chat template applies (--chat-template none, or the target tokenizer has none)"
    if builtin or any(isinstance(p, str) or (isinstance(p, list) and p and isinstance(p[0], dict)) for p in prompts):
        return None
    return "every prompt is token ids"


def checked_categories(opts: ValidateOptions, categories: list[str | None], n: int) -> list[str | None]:
    """Each prompt's category (the prompts file's first, named sets' None), checked against the categories
    --min-acceptance-length names (_check_gated_categories)."""
    _check_gated_categories(opts, categories)
    return (categories + [None] * n)[:n]


def _check_gated_categories(opts: ValidateOptions, categories: list[str | None]) -> None:
    """The categories --min-acceptance-length names, against the prompts': one that no prompt carries is a usage
    error naming it, with the closest name carried (its gate would pass empty)."""
    given = sorted({c for c in categories if c is not None})
    missing = sorted(set(opts.min_category_acceptance_length) - set(given))
    if missing:  # a usage error: the flag names what the file does not hold
        where = opts.prompts if isinstance(opts.prompts, (str, Path)) else "the prompts"
        close = {m: difflib.get_close_matches(m, given, n=1) for m in missing}
        raise UsageError(f"--min-acceptance-length names categor{'ies' if len(missing) > 1 else 'y'} "
                         + ", ".join(repr(m) + (f" (did you mean {close[m][0]!r}?)" if close[m] else "")
                                     for m in missing)
                         + f", which no prompt in {where} carries (its `category` values: "
                         f"{', '.join(map(repr, given)) or 'none'})")


def answer_earlier_turns(prep: Prepared, *, device: str, dtype) -> None:
    """Multi-turn prompts: the target (loaded on `device` in `dtype`) answers the turns before the one measured,
    each chat's prompt ids replaced by its rendering with the answers filled in; then the baseline's prompts
    are checked again against the prompts as completed."""
    from dflash_runtime import load_target, target_generate

    opts, how, ids = prep.opts, prep.rendering, prep.prompts.ids
    prep.say(f"end to end: the target answers the earlier turns of {len(prep.chats)} multi-turn prompt(s)")
    target = load_target(prep.target.dir, device=device, dtype=dtype, attn_implementation=opts.target_backend,
                         device_map=opts.placed_by_device_map, max_memory=opts.max_memory)
    sampling = runtime_sampling(prep.sampling, opts.seed)  # stop ids, penalties and seed included
    for n, (i, messages) in enumerate(sorted(prep.chats.items()), 1):
        chat = [dict(m) for m in messages]
        while (k := pending_turn(chat)) is not None:
            answer = target_generate(target, ids[i], max_new_tokens=opts.max_new_tokens, sampling=sampling).tokens
            chat[k] = {"role": "assistant", "content": how["tokenizer"].decode(answer, skip_special_tokens=True)}
            rest = pending_turn(chat)
            ids[i] = render_chat(how["tokenizer"], chat if rest is None else chat[:rest], how["template"],
                                 how["template_kwargs"] or {}, how["template_name"], i + 1)
        prep.say(f"end to end: earlier turns answered by the target: {n}/{len(prep.chats)}")
    del target
    if prep.baseline is not None:
        check_same_settings(prep.baseline, opts.baseline, settings(prep))


def _target_paths(target: str | Path) -> tuple[Path, Path, bool]:
    """(model dir, config.json, has weights) of a --target given as a directory or a config.json."""
    path = Path(target)
    if path.is_file():
        return path.parent, path, False if path.name == "config.json" else True
    if not path.is_dir():
        raise DFlashError("target is neither a model directory nor a config.json", file=path)
    config = path / "config.json"
    if not config.exists():
        raise DFlashError("target directory has no config.json", file=path)
    weights = any(path.glob("*.safetensors"))
    return path, config, weights


def _mask_embedding(ckpt: Checkpoint, *, allow_pickle: bool, ignored: bool) -> tuple[Check | None, Any]:
    """(check, the vector the runtime levels embed the mask slots with, or None) for a mask_embedding.pt beside
    the weights: loaded once (pass; as vLLM and SGLang use it), unusable (fail), or present but a pickle not
    allowed (warn). No check: no file, or an engine that ignores it (--engine zlab: engine_fidelity says so)."""
    name = catalogue.MASK_EMBEDDING_FILE
    if ignored or not any(f.name == name for f in ckpt.companion_files):
        return None, None
    if not allow_pickle:
        return Check(name="mask_embedding", status="warn", value="not loaded", message=f"{name} is a pickle and "
                     "was not loaded: the runtime levels embed the mask slots with the target's row of mask_token_id "
                     "(as z-lab does), vLLM and SGLang with this file; --allow-pickle loads it (weights_only)"), None
    try:
        vector = ckpt.load_mask_embedding(allow_pickle=True)
    except DFlashError as exc:
        return Check(name="mask_embedding", status="fail", value=name, message=str(exc)), None
    return Check(name="mask_embedding", status="pass", value=list(vector.shape),
                 message=f"{name} loaded (weights_only): the runtime levels embed the mask slots with it, as vLLM "
                         "and SGLang do"), vector
