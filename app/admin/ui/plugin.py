"""The live view as one litestar plugin: its routes and its (Jinja) templates."""

from __future__ import annotations

from litestar.config.app import AppConfig
from litestar.plugins import InitPluginProtocol
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.template.config import TemplateConfig

from app.admin.ui.routes import LIVE_VIEW_HANDLERS, TEMPLATES


class LiveViewPlugin(InitPluginProtocol):
    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        app_config.route_handlers.extend(LIVE_VIEW_HANDLERS)
        app_config.template_config = TemplateConfig(directory=TEMPLATES, engine=JinjaTemplateEngine)
        return app_config
