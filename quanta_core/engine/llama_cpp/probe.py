"""What the engine's layout is fitted to: the model's shape from its GGUF metadata, and
whether this llama.cpp build can offload layers to a GPU.

The model is loaded vocabulary-only (no weights). Such a model's hyperparameters are not
loaded (``llama_model_n_layer`` reads 0), so the shape comes from the metadata strings.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import llama_cpp

from quanta_core.engine.errors import EngineStartError
from quanta_core.engine.fit import ModelShape
from quanta_core.engine.llama_cpp.logs import quiet_llama_logs

KV_ELEMENT_BYTES = 2  # llama.cpp's default KV cache type, f16


def gpu_offload() -> bool:
    """The build has a GPU backend (CUDA, Metal, Vulkan…) that takes model layers."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def model_shape(path: str) -> ModelShape:
    quiet_llama_logs()
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise EngineStartError(f"cannot read the model {path}")
    try:
        buf = ctypes.create_string_buffer(4096)

        def meta(key: str) -> str | None:
            n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
            return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

        arch = meta("general.architecture") or "llama"

        def number(key: str, default: int | None = None) -> int:
            # A per-layer value (an array in the metadata) counts at its largest.
            found = [int(x) for x in re.findall(r"\d+", meta(f"{arch}.{key}") or "")]
            if found:
                return max(found)
            if default is None:
                raise EngineStartError(f"{path}: no {arch}.{key} in the model's metadata")
            return default

        n_layer = number("block_count")
        n_embd = number("embedding_length")
        n_head = number("attention.head_count")
        n_head_kv = number("attention.head_count_kv", n_head)
        head_k = number("attention.key_length", n_embd // max(n_head, 1))
        head_v = number("attention.value_length", head_k)
        vocab = llama_cpp.llama_model_get_vocab(model)
        return ModelShape(
            name=Path(path).name,
            n_ctx_train=number("context_length"),
            n_layer=n_layer,
            kv_bytes_per_token=n_layer * n_head_kv * (head_k + head_v) * KV_ELEMENT_BYTES,
            weight_bytes=Path(path).stat().st_size,
            n_vocab=llama_cpp.llama_vocab_n_tokens(vocab),
            n_embd=n_embd,
        )
    finally:
        llama_cpp.llama_model_free(model)
