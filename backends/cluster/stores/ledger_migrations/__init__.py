"""Alembic's migrations of the ledger database (usage, API keys, audit log): `ledger_db.migrate`
runs them to head when the ledger actor opens the database, on SQLite and PostgreSQL alike."""
