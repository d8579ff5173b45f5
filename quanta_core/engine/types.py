"""What crosses the boundary between the scheduler and an executor: plain, typed values.

A ``StepPlan`` is exactly one engine pass: first its KV operations, in order, then one batch
holding each sequence's token slice. A ``StepResult`` carries one sampled token per slice that
asked for logits, and the step's timings. They are msgspec structs so that the same objects go
over the worker's socket without a translation layer.
"""

from __future__ import annotations

import msgspec


class SamplingParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """One sequence's sampler chain. ``temperature == 0`` means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # llama.cpp's penalty_repeat: 1 is off
    penalty_last_n: int = 64  # how many recent tokens the penalties look at
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: str | None = None  # GBNF, root rule "root"
    ignore_eos: bool = False  # end-of-generation tokens get -inf
    min_tokens: int = 0  # end-of-generation tokens get -inf until this many were sampled
    logprobs: int | None = None  # None: none; 0: the sampled token's; k: also the top k

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


GREEDY = SamplingParams(temperature=0.0)


# ---- KV operations, applied in order before the batch runs ----


class CopyPrefix(msgspec.Struct, frozen=True, tag=True):
    """Share positions ``[0, n_tokens)`` of ``src`` with ``dst`` (``llama_memory_seq_cp``)."""

    src: int
    dst: int
    n_tokens: int


class Truncate(msgspec.Struct, frozen=True, tag=True):
    """Drop positions ``[start, ∞)`` of ``seq`` (``llama_memory_seq_rm``); 0 frees it all."""

    seq: int
    start: int = 0


class Stash(msgspec.Struct, frozen=True, tag=True):
    """Copy ``seq``'s KV to host RAM under ``key`` and free it in the engine.

    The bytes are held by the executor in the caller's process, so they outlive the worker.
    """

    seq: int
    key: str


class Restore(msgspec.Struct, frozen=True, tag=True):
    """Write the stash ``key`` into the empty ``seq`` and forget the stash."""

    seq: int
    key: str


class DropStash(msgspec.Struct, frozen=True, tag=True):
    """Forget the stash ``key`` (its owner was cancelled or failed)."""

    key: str


KvOp = CopyPrefix | Truncate | Stash | Restore | DropStash


class SeqSlice(msgspec.Struct, frozen=True):
    """New tokens for one sequence, at positions ``start_pos .. start_pos + len(tokens) - 1``.

    ``sample`` asks for logits at the last token and one sampled token back. ``owner`` names
    the request whose sampler chain to use (it lives in the worker across steps and outlives
    stash/restore); ``replay`` are tokens that request already generated, fed to a sampler that
    is being built anew (after a recompute or a worker restart) so penalties and grammar
    state resume where they were.
    """

    seq: int
    tokens: tuple[int, ...]
    start_pos: int
    sample: bool = False
    owner: str = ""
    sampling: SamplingParams = GREEDY
    replay: tuple[int, ...] = ()


class StepPlan(msgspec.Struct, frozen=True):
    kv_ops: tuple[KvOp, ...] = ()
    slices: tuple[SeqSlice, ...] = ()
    release: tuple[str, ...] = ()  # owners whose sampler chains can be freed

    @classmethod
    def make_empty(cls) -> StepPlan:
        return cls()

    @property
    def num_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.slices)

    @property
    def is_empty(self) -> bool:
        return not self.kv_ops and not self.slices and not self.release


class TopLogprob(msgspec.Struct, frozen=True, array_like=True):
    token: int
    logprob: float


class SeqOutput(msgspec.Struct, frozen=True, array_like=True):
    seq: int
    token: int
    logprob: float | None = None
    top_logprobs: tuple[TopLogprob, ...] = ()


class StashInfo(msgspec.Struct, frozen=True, array_like=True):
    key: str
    n_bytes: int


class StepTimings(msgspec.Struct, frozen=True):
    """Seconds. ``engine_s`` is the worker's own work (KV ops, decode, sampling; not its socket
    writes), measured in the worker; ``total_s`` is the whole call, measured by the caller."""

    kv_ops_s: float = 0.0
    decode_s: float = 0.0
    sample_s: float = 0.0
    engine_s: float = 0.0
    total_s: float = 0.0


class StepResult(msgspec.Struct, frozen=True):
    outputs: tuple[SeqOutput, ...] = ()
    stashed: tuple[StashInfo, ...] = ()
    timings: StepTimings = StepTimings()
    decoded_ahead: int = 0  # slices whose decode the worker ran before the plan came

    @classmethod
    def make_empty(cls) -> StepResult:
        return cls()


class EngineInfo(msgspec.Struct, frozen=True):
    """What the scheduler needs to know of the engine it drives."""

    n_ctx: int
    n_seq_max: int
    n_batch: int
    n_vocab: int
    eog_tokens: tuple[int, ...]  # end-of-generation tokens
    kv_bytes_per_token: int  # one sequence's state size per token (for stash costs)
    kv_unified: bool
    model_name: str = ""


class SeqMemory(msgspec.Struct, frozen=True, array_like=True):
    seq: int
    pos_min: int
    pos_max: int


class MemoryStats(msgspec.Struct, frozen=True):
    """The engine's view of its KV cache: which positions each non-empty sequence holds."""

    sequences: tuple[SeqMemory, ...]
    stash_bytes: int  # held on the caller's side
    n_stashes: int
