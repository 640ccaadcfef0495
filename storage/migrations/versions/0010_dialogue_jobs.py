"""dialogue jobs: a job's progress in turns (done, in all) and the captions asked for with its result

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as table:  # speech jobs (and rows from before) leave them empty
        table.add_column(sa.Column("turns", sa.Integer(), nullable=True))
        table.add_column(sa.Column("turns_done", sa.Integer(), nullable=True))
        table.add_column(sa.Column("captions", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as table:
        table.drop_column("captions")
        table.drop_column("turns_done")
        table.drop_column("turns")
