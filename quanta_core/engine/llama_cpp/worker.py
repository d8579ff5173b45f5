"""The engine worker: a child process that owns the llama.cpp context and applies no policy.

    python -m quanta_core.engine.llama_cpp.worker SOCKET_PATH

It connects to the caller's Unix socket, waits for a ``StartCall``, loads the model, then
answers one call at a time: every ``StepCall`` is KV operations, then exactly one
``llama_decode`` of a batch that may mix prefill chunks and decode tokens of many sequences,
then one sample per sequence that asked for logits.
"""

from __future__ import annotations

import ctypes
import itertools
import socket
import sys
import time
from collections.abc import Callable

import llama_cpp
import numpy as np

from quanta_core.engine.config import EngineConfig
from quanta_core.engine.llama_cpp.logs import quiet_llama_logs
from quanta_core.engine.llama_cpp.sampling import Sampler, SamplerSet, SamplingError, greedy_rows
from quanta_core.engine.llama_cpp.wire import (
    Call,
    Channel,
    ErrorReply,
    MemoryCall,
    MemoryReply,
    ShutdownCall,
    StartCall,
    StartReply,
    StepCall,
    StepReply,
)
from quanta_core.engine.types import (
    CopyPrefix,
    DropStash,
    EngineInfo,
    KvOp,
    Restore,
    SeqMemory,
    SeqOutput,
    SeqSlice,
    Stash,
    StepPlan,
    StepResult,
    StepTimings,
    TopLogprob,
    Truncate,
)

FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


class InputError(Exception):
    """A call the worker refuses before changing anything."""


class Engine:
    """One model, one context with ``n_seq_max`` sequences over a unified KV buffer."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = config.n_gpu_layers
        self.model = llama_cpp.llama_model_load_from_file(config.model_path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"cannot load model {config.model_path}")
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = config.n_ctx
        cparams.n_batch = config.n_batch
        cparams.n_ubatch = min(config.n_ubatch, config.n_batch)
        cparams.n_seq_max = config.n_seq_max
        cparams.n_threads = config.threads
        cparams.n_threads_batch = config.threads
        cparams.kv_unified = config.kv_unified
        cparams.flash_attn_type = FLASH_ATTN[config.flash_attn]
        cparams.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("cannot create the llama.cpp context (out of memory?)")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)
        self.n_batch = llama_cpp.llama_n_batch(self.ctx)
        self.eog = tuple(
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)
        )
        self.samplers = SamplerSet(self.vocab, self.n_vocab, self.eog)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._tokens = np.ctypeslib.as_array(self.batch.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(self.batch.pos, shape=(self.n_batch,))
        self._n_seq_id = np.ctypeslib.as_array(self.batch.n_seq_id, shape=(self.n_batch,))
        self._logits = np.ctypeslib.as_array(self.batch.logits, shape=(self.n_batch,))
        self._n_seq_id[:] = 1
        # Every token's sequence id in one array: the batch's per-token pointers are aimed
        # into it once, so a step writes all ids at once (the batch is never freed, so
        # llama_batch_free never sees these pointers).
        self._seq = np.zeros(self.n_batch, dtype=np.int32)
        base = self._seq.ctypes.data
        for i in range(self.n_batch):
            self.batch.seq_id[i] = ctypes.cast(base + 4 * i, ctypes.POINTER(llama_cpp.llama_seq_id))
        self.kv_bytes_per_token = self._measure_state_bytes_per_token()

    def info(self) -> EngineInfo:
        name = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.model, name, len(name))
        return EngineInfo(
            n_ctx=self.n_ctx,
            n_seq_max=self.config.n_seq_max,
            n_batch=self.n_batch,
            n_vocab=self.n_vocab,
            eog_tokens=self.eog,
            kv_bytes_per_token=self.kv_bytes_per_token,
            kv_unified=self.config.kv_unified,
            model_name=name.value.decode("utf-8", errors="replace"),
        )

    # ---- one step ----

    def step(self, call: StepCall, heads_up: Callable[[], None] | None = None) -> StepReply:
        """Apply one call. ``heads_up`` is called once the batch is decoded, before the last
        sequence is sampled (the caller wakes while we sample it, whatever the batch); its time
        is not counted as the engine's."""
        t0 = time.perf_counter()
        plan = call.plan
        self._check(plan, call.blobs)
        samplers = [  # build new samplers first: a bad grammar must refuse the step unchanged
            self.samplers.get(s.owner, s.sampling, s.replay) if s.sample else None
            for s in plan.slices
        ]
        blobs = {}
        for op in plan.kv_ops:
            blob = self._apply(op, call.blobs)
            if blob is not None:
                blobs[op.key] = blob  # type: ignore[union-attr]
        for owner in plan.release:
            self.samplers.release(owner)
        t1 = time.perf_counter()
        outputs: list[SeqOutput] = []
        decode_error = None
        t2 = t1
        notify_s = 0.0

        def notify() -> None:
            nonlocal notify_s
            started = time.perf_counter()
            if heads_up is not None:
                heads_up()
            notify_s = time.perf_counter() - started

        if plan.slices:
            rc = self._decode(plan.slices)
            t2 = time.perf_counter()
            if rc != 0:
                decode_error = f"llama_decode failed with code {rc} (KV cache full?)"
            else:
                outputs = self._sample(plan.slices, samplers, notify)
        t3 = time.perf_counter()
        timings = StepTimings(
            kv_ops_s=t1 - t0,
            decode_s=t2 - t1,
            sample_s=t3 - t2 - notify_s,
            engine_s=t3 - t0 - notify_s,
        )
        result = StepResult(outputs=tuple(outputs), timings=timings)
        return StepReply(result=result, blobs=blobs, decode_error=decode_error)

    def _check(self, plan: StepPlan, blobs: dict[str, bytes]) -> None:
        """Cheap defence against what would corrupt memory; the caller checks positions."""
        n_seq = self.config.n_seq_max
        if plan.num_tokens > self.n_batch:
            raise InputError(f"batch of {plan.num_tokens} tokens is over n_batch={self.n_batch}")
        for s in plan.slices:
            if not 0 <= s.seq < n_seq:
                raise InputError(f"unknown sequence {s.seq}")
            if s.start_pos + len(s.tokens) > self.n_ctx:
                raise InputError(f"sequence {s.seq} overflows the context of {self.n_ctx}")
            if s.tokens and not 0 <= min(s.tokens) <= max(s.tokens) < self.n_vocab:
                raise InputError(f"sequence {s.seq}: token id out of range")
        for op in plan.kv_ops:
            seqs = [op.src, op.dst] if isinstance(op, CopyPrefix) else [getattr(op, "seq", 0)]
            if any(not 0 <= q < n_seq for q in seqs):
                raise InputError(f"unknown sequence in {op}")
            if isinstance(op, Restore) and op.key not in blobs:
                raise InputError(f"restore of {op.key!r} without its bytes")

    def _apply(self, op: KvOp, blobs: dict[str, bytes]) -> bytes | None:
        match op:
            case CopyPrefix(src=src, dst=dst, n_tokens=n):
                llama_cpp.llama_memory_seq_cp(self.memory, src, dst, 0, n)
            case Truncate(seq=seq, start=start):
                llama_cpp.llama_memory_seq_rm(self.memory, seq, start, -1)
            case Stash(seq=seq):
                size = llama_cpp.llama_state_seq_get_size(self.ctx, seq)
                buf = (ctypes.c_uint8 * size)()
                written = llama_cpp.llama_state_seq_get_data(self.ctx, buf, size, seq)
                llama_cpp.llama_memory_seq_rm(self.memory, seq, 0, -1)
                return bytes(memoryview(buf)[:written])
            case Restore(seq=seq, key=key):
                data = blobs[key]
                raw = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
                if llama_cpp.llama_state_seq_set_data(self.ctx, raw, len(data), seq) == 0:
                    # The bytes came from this model and the caller checked the target is
                    # empty: a failure here is a broken engine, so the worker exits (the
                    # caller sees EngineDied and the stash is still on its side).
                    raise RuntimeError(f"restore of {key!r} into sequence {seq} failed")
            case DropStash():
                pass  # the bytes live on the caller's side
        return None

    def _decode(self, slices: tuple[SeqSlice, ...]) -> int:
        """Fill the batch from ``slices`` with whole-array writes (a step of 256 sequences is
        256 slices: per-slice numpy calls would cost milliseconds of every step), then decode."""
        lengths = np.fromiter((len(s.tokens) for s in slices), np.int64, len(slices))
        ends = np.cumsum(lengths)
        n = int(ends[-1]) if len(slices) else 0
        if n == len(slices):  # decode steps: one token per sequence
            self._tokens[:n] = [s.tokens[0] for s in slices]
            self._pos[:n] = [s.start_pos for s in slices]
            self._seq[:n] = [s.seq for s in slices]
        else:
            self._tokens[:n] = list(itertools.chain.from_iterable(s.tokens for s in slices))
            starts = np.fromiter((s.start_pos for s in slices), np.int64, len(slices))
            # position of token j of slice k: starts[k] + j, with j = its index - the slice's
            # first index
            self._pos[:n] = np.arange(n) + np.repeat(starts - (ends - lengths), lengths)
            self._seq[:n] = np.repeat([s.seq for s in slices], lengths)
        self._logits[:n] = 0
        sampled = np.fromiter((s.sample for s in slices), np.bool_, len(slices))
        self._logits[ends[sampled & (lengths > 0)] - 1] = 1
        self.batch.n_tokens = n
        return int(llama_cpp.llama_decode(self.ctx, self.batch))

    def _sample(
        self,
        slices: tuple[SeqSlice, ...],
        samplers: list[Sampler | None],
        before_last: Callable[[], None],
    ) -> list[SeqOutput]:
        outputs = []
        last = max((k for k, sampler in enumerate(samplers) if sampler is not None), default=-1)
        greedy = self._greedy_tokens(slices, samplers)
        i = 0
        for k, (s, sampler) in enumerate(zip(slices, samplers, strict=True)):
            i += len(s.tokens)
            if sampler is None:
                continue
            if k == last:
                before_last()
            token = greedy.get(k)
            if token is not None:
                outputs.append(SeqOutput(s.seq, token))
                continue
            idx = i - 1
            logprobs = (
                self._logprobs(idx, s.sampling.logprobs)
                if s.sampling.logprobs is not None
                else None
            )
            token = sampler.sample(self.ctx, idx)
            if logprobs is None:
                outputs.append(SeqOutput(s.seq, token))
            else:
                log_softmax, top = logprobs
                outputs.append(SeqOutput(s.seq, token, float(log_softmax[token]), top))
        return outputs

    def _greedy_tokens(
        self, slices: tuple[SeqSlice, ...], samplers: list[Sampler | None]
    ) -> dict[int, int]:
        """Slice index -> token for the plain greedy samplers, all from one argmax over the
        step's logits (outputs are in batch order: one row per sampled slice). A row whose
        argmax is a token its chain biases is left to its chain."""
        rows: list[int] = []
        picks: list[int] = []
        n_out = 0
        for k, (s, sampler) in enumerate(zip(slices, samplers, strict=True)):
            if sampler is None:
                continue
            if sampler.plain_greedy is not None and s.sampling.logprobs is None:
                rows.append(n_out)
                picks.append(k)
            n_out += 1
        if not rows:
            return {}
        ptr = llama_cpp.llama_get_logits(self.ctx)
        logits = np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))
        tokens = greedy_rows(logits if len(rows) == n_out else logits[rows]).tolist()
        chosen = {}
        for k, token in zip(picks, tokens, strict=True):
            biased = samplers[k].plain_greedy  # type: ignore[union-attr]
            if token not in biased:  # type: ignore[operator]
                chosen[k] = int(token)
        return chosen

    def _logprobs(self, idx: int, k: int) -> tuple[np.ndarray, tuple[TopLogprob, ...]]:
        """The model's own log-probabilities at batch row ``idx`` (before any sampler)."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, idx)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)
        shifted = logits - logits.max()
        log_softmax = shifted - np.log(np.exp(shifted).sum())
        if k <= 0:
            return log_softmax, ()
        best = np.argpartition(-log_softmax, k)[:k]
        best = best[np.argsort(-log_softmax[best])]
        return log_softmax, tuple(TopLogprob(int(t), float(log_softmax[t])) for t in best)

    def memory_reply(self) -> MemoryReply:
        seqs = []
        for seq in range(self.config.n_seq_max):
            pos_max = int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq))
            if pos_max >= 0:
                pos_min = int(llama_cpp.llama_memory_seq_pos_min(self.memory, seq))
                seqs.append(SeqMemory(seq, pos_min, pos_max))
        return MemoryReply(tuple(seqs))

    def _measure_state_bytes_per_token(self) -> int:
        """Bytes of one sequence's state per token, by the slope between two lengths."""
        sizes: list[int] = []
        for n in (16, 48):
            tokens = tuple(min(t, self.n_vocab - 1) for t in range(1, n + 1))
            self._decode((SeqSlice(seq=0, tokens=tokens, start_pos=0),))
            sizes.append(int(llama_cpp.llama_state_seq_get_size(self.ctx, 0)))
            llama_cpp.llama_memory_seq_rm(self.memory, 0, 0, -1)
        return max(1, (sizes[1] - sizes[0]) // 32)


def serve(channel: Channel) -> None:
    start = channel.recv()
    if not isinstance(start, StartCall):
        channel.send(ErrorReply("start", f"expected a start call, got {type(start).__name__}"))
        return
    try:
        engine = Engine(start.config)
    except Exception as exc:
        channel.send(ErrorReply("start", str(exc)))
        return
    channel.send(StartReply(engine.info()))
    while True:
        try:
            message = channel.recv(idle_spin_s=engine.config.call_spin_s)
            call: Call = message  # type: ignore[assignment]
        except EOFError:
            return
        if isinstance(call, ShutdownCall):
            return
        try:
            if isinstance(call, StepCall):
                channel.send(engine.step(call, channel.send_heads_up))
            elif isinstance(call, MemoryCall):
                channel.send(engine.memory_reply())
            else:
                channel.send(ErrorReply("input", f"unexpected {type(call).__name__}"))
        except (InputError, SamplingError) as exc:
            channel.send(ErrorReply("input", str(exc)))


def main(argv: list[str]) -> int:
    quiet_llama_logs()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(argv[1])
    serve(Channel(sock, Call))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
