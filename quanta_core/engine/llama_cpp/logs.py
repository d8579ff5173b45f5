"""llama.cpp logs every model load in detail; Quanta passes on its errors only."""

from __future__ import annotations

import ctypes
import sys

import llama_cpp

GGML_LOG_LEVEL_ERROR = 4  # ggml.h: NONE, DEBUG, INFO, WARN, ERROR, CONT


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
def _errors_only(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level == GGML_LOG_LEVEL_ERROR:
        sys.stderr.write(text.decode("utf-8", errors="replace"))


def quiet_llama_logs() -> None:
    llama_cpp.llama_log_set(_errors_only, ctypes.c_void_p(0))
