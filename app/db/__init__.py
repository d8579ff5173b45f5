"""The database: SQLAlchemy 2 async models, the engine, Alembic migrations, repositories."""
