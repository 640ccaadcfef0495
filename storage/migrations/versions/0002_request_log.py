"""request log

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "request_log",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("client", sa.String(128), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("voice", sa.String(128), nullable=True),
        sa.Column("characters", sa.Integer(), nullable=False),
        sa.Column("queue_ms", sa.Float(), nullable=True),
        sa.Column("synthesis_ms", sa.Float(), nullable=True),
        sa.Column("batch_size", sa.Integer(), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
    )
    op.create_index("ix_request_log_at", "request_log", ["at"])


def downgrade() -> None:
    op.drop_index("ix_request_log_at", "request_log")
    op.drop_table("request_log")
