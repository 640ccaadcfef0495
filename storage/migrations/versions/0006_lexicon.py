"""pronunciation lexicon

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lexicon",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("language", sa.String(16), nullable=False),
        sa.Column("phrase", sa.String(128), nullable=False),
        sa.Column("ipa", sa.String(256), nullable=True),
        sa.Column("respelling", sa.String(256), nullable=True),
        sa.Column("case_sensitive", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(128), nullable=False),
        sa.UniqueConstraint("language", "phrase"),
    )
    version = op.create_table(
        "lexicon_version",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.bulk_insert(version, [{"id": 1, "version": 0}])


def downgrade() -> None:
    op.drop_table("lexicon_version")
    op.drop_table("lexicon")
