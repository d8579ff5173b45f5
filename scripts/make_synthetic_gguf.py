#!/usr/bin/env python
"""Write a GGUF of a Llama model's shape with random Q4_0 weights and a synthetic tokenizer.

    python scripts/make_synthetic_gguf.py OUT.gguf [--shape SHAPE] [--gguf-py DIR]

It measures speed, not text: every step costs what a real model of that shape costs (the same
tensors, types and vocabulary size), but the answers are noise. ``llama3-8b`` is Llama-3-8B's
shape (32 layers, 4096 wide, GQA 32/8, FFN 14336, 128,256 tokens), about 4.6 GB; ``tiny``
loads in a second for checking the pipeline on a CPU; ``tiny-128k`` is tiny with Llama-3's
vocabulary (what scales with the vocabulary, profiled on a CPU). The tokenizer is
SentencePiece-style (``llama``): <unk>, <s>, </s>, 256 byte tokens, then pieces ``▁t<N>``. The
end-of-sequence row of the output matrix is zero, so greedy decoding never ends an answer on
its own.

Needs numpy and the ``gguf`` package (pip's, or llama.cpp's own gguf-py: --gguf-py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SHAPES: dict[str, dict[str, Any]] = {
    "llama3-8b": {
        "n_embd": 4096, "n_layer": 32, "n_head": 32, "n_head_kv": 8, "n_ff": 14336,
        "n_vocab": 128256, "n_ctx_train": 8192, "rope_base": 500000.0,
    },
    "tiny": {
        "n_embd": 256, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 512,
        "n_vocab": 49152, "n_ctx_train": 4096, "rope_base": 10000.0,
    },
    # tiny's layers with Llama-3's vocabulary: the per-sequence costs that scale with the
    # vocabulary (logits, sampling) at a step cost a CPU can profile
    "tiny-128k": {
        "n_embd": 256, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 512,
        "n_vocab": 128256, "n_ctx_train": 4096, "rope_base": 10000.0,
    },
}  # fmt: skip
QK = 32  # Q4_0: 32 weights a block, an f16 scale then 16 bytes of 4-bit values
BLOCK_BYTES = 18
EOS = 2


class BlockPool:
    """Random Q4_0 blocks, drawn once and reused: writing 4 GB must not draw 4 GB of noise."""

    def __init__(self, rng: np.random.Generator, n_blocks: int = 1 << 22) -> None:
        blocks = rng.integers(0, 256, size=(n_blocks, BLOCK_BYTES), dtype=np.uint8)
        # Scales ~0.002: values (q - 8) * d have std ~0.01, so activations stay finite
        # through every layer (4096-wide rows, RMS-normalised inputs).
        scales = rng.uniform(0.001, 0.003, size=n_blocks).astype(np.float16)
        blocks[:, :2] = scales.view(np.uint8).reshape(n_blocks, 2)
        self.flat = blocks.reshape(-1)
        self.offset = 0

    def take(self, n_bytes: int) -> np.ndarray:
        out = np.empty(n_bytes, dtype=np.uint8)
        done = 0
        while done < n_bytes:  # start at a block boundary of the pool each time
            start = self.offset % self.flat.size
            n = min(n_bytes - done, self.flat.size - start)
            out[done : done + n] = self.flat[start : start + n]
            done += n
            self.offset = start + n + 7 * BLOCK_BYTES
        return out


def tensors(s: dict[str, Any]) -> list[tuple[str, tuple[int, int] | tuple[int], str]]:
    """(name, numpy shape (rows, cols), "q4_0" | "f32"), in llama.cpp's names."""
    e, ff, v = s["n_embd"], s["n_ff"], s["n_vocab"]
    kv = e // s["n_head"] * s["n_head_kv"]
    out: list[tuple[str, Any, str]] = [("token_embd.weight", (v, e), "q4_0")]
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (e,), "f32"),
            (b + "attn_q.weight", (e, e), "q4_0"),
            (b + "attn_k.weight", (kv, e), "q4_0"),
            (b + "attn_v.weight", (kv, e), "q4_0"),
            (b + "attn_output.weight", (e, e), "q4_0"),
            (b + "ffn_norm.weight", (e,), "f32"),
            (b + "ffn_gate.weight", (ff, e), "q4_0"),
            (b + "ffn_up.weight", (ff, e), "q4_0"),
            (b + "ffn_down.weight", (e, ff), "q4_0"),
        ]
    out += [("output_norm.weight", (e,), "f32"), ("output.weight", (v, e), "q4_0")]
    return out


def vocabulary(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    normal, unknown, control, byte = 1, 2, 3, 6  # gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [unknown, control, control] + [byte] * 256
    first = len(tokens)
    tokens += [f"▁t{i}" for i in range(n_vocab - first)]
    types += [normal] * (n_vocab - first)
    scores = [0.0] * first + [-float(i) for i in range(n_vocab - first)]
    return tokens, scores, types


def write(path: Path, shape: str, seed: int = 0) -> None:
    import gguf  # type: ignore[import-not-found]  # llama.cpp's gguf-py, or pip's

    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"synthetic-{shape}")
    w.add_context_length(s["n_ctx_train"])
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_dimension_count(s["n_embd"] // s["n_head"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(s["n_vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    tokens, scores, types = vocabulary(s["n_vocab"])
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(EOS)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    plan = tensors(s)
    for name, dims, kind in plan:
        if kind == "f32":
            w.add_tensor_info(name, dims, np.dtype(np.float32), dims[0] * 4)
        else:
            rows, cols = dims  # type: ignore[misc]
            byte_shape = (rows, cols // QK * BLOCK_BYTES)
            w.add_tensor_info(
                name, byte_shape, np.dtype(np.uint8), rows * byte_shape[1],
                raw_dtype=gguf.GGMLQuantizationType.Q4_0,
            )  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool = BlockPool(rng, n_blocks=1 << 14 if shape.startswith("tiny") else 1 << 22)
    for name, dims, kind in plan:
        if kind == "f32":
            w.write_tensor_data(np.ones(dims, dtype=np.float32))
            continue
        rows, cols = dims  # type: ignore[misc]
        data = pool.take(rows * cols // QK * BLOCK_BYTES).reshape(rows, -1)
        if name == "output.weight":  # the EOS logit is always 0: never the greedy choice
            blocks = data[EOS].reshape(-1, BLOCK_BYTES)
            blocks[:, :2] = 0
        w.write_tensor_data(data)
    w.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--gguf-py", type=Path, help="llama.cpp's gguf-py folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.gguf_py is not None:
        sys.path.insert(0, str(args.gguf_py))
    started = time.perf_counter()
    write(args.out, args.shape, args.seed)
    size = args.out.stat().st_size / 1e9
    print(f"{args.out}: {size:.2f} GB in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
