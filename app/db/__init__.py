"""The database: SQLAlchemy 2 async models, the engine, and the Alembic migrations' runner."""
