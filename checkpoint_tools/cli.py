"""The converters' command lines, without torch: each converter parses its flags here, once
before it imports torch and Megatron when run as a command (``--help`` and a flag error then take
a fraction of a second, not the seconds those imports take) and again in its ``main``.
"""

from __future__ import annotations

import argparse


class ConverterParser(argparse.ArgumentParser):
    """The converters' command line: errors in one line (not the usage block), and no flag is
    expanded from an abbreviation (`--hf-check` must not silently mean `--hf-checkpoint`)."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def hf2megatron_args(argv=None) -> argparse.Namespace:
    p = ConverterParser(
        prog="hf2megatron",
        description="Convert a Hugging Face checkpoint to Megatron torch_dist.")
    p.add_argument("--hf-checkpoint", required=True, help="HF model directory (config.json + safetensors)")
    p.add_argument("--save", required=True, help="output root; gets latest_checkpointed_iteration.txt")
    p.add_argument("--tensor-model-parallel-size", "--tp", type=int, default=1, dest="tp",
                   help="TP size the vocab padding is computed for (loads at any TP regardless)")
    p.add_argument("--pipeline-model-parallel-size", "--pp", type=int, default=1, dest="pp",
                   help="recorded in common.pt args; the checkpoint loads at any PP")
    p.add_argument("--iteration", default="release",
                   help="'release' (default, as slime writes) or an iteration number")
    p.add_argument("--padded-vocab-size", type=int, default=None,
                   help="explicit padded vocab size (default: Megatron's rule)")
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="parameter dtype of the checkpoint (auto = the HF checkpoint's)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing iteration dir")
    args = p.parse_args(argv)
    if args.iteration != "release" and not args.iteration.isdigit():
        p.error(f"--iteration must be 'release' or a non-negative integer, got {args.iteration!r}")
    if args.tp < 1 or args.pp < 1:
        p.error("--tensor-model-parallel-size and --pipeline-model-parallel-size must be >= 1")
    return args


def megatron2hf_args(argv=None) -> argparse.Namespace:
    p = ConverterParser(
        prog="megatron2hf",
        description="Convert a Megatron torch_dist checkpoint to Hugging Face.")
    p.add_argument("--load", "--input-dir", dest="load", required=True,
                   help="checkpoint root (with latest_checkpointed_iteration.txt) or an "
                        "iter_XXXXXXX/release directory")
    p.add_argument("--output-dir", required=True, help="HF output directory")
    p.add_argument("--origin-hf-dir", "--hf-checkpoint", dest="origin_hf_dir", default=None,
                   help="original HF model: config.json and tokenizer files are taken from it "
                        "(optional when the checkpoint was written by hf2megatron)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="rows of the exported embedding (trims Megatron's vocab padding; default: "
                        "the config's vocab_size)")
    p.add_argument("--chunk-size", type=float, default=5.0,
                   help="maximum safetensors shard size in GiB (default 5)")
    p.add_argument("-f", "--force", action="store_true", help="overwrite existing safetensors files")
    args = p.parse_args(argv)
    if args.vocab_size is not None and args.vocab_size < 1:
        p.error("--vocab-size must be positive")
    if args.chunk_size <= 0:
        p.error("--chunk-size must be positive")
    return args


def gguf2hf_args(argv=None, description: str | None = None) -> argparse.Namespace:
    p = ConverterParser(prog="gguf2hf", description=description)
    p.add_argument("--gguf", required=True, help="the .gguf file")
    p.add_argument("--output-dir", required=True, help="HF checkpoint directory to write")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    return p.parse_args(argv)


def verify_args(argv=None, description: str | None = None) -> argparse.Namespace:
    p = ConverterParser(prog="verify", description=description)
    p.add_argument("--hf-checkpoint", required=True, help="HF model directory (the reference)")
    p.add_argument("--load", required=True, help="torch_dist checkpoint root or iteration dir")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size to load at")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size to load at")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max abs logit difference allowed")
    return p.parse_args(argv)
