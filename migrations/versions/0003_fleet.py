"""Fleet: quota leases shared by replicas, their heartbeats and live counters, and (on PostgreSQL) a
notification on every change of a tenant, key or quota policy.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.String(40)
CHANNEL = "quanta_tenancy"  # app/tenancy/listener.py listens on it

# Every writer (the admin API of any replica, the CLI, SQL by hand) goes through these
# triggers, so every replica hears of a revocation, rotation or new quota at once. The
# payload is the tenant's id: a replica reloads that tenant.
NOTIFY_FUNCTION = f"""
CREATE OR REPLACE FUNCTION quanta_tenancy_notify() RETURNS trigger AS $$
DECLARE
    row_data record;
    tenant text;
BEGIN
    IF TG_OP = 'DELETE' THEN row_data := OLD; ELSE row_data := NEW; END IF;
    IF TG_TABLE_NAME = 'tenants' THEN
        tenant := row_data.id;
    ELSIF TG_TABLE_NAME = 'api_keys' THEN
        tenant := row_data.tenant_id;
    ELSE
        tenant := row_data.tenant_id;
        IF tenant IS NULL THEN
            SELECT tenant_id INTO tenant FROM api_keys WHERE id = row_data.key_id;
        END IF;
    END IF;
    PERFORM pg_notify('{CHANNEL}', coalesce(tenant, ''));
    RETURN NULL;
END
$$ LANGUAGE plpgsql
"""
WATCHED = ("tenants", "api_keys", "quota_policies")


def upgrade() -> None:
    op.create_table(
        "fleet_leases",
        sa.Column("id", ID, nullable=False),
        sa.Column("scope", sa.String(64), nullable=False),
        sa.Column("replica", sa.String(128), nullable=False),
        sa.Column("open", sa.Boolean(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("granted_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("counted_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_fleet_leases"),
    )
    op.create_index("ix_fleet_leases_scope", "fleet_leases", ["scope"])
    op.create_index("ix_fleet_leases_replica", "fleet_leases", ["replica"])
    op.create_table(
        "fleet_live",
        sa.Column("replica", sa.String(128), nullable=False),
        sa.Column("scope", sa.String(64), nullable=False),
        sa.Column("requests_last_minute", sa.Integer(), nullable=False),
        sa.Column("tokens_last_minute", sa.Integer(), nullable=False),
        sa.Column("tokens_today", sa.Integer(), nullable=False),
        sa.Column("concurrent_requests", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("replica", "scope", name="pk_fleet_live"),
    )
    op.create_table(
        "fleet_replicas",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("seen_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_fleet_replicas"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(NOTIFY_FUNCTION)
        for table in WATCHED:
            op.execute(
                f"CREATE TRIGGER {table}_notify AFTER INSERT OR UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION quanta_tenancy_notify()"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in WATCHED:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_notify ON {table}")
        op.execute("DROP FUNCTION IF EXISTS quanta_tenancy_notify()")
    op.drop_table("fleet_replicas")
    op.drop_table("fleet_live")
    op.drop_index("ix_fleet_leases_replica", table_name="fleet_leases")
    op.drop_index("ix_fleet_leases_scope", table_name="fleet_leases")
    op.drop_table("fleet_leases")
