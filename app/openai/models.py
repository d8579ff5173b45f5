"""``/v1/models``: the one model this server serves, once under each of its names."""

from __future__ import annotations

from app.openai.schemas import ModelCard, ModelList
from app.server.errors import ModelNotFound
from app.server.state import ServerState

OWNER = "quanta"


class ModelService:
    def __init__(self, state: ServerState) -> None:
        self._state = state

    def list(self) -> ModelList:
        core = self._state.ready_core()
        return ModelList(
            [ModelCard(name, core.created, OWNER, max_model_len=core.n_ctx) for name in core.names]
        )

    def get(self, model_id: str) -> ModelCard:
        for card in self.list().data:
            if card.id == model_id:
                return card
        raise ModelNotFound(model_id)
