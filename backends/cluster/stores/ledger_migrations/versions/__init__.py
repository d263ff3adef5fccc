"""One module per schema revision, oldest first (alembic's `down_revision` chain)."""
