"""Tiny real checkpoints for tests: random Qwen3 targets and drafts saved by speculators 0.9.0 itself, edited
copies of a draft, a target with a word-level tokenizer and chat template, and the bit-exact tensor comparison.

Everything is built on the fly in a temporary directory; nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import torch
from safetensors import safe_open

from dflash_convert.format import mapping
from dflash_convert.io.checkpoint import open_checkpoint

VOCAB = 512
HIDDEN = 64


def make_target(path: Path, *, layers: int = 8, hidden: int = HIDDEN, vocab: int = VOCAB, seed: int = 0,
                attn: str = "sdpa") -> Path:
    """A random-weight Qwen3ForCausalLM saved with save_pretrained (config.json + model.safetensors)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=256,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=vocab - 2, pad_token_id=vocab - 3,
                      bos_token_id=None, attn_implementation=attn)
    model = Qwen3ForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return Path(path)


def make_speculators_draft(path: Path, target: Path, *, layers: int = 2, aux_ids=(1, 4, 6), block_size: int = 8,
                           mask_token_id: int = VOCAB - 1, draft_vocab: int | None = None,
                           full_attention_indices=(), sliding_window: int = 2048,
                           sliding_window_non_causal: bool | None = None, algorithm: str = "dflash",
                           legacy_save: bool = False, attention_bias: bool = False, seed: int = 1,
                           dtype=torch.float32, **family) -> Path:
    """A DFlash-family draft built and saved by speculators' own classes (trainer-default shaping).

    `algorithm` is dflash, dflash2 or dspark; `family` holds that class's own training arguments
    (dflash2: conv_kernel_size, conv_group_size, selector_rank, selector_top_k; dspark: markov_rank,
    markov_head_type, enable_confidence_head, confidence_head_with_markov, sample_from_anchor).
    `draft_vocab` < target vocab makes a pruned draft with its own lm_head and d2t/t2d.
    `legacy_save` mimics speculators <= 0.8, which also saved embed_tokens and a full lm_head.
    Every trained weight is random and not an identity (convolutions, selector, Markov and
    confidence heads included), so a round trip or a runtime that skips a module is caught.
    """
    from speculators.train.cli import create_transformer_layer_config

    if algorithm == "dflash2":
        from speculators.models.dflash2.core import DFlash2DraftModel as Model
    elif algorithm == "dspark":
        from speculators.models.dspark.core import DSparkDraftModel as Model
    else:
        from speculators.models.dflash import DFlashDraftModel as Model

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer_cfg = create_transformer_layer_config(str(target), layers, "qwen3", None, sliding_window,
                                                    list(full_attention_indices))
        layer_cfg.attention_bias = attention_bias
        vocab = layer_cfg.vocab_size
        t2d = d2t = None
        if draft_vocab is not None and draft_vocab != vocab:
            g = torch.Generator().manual_seed(seed)
            kept = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values
            kept[-1] = mask_token_id if mask_token_id not in kept else kept[-1]
            kept = torch.sort(torch.unique(kept)).values
            assert len(kept) == draft_vocab
            t2d = torch.zeros(vocab, dtype=torch.bool)
            t2d[kept] = True
            d2t = kept - torch.arange(draft_vocab)
        kwargs = dict(draft_vocab_size=draft_vocab or vocab, block_size=block_size, verifier_name_or_path=str(target),
                      target_layer_ids=list(aux_ids), mask_token_id=mask_token_id, draft_attn_impl="sdpa",
                      **family)
        if sliding_window_non_causal is not None:
            kwargs["sliding_window_non_causal"] = sliding_window_non_causal
        model = Model.from_training_args(layer_cfg, t2d=t2d, d2t=d2t, **kwargs)
        # random, finite weights for everything trained
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.startswith(("embed_tokens", "verifier_", "lm_head")) and p.is_floating_point():
                    p.copy_(torch.randn_like(p) * (0.02 if p.dim() > 1 else 1.0) + (1.0 if p.dim() == 1 else 0.0))
            if t2d is not None:
                model.lm_head.weight.copy_(torch.randn_like(model.lm_head.weight) * 0.02)
        model.to(dtype)
        if legacy_save:
            model.__dict__["_keys_to_ignore_on_save"] = ["verifier_lm_head.weight", "verifier_norm.weight"]
        model.save_pretrained(str(path))
    return Path(path)


def read_config(path: Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def copy_draft(src: Path, dst: Path, *, spec_update: dict | None = None, edit_tensors=None,
               raw_update: dict | None = None) -> Path:
    """A copy of a draft with its spec and/or tensors changed (config re-written through mapping)."""
    shutil.copytree(src, dst)
    if spec_update or raw_update:
        spec = open_checkpoint(dst).spec.model_copy(update=spec_update or {})
        config, _ = mapping.spec_to_config(spec, spec.source_format)
        config.update(raw_update or {})
        (dst / "config.json").write_text(json.dumps(config))
    if edit_tensors is not None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(dst / "model.safetensors")
        edit_tensors(tensors)
        save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


WORDS = ["[UNK]", "<s>", "</s>", "user", "system", "assistant", "hello", "world", "the", "cat", "sat", "nothink"]


# renders the BOS itself, as real templates do; a tokenizer adding its own BOS on top would double it
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m.role }} {{ m.content }} {% endfor %}"
            "{% if add_generation_prompt %}assistant{% endif %}"
            "{% if enable_thinking is defined and not enable_thinking %} nothink{% endif %}")


def chat_target(tiny_target: Path, dest: Path, *, template: str | None = TEMPLATE,
                generation: dict | None = None, every_id: bool = False) -> Path:
    """The tiny target with a word-level tokenizer whose post-processor adds a BOS (as Llama's does), a
    chat template when given, and a generation_config.json when given. `every_id`: a word for every id of the
    target's vocabulary (`t<id>` past WORDS), so the target's own answers decode to text and back."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    shutil.copytree(tiny_target, dest)
    words = WORDS + ([f"t{i}" for i in range(len(WORDS), read_config(dest)["vocab_size"])] if every_id else [])
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(dest)
    if generation is not None:
        (dest / "generation_config.json").write_text(json.dumps(generation))
    return dest


def token_words_target(target: Path, dest: Path) -> Path:
    """A copy of `target` whose tokenizer reads the word `t<i>` as token id i (no BOS) and whose chat template
    renders the messages' contents alone: the text `t409 t399` and the ids [409, 399] are the same prompt, through
    a server's chat endpoint and its completions endpoint alike."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    shutil.copytree(target, dest)
    config = read_config(dest)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(config["vocab_size"])}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token=f"t{config['eos_token_id']}")
    fast.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    fast.save_pretrained(dest)
    return dest


def tensors_of(path: Path) -> dict:
    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            for k in st.keys():
                out[k] = st.get_tensor(k)
    return out


def assert_bit_identical(a: dict, b: dict, names=None):
    names = sorted(names if names is not None else a)
    for n in names:
        assert a[n].dtype == b[n].dtype and a[n].shape == b[n].shape, n
        assert a[n].view(-1).view(__import__("torch").uint8).equal(b[n].view(-1).view(__import__("torch").uint8)), n


def assert_hf_round_trip_is_bit_exact(cli, src: Path, tmp_path: Path) -> None:
    """src -> HF -> speculators -> HF: the second HF checkpoint equals the first, tensors and config."""
    hf, spec, back = tmp_path / "hf", tmp_path / "spec", tmp_path / "back"
    assert cli("convert", src, "-o", hf).code == 0
    assert cli("convert", hf, "-o", spec).code == 0
    assert cli("convert", spec, "-o", back).code == 0
    a, b = tensors_of(hf), tensors_of(back)
    assert set(a) == set(b)
    assert_bit_identical(a, b)
    assert read_config(hf) == read_config(back)


def copy_with_config(src: Path, dst: Path, edit) -> Path:
    """A copy of a checkpoint whose config.json `edit(config dict)` changed in place, as saved JSON."""
    shutil.copytree(src, dst)
    cfg = read_config(dst)
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def draft_config(target: dict, directory: Path, **changes) -> Path:
    """A z-lab DFlash draft config for `target` (its hidden size, vocabulary and layers): one decoder layer reading
    five of the target's layers, block 16."""
    layers = target["num_hidden_layers"]
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
              "dflash_config": {"mask_token_id": target["vocab_size"] - 1,
                                "target_layer_ids": [1 + i * (layers - 3) // 4 for i in range(5)]},
              "hidden_size": target["hidden_size"], "intermediate_size": 4 * target["hidden_size"],
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
              "vocab_size": target["vocab_size"], "num_hidden_layers": 1, "num_target_layers": layers,
              "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
              "rope_theta": 1000000, "tie_word_embeddings": False, **changes}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory / "config.json"
