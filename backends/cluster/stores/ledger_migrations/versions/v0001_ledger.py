"""The ledger's first schema: one row per request's usage, API keys as digests, the audit log.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("reasoning_tokens", sa.BigInteger(), nullable=False),
    )
    op.create_index("usage_by_key_time", "usage", ["key_id", "at"])
    op.create_index("usage_by_time", "usage", ["at"])
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("models", sa.Text(), nullable=True),
        sa.Column("requests_per_minute", sa.Float(), nullable=True),
        sa.Column("tokens_per_day", sa.BigInteger(), nullable=True),
        sa.Column("tokens_per_month", sa.BigInteger(), nullable=True),
        sa.Column("max_parallel", sa.Integer(), nullable=True),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("rotated_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
    )
    op.create_table(
        "audit",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(512), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
    )
    op.create_index("audit_by_time", "audit", ["at"])


def downgrade() -> None:
    op.drop_table("audit")
    op.drop_table("api_keys")
    op.drop_index("usage_by_time", "usage")
    op.drop_index("usage_by_key_time", "usage")
    op.drop_table("usage")
