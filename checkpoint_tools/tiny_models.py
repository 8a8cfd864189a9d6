"""Tiny random Hugging Face checkpoints for tests, benchmarks and the quickstart.

Each family mirrors the structural features of the real models it stands for (QKV bias and tied
embeddings for Qwen2.5 <= 3B, q/k norm and an explicit head_dim for Qwen3, llama3 rope scaling
and no biases for Llama-3.x), so the code paths exercised are the ones a user's Qwen or Llama
checkpoint goes through. Every checkpoint carries a byte-level BPE tokenizer trained on the spot,
a ChatML chat template and a ``generation_config.json``.

    python -m checkpoint_tools.tiny_models --family qwen2.5 --out /tmp/tiny-qwen
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with make_tiny_model: --help comes before
    import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Text the tokenizer is trained on: enough arithmetic, words and markup that prompts in tests
# tokenize into a realistic mix of multi-byte merges and single bytes.
_CORPUS = [
    "Let's think step by step and output the final answer within \\boxed{}.",
    "The answer is \\boxed{42}. So the total is 3 + 4 = 7 and 12 * 12 = 144.",
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many "
    "clips in May. How many clips did Natalia sell altogether in April and May?",
    "Using the numbers [3, 7, 25, 50], create an equation that equals 100. <think> </think>",
    "system user assistant You are a helpful assistant. Solve the following math problem.",
    "def f(x): return x ** 2 - 2 * x + 1  # polynomial, fraction \\frac{1}{2}, sqrt \\sqrt{3}",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 1000 3.14 -5 1/3 50%",
    "The quick brown fox jumps over the lazy dog. Therefore, hence, thus, we conclude.",
]


@dataclasses.dataclass(frozen=True)
class TinyFamily:
    """How to build one tiny family: its HF config class name and the config values."""

    name: str
    config_class: str
    config: dict


_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
)

FAMILIES: dict[str, TinyFamily] = {
    # Qwen2.5 0.5B-3B: qkv bias, tied embeddings, rope theta 1e6.
    "qwen2.5": TinyFamily(
        "qwen2.5", "Qwen2Config", dict(_COMMON, tie_word_embeddings=True, rope_theta=1e6)
    ),
    # Qwen2.5 7B and up: untied lm_head; 3 layers and MHA-ish groups to vary shapes.
    "qwen2-untied": TinyFamily(
        "qwen2-untied",
        "Qwen2Config",
        dict(_COMMON, num_hidden_layers=3, num_key_value_heads=4, tie_word_embeddings=False,
             rope_theta=1e6),
    ),
    # Qwen3: q/k RMSNorm per head, head_dim not equal to hidden/heads, no qkv bias.
    "qwen3": TinyFamily(
        "qwen3", "Qwen3Config",
        dict(_COMMON, head_dim=32, tie_word_embeddings=True, rope_theta=1e6, attention_bias=False),
    ),
    # Llama 3.2: llama3 rope scaling, no biases, untied (as Llama-3.1-8B; 3.2-1B ties).
    "llama3": TinyFamily(
        "llama3", "LlamaConfig",
        dict(_COMMON, num_key_value_heads=1, tie_word_embeddings=False, rope_theta=500000.0,
             rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                               high_freq_factor=4.0, original_max_position_embeddings=64),
             attention_bias=False, mlp_bias=False),
    ),
}


def train_tokenizer(vocab_size: int = 384):
    """A byte-level BPE tokenizer with Qwen-style special tokens, as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def _padded_vocab(n: int, multiple: int = 64) -> int:
    # Real Qwen checkpoints carry a vocab larger than the tokenizer (151936 vs 151665); do the same
    # so vocab padding and trimming are exercised.
    return (n + multiple) // multiple * multiple


def make_tiny_model(
    family: str,
    out_dir: str | Path,
    *,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    overrides: dict | None = None,
    max_shard_size: str | None = None,
) -> Path:
    """Build a random model of ``family`` and save model, tokenizer and generation config.

    ``overrides`` replaces config values (e.g. a larger hidden size for benchmarks); ``dtype``
    None is float32. Returns ``out_dir``.
    """
    import torch
    import transformers

    from .hf_io import fix_safetensors_modes

    if family not in FAMILIES:
        raise ValueError(f"unknown tiny family {family!r}; choose from {sorted(FAMILIES)}")
    spec = FAMILIES[family]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    values = dict(spec.config, vocab_size=_padded_vocab(len(tokenizer)),
                  bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)
    values.update(overrides or {})
    config = getattr(transformers, spec.config_class)(**values)
    dtype = dtype or torch.float32
    config.dtype = dtype

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id,
        do_sample=True, temperature=0.7, top_p=0.8, top_k=20,
    )
    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **save_kwargs)
    fix_safetensors_modes(out)  # save_pretrained leaves them 0600
    tokenizer.save_pretrained(out)
    return out


# Real models' sizes with these random weights, for benchmarks and GPU runs (no hub needed).
SHAPES = {
    "tiny": {},
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6),
    "qwen2.5-3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                       max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m checkpoint_tools.tiny_models",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen2.5",
                        help="which architecture family to mimic")
    parser.add_argument("--out", required=True, help="output directory (HF format)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny",
                        help="layer sizes: tiny, or a real model's (random weights, tiny tokenizer)")
    args = parser.parse_args(argv)
    import torch

    path = make_tiny_model(args.family, args.out, dtype=getattr(torch, args.dtype), seed=args.seed,
                           overrides=SHAPES[args.shape])
    print(f"wrote {args.shape} {args.family} checkpoint to {path}")


if __name__ == "__main__":
    main()
