"""The usage tables: intervals, their per-day segments, monthly rollups and totals.

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

NAME = sa.String(255)


def upgrade() -> None:
    op.create_table(
        "gpuspawner_usage_intervals",
        sa.Column("uid", sa.String(64), primary_key=True),
        sa.Column("user_name", NAME, nullable=False),
        sa.Column("server_name", NAME, nullable=False),
        sa.Column("charge_group", NAME, nullable=False),
        sa.Column("gpu_type", NAME, nullable=False),
        sa.Column("image", NAME, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("units", sa.Double, nullable=False),
        sa.Column("start_at", sa.Double, nullable=False),
        sa.Column("end_at", sa.Double, nullable=True),
        sa.Column("end_source", sa.String(16), nullable=False),
        sa.Column("last_seen", sa.Double, nullable=True),
    )
    # a user's budget use (open ones: end_at IS NULL; closed ones: end_at > since)
    op.create_index(
        "ix_gpuspawner_usage_intervals_user_end",
        "gpuspawner_usage_intervals",
        ["user_name", "end_at"],
    )
    # the open intervals (the recorder's reconciliation, every summary)
    op.create_index("ix_gpuspawner_usage_intervals_end", "gpuspawner_usage_intervals", ["end_at"])
    # day first and without rowid on SQLite: a run of days is one sweep of the table
    op.create_table(
        "gpuspawner_usage_segments",
        sa.Column("day", sa.BigInteger, primary_key=True),
        sa.Column("uid", sa.String(64), primary_key=True),
        sa.Column("user_name", NAME, nullable=False),
        sa.Column("charge_group", NAME, nullable=False),
        sa.Column("gpu_type", NAME, nullable=False),
        sa.Column("image", NAME, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("units", sa.Double, nullable=False),
        sa.Column("iv_start", sa.Double, nullable=False),
        sa.Column("seg_start", sa.Double, nullable=False),
        sa.Column("seg_end", sa.Double, nullable=False),
        sa.Column("gpu_seconds", sa.Double, nullable=False),
        sa.Column("unit_seconds", sa.Double, nullable=False),
        sa.Column("started", sa.Integer, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "gpuspawner_usage_monthly",
        sa.Column("month", sa.BigInteger, primary_key=True),
        sa.Column("user_name", NAME, primary_key=True),
        sa.Column("charge_group", NAME, primary_key=True),
        sa.Column("gpu_type", NAME, primary_key=True),
        sa.Column("image", NAME, primary_key=True),
        sa.Column("gpu_seconds", sa.Double, nullable=False),
        sa.Column("unit_seconds", sa.Double, nullable=False),
        sa.Column("servers", sa.Integer, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "gpuspawner_usage_totals",
        sa.Column("gpu_type", NAME, primary_key=True),
        sa.Column("charge_group", NAME, primary_key=True),
        sa.Column("gpu_seconds", sa.Double, nullable=False),
    )


def downgrade() -> None:
    for table in (
        "gpuspawner_usage_totals",
        "gpuspawner_usage_monthly",
        "gpuspawner_usage_segments",
        "gpuspawner_usage_intervals",
    ):
        op.drop_table(table)
