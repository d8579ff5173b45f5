"""Prompts of real text, tokenized by the model under test to exactly the planned length.

The long-prompt scenarios measure prefill and attention at real lengths, so their prompts
are real text (the Python standard library's own source: English docstrings and code, on
every machine that runs Python), not random ids: a server's tokenizer-dependent paths and
the model's attention see what a user would send. Each request starts at its own place in
the corpus, drawn from (workload, seed, request index), so no two requests share a prefix
by accident and a prefix cache finds only what a scenario shares on purpose: a tenant's
``prefix_tokens`` are the same text for all of its requests, drawn from the tenant's name.

    request i:   [ tenant prefix (prefix_tokens) | its own text ............ ]
                   same for the tenant             from its own offset

The ids are computed before a run (``prompt_ids_for``), outside the timed part, and sent
as a token-id prompt on /v1/completions: the same ids reach every server.
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from quanta_core.workload import PlannedRequest, WorkloadSpec

Tokenize = Callable[[str], list[int]]

# Characters read per wanted token at first (code and prose run 3-4 characters a token);
# a short read is doubled until it holds enough tokens.
CHARS_PER_TOKEN = 5
# No two requests of a plan start with the same this many tokens (a redraw otherwise), so a
# prefix cache of any block size cannot hit across them by chance.
DISTINCT_HEAD = 32


@dataclass(frozen=True, slots=True)
class Corpus:
    """One long text; ``window(offset, chars)`` reads it as a ring from a line start."""

    text: str

    def __post_init__(self) -> None:
        if not self.text:
            raise ValueError("an empty corpus")

    def window(self, offset: int, chars: int) -> str:
        n = len(self.text)
        start = (self.text.find("\n", offset % n) + 1) % n  # the next line's start
        out = self.text[start : start + chars]
        while len(out) < chars:
            out += self.text[: chars - len(out)]
        return out


@cache
def stdlib_corpus() -> Corpus:
    """The standard library's ``.py`` files, in path order (no installed packages)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return Corpus("\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files))


def text_ids(tokenize: Tokenize, corpus: Corpus, rng: random.Random, n: int) -> list[int]:
    """``n`` token ids of the corpus's text from a place ``rng`` draws."""
    if n <= 0:
        return []
    offset = rng.randrange(len(corpus.text))
    chars = CHARS_PER_TOKEN * n + 64
    while True:
        ids = tokenize(corpus.window(offset, chars))
        if len(ids) >= n:
            return ids[:n]
        chars *= 2


def prompt_ids_for(
    spec: WorkloadSpec,
    plan: Sequence[PlannedRequest],
    tokenize: Tokenize,
    corpus: Corpus | None = None,
) -> dict[int, list[int]]:
    """Each planned request's prompt (by its index), exactly ``prompt_tokens`` long."""
    corpus = corpus or stdlib_corpus()
    prefixes: dict[str, list[int]] = {}
    heads: set[tuple[int, ...]] = set()
    out: dict[int, list[int]] = {}
    for r in plan:
        if r.tenant not in prefixes:
            rng = random.Random(f"{spec.name}:{spec.seed}:prefix:{r.tenant}")
            prefixes[r.tenant] = text_ids(tokenize, corpus, rng, r.prefix_tokens)
        prefix = prefixes[r.tenant][: r.prefix_tokens]
        rng = random.Random(f"{spec.name}:{spec.seed}:prompt:{r.index}")
        for _ in range(100):
            own = text_ids(tokenize, corpus, rng, r.prompt_tokens - len(prefix))
            head = tuple(own[:DISTINCT_HEAD])
            if head not in heads or not own:
                break
        heads.add(head)
        out[r.index] = prefix + own
    return out


def model_tokenizer(model_path: Path) -> Tokenize:
    """The model's own tokenizer (vocabulary only), without BOS or special tokens."""
    from quanta_core.engine.llama_cpp.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(str(model_path))
    return lambda text: tokenizer.encode(text, add_special=False)
