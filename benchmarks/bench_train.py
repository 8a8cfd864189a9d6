"""Training throughput and MFU of the Megatron policy (one GPU, TP=1) on the Qwen2.5-0.5B shape.

    python benchmarks/bench_train.py [--seq-len 4096] [--seqs-per-step 16] [--attention sdpa]

Random weights (no hub); each step is a full ``PolicyTrainer.train_step`` (packed micro-batches
of ``--max-tokens-per-gpu`` tokens, chunked vocab-parallel log-probs, backward, Adam) with a
token-mean NLL loss over the response tokens. MFU counts the matmul FLOPs of the model (6 x
params x tokens, lm head included) plus causal attention (6 x layers x S x heads x head_dim per
token), against the GPU's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

QWEN25_05B = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=896,
                  intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                  rope_theta=1e6, tie_word_embeddings=True, rms_norm_eps=1e-6, dtype="bfloat16")
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def flops_per_token(arch, seq_len: int) -> float:
    d, f, hd = arch.hidden_size, arch.ffn_hidden_size, arch.head_dim
    nh, ng, L, V = arch.num_attention_heads, arch.num_query_groups, arch.num_layers, arch.vocab_size
    per_layer = d * (nh + 2 * ng) * hd + nh * hd * d + 2 * d * f + f * d
    matmul_params = L * per_layer + V * d
    return 6 * matmul_params + 6 * L * seq_len * nh * hd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--seqs-per-step", type=int, default=16, help="global batch (sequences)")
    p.add_argument("--max-tokens-per-gpu", type=int, default=16384)
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "local", "te", "auto"])
    p.add_argument("--log-probs-chunk-size", type=int, default=1024,
                   help="tokens per chunk of the fp32 log-prob pass")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", default=None, help="write the result here too")
    p.add_argument("--profile", action="store_true", help="print the top CUDA kernels of a step")
    args = p.parse_args()

    from checkpoint_tools import cpu_megatron
    from trainer.learner.model_provider import ModelConfig
    from trainer.learner.packing import Sample
    from trainer.learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig

    cfg_dir = Path(tempfile.mkdtemp(prefix="bench-train-"))
    (cfg_dir / "config.json").write_text(json.dumps(QWEN25_05B))
    cpu_megatron.init_distributed(0, 1)
    cpu_megatron.init_model_parallel(1, 1)
    trainer = PolicyTrainer(ModelConfig(hf_checkpoint=str(cfg_dir), attention_backend=args.attention),
                            OptimConfig(lr=1e-6),
                            TrainConfig(max_tokens_per_gpu=args.max_tokens_per_gpu,
                                        log_probs_chunk_size=args.log_probs_chunk_size),
                            load_weights=False)
    arch = trainer.arch
    g = torch.Generator().manual_seed(0)
    samples = [Sample(torch.randint(0, arch.vocab_size, (args.prompt_len,), generator=g).tolist(),
                      torch.randint(0, arch.vocab_size, (args.seq_len - args.prompt_len,),
                                    generator=g).tolist()) for _ in range(args.seqs_per_step)]
    n_resp = sum(len(s.response_ids) for s in samples)

    def loss_fn(logp, ent, ids):
        loss = sum(-lp.sum() for lp in logp) / n_resp
        return loss, {"loss": loss.detach()}

    for _ in range(args.warmup):
        trainer.train_step(samples, loss_fn)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        m = trainer.train_step(samples, loss_fn)
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - start) / args.steps
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            trainer.train_step(samples, loss_fn)
            torch.cuda.synchronize()
        events = prof.key_averages()
        print(events.table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=90))
        busy = sum(e.self_device_time_total for e in events) / 1e3
        print(f"GPU kernel time {busy:.0f} ms in a {elapsed * 1e3:.0f} ms step "
              f"({busy / (elapsed * 1e3):.0%} busy)")
    tokens = args.seq_len * args.seqs_per_step
    tok_s = tokens / elapsed
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16.items() if k in name), 989e12)
    mfu = tok_s * flops_per_token(arch, args.seq_len) / peak
    result = dict(gpu=name, seq_len=args.seq_len, seqs_per_step=args.seqs_per_step,
                  max_tokens_per_gpu=args.max_tokens_per_gpu, attention=args.attention,
                  step_s=round(elapsed, 3), tokens_per_s=round(tok_s), mfu=round(mfu, 4),
                  peak_mem_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1),
                  loss=float(m["loss"]))
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    cpu_megatron.teardown()


if __name__ == "__main__":
    main()
