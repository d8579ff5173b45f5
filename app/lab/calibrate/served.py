"""The calibration's served phase: the scheduler's own steps, measured on the real engine.

The grid prices one shape at a time, each from a clean buffer. A server makes other shapes:
sequences at different contexts batched together, beside the prefix cache's holders, in cells
llama.cpp has spread over its buffer. Replayed on the engine alone, the steps of served runs
take longer than a model fitted on the grid only predicts (bench/results/fidelity).

So between the grid's visits (at each reference probe) the calibration also serves a few
requests: for each policy, a fresh ``Scheduler`` runs a short open-loop workload on the real
engine through the simulator's own event loop (``run_workload``), its clock moved by each
real step's wall time (arrivals come in engine time; the idle gaps are skipped). Every step is
a ``Sample`` marked ``served``, in a bin named after its policy, kind of step and batch size:
the fit takes each bin's mean (``quanta_core.sim.fit.fit_points``). Steps that stash or restore
are left out (the grid measures those alone; a served run rarely makes them).

Each segment leaves the engine as it found it: the prefix cache's sequences are freed.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from quanta_core.clock import VirtualClock
from quanta_core.engine import Executor, StepPlan, Truncate
from quanta_core.scheduler.config import PolicyName, SchedulerConfig
from quanta_core.sim.fit import Group, Sample, group_of
from quanta_core.sim.run import run_workload
from quanta_core.sim.step_trace import BATCH_BUCKETS, StepRecord, StepTracer, read_trace
from quanta_core.workload import DistKind, LengthDist, TenantSpec, WorkloadSpec, build_plan


@dataclass(frozen=True, slots=True)
class ServedSpec:
    """What each segment serves, per policy."""

    policies: tuple[str, ...]
    requests: int  # per policy and segment
    rate: float  # arrivals per second of engine time
    prompt: LengthDist
    output: LengthDist


# ~20 s a segment on this 2-core machine (sequential the longest), about 9 segments in all.
FULL_SERVED = ServedSpec(
    policies=("sequential", "static", "fcfs"),
    requests=6,
    rate=2.0,
    prompt=LengthDist(DistKind.UNIFORM, min=16, max=256),
    output=LengthDist(DistKind.UNIFORM, min=8, max=96),
)
QUICK_SERVED = ServedSpec(
    policies=("fcfs",),
    requests=4,
    rate=4.0,
    prompt=LengthDist(DistKind.UNIFORM, min=8, max=48),
    output=LengthDist(DistKind.UNIFORM, min=4, max=12),
)


def bin_label(policy: str, group: Group, seqs: int) -> str:
    """``served fcfs decode ≤4``: the bin a served step's time is averaged in."""
    bound = next((b for b in BATCH_BUCKETS if seqs <= b), seqs)
    return f"served {policy} {group.value} ≤{bound}"


class _PerfClock:
    """The runner's clock (``time.perf_counter``): the samples' ``t`` is read against it."""

    def now(self) -> float:
        return time.perf_counter()


class ServedRunner:
    """Serves one segment per call, on ``executor``; keeps every step as a ``Sample``."""

    def __init__(
        self, executor: Executor, config: SchedulerConfig, spec: ServedSpec, t0: float
    ) -> None:
        self.ex = executor
        self.config = config
        self.spec = spec
        self.t0 = t0  # perf_counter at the calibration's start
        self.samples: list[Sample] = []
        self.segments = 0

    def segment(self) -> None:
        """One short workload per policy; the engine is left empty after each."""
        for policy in self.spec.policies:
            records = self._serve(policy, seed=self.segments)
            self.samples += [s for r in records if (s := self._sample(policy, r)) is not None]
        self.segments += 1

    def describe(self) -> dict[str, Any]:
        """What was served, for the cost model's ``meta["served"]``."""
        return {
            "policies": list(self.spec.policies),
            "segments": self.segments,
            "requests_per_segment": self.spec.requests,
            "rate_per_engine_s": self.spec.rate,
            "prompt": self.spec.prompt.as_dict(),
            "output": self.spec.output.as_dict(),
            "steps": len(self.samples),
            "bins": len({s.point for s in self.samples}),
        }

    def workload(self, policy: str, seed: int) -> WorkloadSpec:
        """The workload of ``policy``'s part of the segment ``seed``."""
        return WorkloadSpec(
            name=f"calibration served {policy}",
            tenants=(TenantSpec("calibrate", prompt=self.spec.prompt, output=self.spec.output),),
            seed=seed,
            requests=self.spec.requests,
            rate=self.spec.rate,
        )

    def _serve(self, policy: str, seed: int) -> Sequence[StepRecord]:
        spec = self.workload(policy, seed)
        sink = io.StringIO()
        tracer = StepTracer(self.ex, _PerfClock(), sink)
        config = replace(self.config, policy=PolicyName(policy))
        stashes = self.ex.memory_stats().n_stashes  # the grid's own, kept in host RAM
        run_workload(spec, build_plan(spec), config, tracer, VirtualClock())
        self._free(stashes)
        sink.seek(0)
        return read_trace(sink)

    def _free(self, stashes: int) -> None:
        """Free what the scheduler left: its prefix cache's sequences (it finished every
        request, so it holds no stash: one more than before is a bug, said here)."""
        stats = self.ex.memory_stats()
        if stats.n_stashes != stashes:
            raise RuntimeError(f"the served workload left {stats.n_stashes - stashes} stashes")
        if stats.sequences:
            self.ex.step(StepPlan(kv_ops=tuple(Truncate(m.seq) for m in stats.sequences)))

    def _sample(self, policy: str, record: StepRecord) -> Sample | None:
        f = record.features
        group = group_of(f)
        if group in (Group.STASH, Group.EMPTY):
            return None
        return Sample(
            point=bin_label(policy, group, f.seqs),
            features=f,
            seconds=record.total,
            engine_s=record.engine,
            t=record.start - self.t0,
            served=True,
        )
