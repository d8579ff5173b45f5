"""The server: settings, assembly of the core, the litestar app, its lifecycle, errors, health
and metrics. ``create_app`` (``app.server.app``) is the face; ``serve`` runs it under uvicorn."""
