"""The OpenAI-compatible surface: schemas, validation, streaming and routes."""
