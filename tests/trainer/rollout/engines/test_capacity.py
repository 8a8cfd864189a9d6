"""The pool's capacity in samples, against hand-computed values."""

from trainer.rollout.engines.capacity import capacity_line, samples_that_fit, slots_per_sample


def test_dense_and_compressed_slots():
    assert slots_per_sample(60, 4096) == 4156
    assert slots_per_sample(60, 4096, 512, 128) == 640  # B + N
    assert slots_per_sample(700, 4096, 512, 128) == 701  # a long prompt: P + 1
    assert slots_per_sample(60, 100, 512, 128) == 160  # never more than dense


def test_samples_that_fit():
    assert samples_that_fit(135168, 60, 4096) == 32  # 135168 // 4156
    assert samples_that_fit(135168, 60, 4096, 512, 128) == 211  # 135168 // 640


def test_line():
    assert capacity_line(135168, 60, 4096, "rkv", 512, 128) == (
        "holds 32 samples of 60 + 4096 tokens at once dense, 211 with rkv 512+128")
    assert capacity_line(1000, 10, 90, None, None, None) == "holds 10 samples of 10 + 90 tokens at once dense"


def test_kept_prompt_counts_whole():
    assert slots_per_sample(700, 4096, 512, 128, keep_prompt=True) == 1340  # P + B + N
    assert slots_per_sample(60, 100, 512, 128, keep_prompt=True) == 160  # never more than dense
    assert capacity_line(134000, 700, 4096, "rkv", 512, 128, keep_prompt=True) == (
        "holds 27 samples of 700 + 4096 tokens at once dense, 100 with rkv prompt+512+128")


def test_trainer_flag_reaches_the_engine():
    import argparse

    from trainer.rollout.engines.config import add_engine_args, engine_config_from_args

    p = argparse.ArgumentParser()
    add_engine_args(p)
    p.add_argument("--hf-checkpoint", default="m")
    for flag in ("--rollout-server-urls", "--rollout-engine-urls", "--offload-rollout",
                 "--rollout-engine-process", "--log-dir", "--save"):
        p.add_argument(flag, default=None)
    p.add_argument("--rollout-engine-placement", default="per-gpu")
    p.add_argument("--rollout-num-gpus", type=int, default=0)
    args = p.parse_args(["--sglang-compress-algorithm", "rkv", "--sglang-compress-keep-prompt"])
    server = engine_config_from_args(args).server_args()
    assert server.compress_keep_prompt and not server.compress_prompt


def test_a_sharing_group_counts_one_prompt_and_n_responses():
    """Prefix sharing: a group of 8 holds its 700-token prompt once (hand-computed: dense
    700 + 8 * 4096 = 33468 slots a group, 4 groups in 134000; R-KV with the prompt kept
    700 + 8 * 640 = 5820, 23 groups)."""
    assert capacity_line(134000, 700, 4096, "rkv", 512, 128, keep_prompt=True, n=8,
                         shared=True) == ("holds 32 samples of 700 + 4096 tokens at once dense, "
                                          "184 with rkv prompt+512+128 (groups of 8 share a prompt)")
    assert capacity_line(134000, 700, 4096, "rkv", 512, 128, keep_prompt=True, n=8) == (
        "holds 27 samples of 700 + 4096 tokens at once dense, 100 with rkv prompt+512+128")
