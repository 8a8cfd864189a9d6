"""Layout rules checked against hand-written loops over the documented Megatron order."""

import pytest
import torch

from checkpoint_tools.mapping import merge_qkv, pad_vocab, split_qkv
from checkpoint_tools.model_config import ModelArch


def _arch(heads=8, groups=2, head_dim=4, hidden=16, vocab=100):
    return ModelArch(model_type="qwen2", num_layers=1, hidden_size=hidden, ffn_hidden_size=32,
                     num_attention_heads=heads, num_query_groups=groups, head_dim=head_dim,
                     vocab_size=vocab, tie_word_embeddings=True, qkv_bias=True,
                     qk_layernorm=False, norm_epsilon=1e-6, rope_theta=1e6,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                     max_position_embeddings=128, dtype=torch.float32)


@pytest.mark.parametrize("heads,groups", [(8, 2), (4, 4), (6, 1), (8, 8)])
def test_qkv_rows_run_group_by_group(heads, groups):
    arch = _arch(heads=heads, groups=groups)
    d, hpg = arch.head_dim, heads // groups
    q = torch.randn(heads * d, arch.hidden_size)
    k = torch.randn(groups * d, arch.hidden_size)
    v = torch.randn(groups * d, arch.hidden_size)
    # Reference: for each group g, its hpg query heads, then k_g, then v_g.
    rows = []
    for g in range(groups):
        rows += [q[(g * hpg + h) * d:(g * hpg + h + 1) * d] for h in range(hpg)]
        rows += [k[g * d:(g + 1) * d], v[g * d:(g + 1) * d]]
    expected = torch.cat(rows)
    merged = merge_qkv(q, k, v, arch)
    assert torch.equal(merged, expected)
    q2, k2, v2 = split_qkv(merged, arch)
    assert torch.equal(q2, q) and torch.equal(k2, k) and torch.equal(v2, v)


def test_qkv_bias_uses_the_same_interleave():
    arch = _arch(heads=4, groups=2, head_dim=2)
    q, k, v = torch.arange(8.0), 100 + torch.arange(4.0), 200 + torch.arange(4.0)
    merged = merge_qkv(q, k, v, arch)
    assert merged.tolist() == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    assert [t.tolist() for t in split_qkv(merged, arch)] == [q.tolist(), k.tolist(), v.tolist()]


@pytest.mark.parametrize("vocab,tp,expected", [
    (151936, 1, 151936),  # Qwen2.5: already a multiple of 128
    (151936, 2, 152064),  # multiple of 256 at TP=2 (Megatron pads; exporters must trim)
    (128256, 1, 128256),  # Llama-3
    (100, 1, 128), (129, 4, 512),
])
def test_megatron_vocab_padding_rule(vocab, tp, expected):
    assert _arch(vocab=vocab).padded_vocab_size(tp) == expected


def test_pad_vocab_appends_zero_rows_and_refuses_to_shrink():
    w = torch.randn(5, 3)
    padded = pad_vocab(w, 8)
    assert padded.shape == (8, 3) and torch.equal(padded[:5], w) and not padded[5:].any()
    with pytest.raises(ValueError):
        pad_vocab(w, 4)
