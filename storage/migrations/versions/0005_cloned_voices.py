"""cloned voices

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cloned_voices",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("public", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("transcript", sa.Text(), nullable=True),
        sa.Column("path", sa.String(512), nullable=False),
        sa.Column("consent_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_cloned_voices_owner", "cloned_voices", ["owner"])


def downgrade() -> None:
    op.drop_table("cloned_voices")
