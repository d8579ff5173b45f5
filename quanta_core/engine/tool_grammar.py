"""What a tool-call grammar must accept, as plain data (the engine side turns it into GBNF).

    before  [open call close] (separator [open call close])*  after
            └──── min_calls .. max_calls calls, each a JSON object ────┘

Each call is ``{"name": <one of the functions>, <args_key>: <that function's parameters>}``.
With ``text``, the answer may instead (or first) be free text that never contains ``trigger``
(the opening of a call): the model chooses between prose and calls, and a call that is
started is always a whole, valid one. With ``answer`` (a JSON schema), the alternative to
calls is a JSON document of that schema (``response_format`` beside tools).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ToolCallGrammar:
    # (name, the parameters' JSON schema as JSON text): hashable, and sent as is
    functions: tuple[tuple[str, str], ...]
    args_key: str = "arguments"
    before: str = ""
    open: str = "<tool_call>\n"
    close: str = "\n</tool_call>"
    separator: str = "\n"
    after: str = ""
    min_calls: int = 1
    max_calls: int | None = None  # None: no bound
    text: bool = False  # free text (without ``trigger``) first, calls optional
    trigger: str = "<tool_call>"
    # Instead of free text, a JSON answer of this schema (JSON text) or calls.
    answer: str | None = None
    # The answer's first ``prefix()`` characters are in the prompt already: the grammar
    # starts after them (only for answers that must call; see ``prefix``).
    prefilled: bool = False

    def head(self, name: str) -> str:
        """How a call of ``name`` starts, up to its arguments (which may follow a space)."""
        return "{" + f'"name": {json.dumps(name)}, {json.dumps(self.args_key)}:'

    def prefix(self) -> str:
        """What every answer starts with when it must call: the opening and as much of the
        call as all the offered functions share (all of it up to the arguments for one).
        Put in the prompt, the model computes it once instead of sampling it under the
        grammar, token by token, in every choice."""
        if self.text or self.answer is not None or self.min_calls < 1 or not self.functions:
            return ""
        heads = [self.head(name) for name, _ in self.functions]
        return self.before + self.open + os.path.commonprefix(heads)  # noqa: RUF071
