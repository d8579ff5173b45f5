"""The engine worker: a child process that owns the llama.cpp context and applies no policy.

    python -m quanta_core.engine.llama_cpp.worker SOCKET_PATH

It connects to the caller's Unix socket, waits for a ``StartCall``, loads the model, then
answers one call at a time: every ``StepCall`` is KV operations, then exactly one
``llama_decode`` of a batch that may mix prefill chunks and decode tokens of many sequences,
then one sample per sequence that asked for logits.

With ``decode_ahead`` (a GPU engine), the worker starts the next decode as soon as it has
replied: each sequence that sampled a token is fed that token at its next position, which is
what the next plan asks for while streams only decode. The plan that follows decides:

    slice = (seq, next position, the token it sampled)   its logits are ready: sampled first
    any other slice                                        decoded as usual, after the plan's ops
    a sequence decoded ahead but not asked for             its cell is removed before the ops

so the plan's outcome is the one it would have had without the lookahead (a stateful sampler
samples at plan time, from the same logits), and the step's time from the caller's side loses
the gap between the reply and the next plan. A plan that restores a stash drops the lookahead
first: a restore looks for contiguous free cells, which the early tokens might have taken.
"""

from __future__ import annotations

import ctypes
import itertools
import socket
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import llama_cpp
import numpy as np

from quanta_core.engine.config import EngineConfig
from quanta_core.engine.llama_cpp.logs import quiet_llama_logs
from quanta_core.engine.llama_cpp.sampling import (
    Sampler,
    SamplerSet,
    SamplingError,
    TemperedRows,
    greedy_rows,
)
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


def _op_seqs(op: KvOp) -> tuple[int, ...]:
    if isinstance(op, CopyPrefix):
        return (op.src, op.dst)
    return (op.seq,) if isinstance(op, Truncate | Stash | Restore) else ()


def _nothing() -> None:
    pass


class Engine:
    """One model, one context with ``n_seq_max`` sequences: over one KV buffer
    (``kv_unified``), or a stream of ``n_ctx / n_seq_max`` cells each."""

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
        # The most positions one sequence may hold: its own stream's cells, or the buffer's.
        self.n_ctx_seq = llama_cpp.llama_n_ctx_seq(self.ctx)
        self.n_batch = llama_cpp.llama_n_batch(self.ctx)
        self.eog = tuple(
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)
        )
        self.samplers = SamplerSet(self.vocab, self.n_vocab, self.eog)
        # The engine's threads are idle while a step's rows are drawn: they share the draw.
        pool = ThreadPoolExecutor(config.threads) if config.threads > 1 else None
        self._tempered = TemperedRows(self.n_vocab, pool, config.threads)
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
        self._eog_set = frozenset(self.eog)
        # The decode run ahead of the next plan: (seq, position, token) -> its row in that
        # batch, and the batch's slices in row order (None: nothing ahead).
        self._ahead: dict[tuple[int, int, int], int] | None = None
        self._ahead_slices: tuple[SeqSlice, ...] = ()
        self._ahead_s = 0.0  # the time its decode call took

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
        notify_s = 0.0

        def notify() -> None:
            nonlocal notify_s
            started = time.perf_counter()
            if heads_up is not None:
                heads_up()
            notify_s = time.perf_counter() - started

        ahead_s = self._ahead_s
        settled = time.perf_counter()
        early, rest = self._settle_ahead(plan, samplers, notify)
        early_s = time.perf_counter() - settled  # sampling what was decoded ahead
        ahead = len(plan.slices) - len(rest)  # slices whose decode ran ahead
        blobs = {}
        for op in plan.kv_ops:
            blob = self._apply(op, call.blobs)
            if blob is not None:
                blobs[op.key] = blob  # type: ignore[union-attr]
        for owner in plan.release:
            self.samplers.release(owner)
        t1 = time.perf_counter()
        decode_error = None
        t2 = t1
        if rest:
            slices = tuple(plan.slices[k] for k in rest)
            rc = self._decode(slices)
            if rc == 0 and not any(s.sample for s in slices):
                # Nothing read back, so nothing waited for the device: a GPU may still be
                # computing the batch's last ubatch. Wait here, so that the step's time is its
                # own, not a part of the next one's (the calibration and the step-cost
                # estimates read it); on a CPU the decode has returned finished already.
                llama_cpp.llama_synchronize(self.ctx)
            t2 = time.perf_counter()
            if rc != 0:
                decode_error = f"llama_decode failed with code {rc} (KV cache full?)"
            else:
                sampled = self._sample(slices, [samplers[k] for k in rest], notify)
                early.update(zip([k for k in rest if plan.slices[k].sample], sampled, strict=True))
        outputs = () if decode_error is not None else tuple(early[k] for k in sorted(early))
        t3 = time.perf_counter()
        timings = StepTimings(
            kv_ops_s=t1 - t0 - early_s,
            decode_s=t2 - t1 + (ahead_s if ahead else 0.0),
            sample_s=t3 - t2 + early_s - notify_s,
            engine_s=t3 - t0 - notify_s,
        )
        result = StepResult(outputs=outputs, timings=timings, decoded_ahead=ahead)
        return StepReply(result=result, blobs=blobs, decode_error=decode_error)

    # ---- the decode ahead of the next plan ----

    def decode_ahead(self, plan: StepPlan, reply: StepReply) -> None:
        """After ``reply`` to ``plan`` went out: decode each sampled token at its sequence's
        next position, as the next plan will ask while the streams only decode."""
        self._ahead = None
        if reply.decode_error is not None or not reply.result.outputs:
            return
        ends = {s.seq: (s.start_pos + len(s.tokens), s) for s in plan.slices if s.sample}
        slices = []
        for out in reply.result.outputs:
            end, s = ends[out.seq]
            if out.token not in self._eog_set and end < self.n_ctx_seq:
                slices.append(SeqSlice(out.seq, (out.token,), end, True, s.owner, s.sampling))
        if not slices:
            return
        self._ahead_slices = tuple(slices)
        started = time.perf_counter()
        rc = self._decode(self._ahead_slices)
        self._ahead_s = time.perf_counter() - started
        if rc != 0:  # no room, say: as if never tried (a failed decode may leave cells)
            self._drop_ahead(range(len(slices)))
            return
        self._ahead = {(s.seq, s.start_pos, s.tokens[0]): i for i, s in enumerate(slices)}

    def drop_ahead(self) -> None:
        """Forget the decode ahead (a call other than a step follows, or a refused one)."""
        if self._ahead is not None:
            self._drop_ahead(self._ahead.values())
            self._ahead = None

    def _drop_ahead(self, rows: Iterable[int]) -> None:
        for i in rows:
            s = self._ahead_slices[i]
            llama_cpp.llama_memory_seq_rm(self.memory, s.seq, s.start_pos, -1)

    def _settle_ahead(
        self, plan: StepPlan, samplers: list[Sampler | None], notify: Callable[[], None]
    ) -> tuple[dict[int, SeqOutput], list[int]]:
        """The plan's slices the decode ahead computed, sampled now (slice index -> output),
        and the indices of the others; the cells decoded ahead that the plan did not ask for
        are removed. Before the plan's ops: they may touch those sequences."""
        ahead, self._ahead = self._ahead, None
        everything = list(range(len(plan.slices)))
        if ahead is None:
            return {}, everything
        if any(type(op) is Restore for op in plan.kv_ops):
            self._drop_ahead(ahead.values())
            return {}, everything
        touched = {q for op in plan.kv_ops for q in _op_seqs(op)}
        rows: dict[int, int] = {}  # ahead row -> slice index
        for k, s in enumerate(plan.slices):
            if s.sample and len(s.tokens) == 1 and s.seq not in touched:
                row = ahead.get((s.seq, s.start_pos, s.tokens[0]))
                if row is not None:
                    rows[row] = k
        self._drop_ahead(i for i in ahead.values() if i not in rows)
        if not rows:
            return {}, everything
        # The ahead batch's rows, each with the plan's sampler where the plan asked for it
        # (the other rows' logits are there, unread).
        batch = self._ahead_slices
        chosen = [samplers[rows[i]] if i in rows else None for i in range(len(batch))]
        rest = [k for k in everything if k not in rows.values()]
        last = not rest and not plan.kv_ops  # else the heads-up comes later, or not at all
        sampled = self._sample(batch, chosen, notify if last else _nothing)
        picked = [rows[i] for i in range(len(batch)) if i in rows]
        return dict(zip(picked, sampled, strict=True)), rest

    def _check(self, plan: StepPlan, blobs: dict[str, bytes]) -> None:
        """Cheap defence against what would corrupt memory; the caller checks positions."""
        n_seq = self.config.n_seq_max
        if plan.num_tokens > self.n_batch:
            raise InputError(f"batch of {plan.num_tokens} tokens is over n_batch={self.n_batch}")
        for s in plan.slices:
            if not 0 <= s.seq < n_seq:
                raise InputError(f"unknown sequence {s.seq}")
            if s.start_pos + len(s.tokens) > self.n_ctx_seq:
                raise InputError(f"sequence {s.seq} overflows its context of {self.n_ctx_seq}")
            if s.tokens and not 0 <= min(s.tokens) <= max(s.tokens) < self.n_vocab:
                raise InputError(f"sequence {s.seq}: token id out of range")
        for op in plan.kv_ops:
            seqs = [op.src, op.dst] if isinstance(op, CopyPrefix) else [getattr(op, "seq", 0)]
            if any(not 0 <= q < n_seq for q in seqs):
                raise InputError(f"unknown sequence in {op}")
            if isinstance(op, Restore) and op.key not in blobs:
                raise InputError(f"restore of {op.key!r} without its bytes")
        if not self.config.kv_unified:
            self._check_stream_copies(plan.kv_ops)

    def _check_stream_copies(self, ops: tuple[KvOp, ...]) -> None:
        """llama.cpp copies a stream at the next decode, not when asked: until then neither
        stream may be read or written by a stash, a restore or another copy's destination,
        and a destination is no source yet (one source may feed several copies)."""
        in_flight: set[int] = set()
        copied_into: set[int] = set()
        for op in ops:
            if isinstance(op, CopyPrefix):
                if op.src in copied_into or op.dst in in_flight:
                    raise InputError(f"{op}: a stream of it is already being copied")
                in_flight.update((op.src, op.dst))
                copied_into.add(op.dst)
            elif isinstance(op, Stash | Restore) and op.seq in in_flight:
                raise InputError(f"{op}: its stream is being copied")

    def _apply(self, op: KvOp, blobs: dict[str, bytes]) -> bytes | None:
        match op:
            case CopyPrefix(src=src, dst=dst, n_tokens=n) if self.config.kv_unified:
                llama_cpp.llama_memory_seq_cp(self.memory, src, dst, 0, n)
            case CopyPrefix(src=src, dst=dst, n_tokens=n):
                # Between streams llama.cpp copies only a whole stream (a partial copy aborts
                # the process): all of it, then cut what the plan did not ask for.
                llama_cpp.llama_memory_seq_cp(self.memory, src, dst, -1, -1)
                llama_cpp.llama_memory_seq_rm(self.memory, dst, n, -1)
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
        drawn = self._draw_rows(slices, samplers)
        chained = [k for k, sampler in enumerate(samplers) if sampler and k not in drawn]
        if not chained:
            before_last()
        outputs = []
        i = 0
        for k, (s, sampler) in enumerate(zip(slices, samplers, strict=True)):
            i += len(s.tokens)
            if sampler is None:
                continue
            idx = i - 1
            logprobs = (  # before the chain: it may write the row (``min_tokens``)
                self._logprobs(idx, s.sampling.logprobs)
                if s.sampling.logprobs is not None
                else None
            )
            token = drawn.get(k)
            if token is None:
                if k == chained[-1]:
                    before_last()
                token = sampler.sample(self.ctx, idx)
            if logprobs is None:
                outputs.append(SeqOutput(s.seq, token))
            else:
                log_softmax, top = logprobs
                outputs.append(SeqOutput(s.seq, token, float(log_softmax[token]), top))
        return outputs

    def _draw_rows(
        self, slices: tuple[SeqSlice, ...], samplers: list[Sampler | None]
    ) -> dict[int, int]:
        """Slice index -> token for the rows drawn for the whole step at once: the plain
        greedy ones from one argmax, the tempered ones by ``TemperedRows`` (outputs are in
        batch order: one row per sampled slice). A greedy row whose argmax is a token its
        chain biases is left to its chain, as is every other row. A sampled slice without a
        sampler (a row decoded ahead that the plan did not ask for) keeps its row unread."""
        greedy: list[tuple[int, int]] = []  # (logits row, slice index)
        tempered: list[tuple[int, int]] = []
        n_out = 0
        for k, (s, sampler) in enumerate(zip(slices, samplers, strict=True)):
            if not (s.sample and s.tokens):
                continue  # no logits row
            if sampler is not None and sampler.plain_greedy is not None:
                greedy.append((n_out, k))
            elif sampler is not None and sampler.tempered is not None:
                tempered.append((n_out, k))
            n_out += 1
        if not (greedy or tempered):
            return {}
        ptr = llama_cpp.llama_get_logits(self.ctx)
        logits = np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))
        chosen = {}
        if greedy:
            rows = [row for row, _ in greedy]
            tokens = greedy_rows(logits if len(rows) == n_out else logits[rows]).tolist()
            for (_, k), token in zip(greedy, tokens, strict=True):
                if token not in samplers[k].plain_greedy:  # type: ignore[union-attr,operator]
                    chosen[k] = int(token)
                    samplers[k].accept(int(token))  # type: ignore[union-attr]
        if tempered:
            rows = [row for row, _ in tempered]
            drawers = [samplers[k] for _, k in tempered]
            tokens = self._tempered.draw(
                logits if len(rows) == n_out else logits[rows],
                drawers,  # type: ignore[arg-type]
            )
            for (_, k), token, sampler in zip(tempered, tokens, drawers, strict=True):
                chosen[k] = token
                sampler.accept(token)  # type: ignore[union-attr]
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
        """What each sequence holds, as the plans made it (a decode ahead not counted)."""
        ahead = {s.seq: s.start_pos for s in self._ahead_slices} if self._ahead else {}
        seqs = []
        for seq in range(self.config.n_seq_max):
            pos_max = int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq))
            if seq in ahead:
                pos_max = min(pos_max, ahead[seq] - 1)
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
                reply = engine.step(call, channel.send_heads_up)
                channel.send(reply)
                if engine.config.decode_ahead:
                    engine.decode_ahead(call.plan, reply)
            elif isinstance(call, MemoryCall):
                channel.send(engine.memory_reply())
            else:
                channel.send(ErrorReply("input", f"unexpected {type(call).__name__}"))
        except (InputError, SamplingError) as exc:
            engine.drop_ahead()  # refused unchanged; the caller may now wipe the sequences
            channel.send(ErrorReply("input", str(exc)))


def main(argv: list[str]) -> int:
    quiet_llama_logs()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(argv[1])
    serve(Channel(sock, Call))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
