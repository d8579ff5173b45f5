"""Stored responses: what ``POST /v1/responses`` keeps (``store``) for a tenant.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.String(40)


def upgrade() -> None:
    op.create_table(
        "stored_responses",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("conversation", sa.Text(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name="fk_stored_responses_tenant_id_tenants",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_stored_responses"),
    )
    op.create_index("ix_stored_responses_tenant_id", "stored_responses", ["tenant_id"])


def downgrade() -> None:
    op.drop_index("ix_stored_responses_tenant_id", table_name="stored_responses")
    op.drop_table("stored_responses")
