"""Alembic's environment: always online, on the connection `ledger_db.migrate` hands over (there
is no alembic.ini: the ledger runs the migrations itself when it opens the database)."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
