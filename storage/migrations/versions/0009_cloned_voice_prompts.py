"""cloned voice prompts: the latents file's bytes in the row, so every replica can offer the voice

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cloned_voices") as table:  # rows made before keep only their file
        table.add_column(sa.Column("prompt", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cloned_voices") as table:
        table.drop_column("prompt")
