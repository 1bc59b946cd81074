"""Sweeps stepped in turns (issue 36, finding 4): sweeps.stepped_at, when a worker last stepped the sweep
(NULL: never), which the lease takes most overdue first within each project's turn, and
sweep_trials.metrics_generation, the generation of the trial's metrics.json whose epochs are all on its
curve (NULL: none read yet), so that any worker reads the file again only when it changed.

Revision ID: 0010
Revises: 0009
"""
import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('sweeps', sa.Column('stepped_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('sweep_trials', sa.Column('metrics_generation', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column('sweep_trials', 'metrics_generation')
    op.drop_column('sweeps', 'stepped_at')
