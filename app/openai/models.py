"""``/v1/models``: the one model this server serves."""

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
        card = ModelCard(core.model_name, core.created, OWNER, max_model_len=core.n_ctx)
        return ModelList([card])

    def get(self, model_id: str) -> ModelCard:
        card = self.list().data[0]
        if model_id != card.id:
            raise ModelNotFound(model_id)
        return card
