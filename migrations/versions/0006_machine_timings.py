"""Machine timings on the job (issue 10 §4): when each machine was requested, became ready, first heard
from its agent and was deleted (jobs.machines, a JSON list, one entry per machine and attempt), and when
the first training step ran (jobs.first_step_at) with how long after the machine was requested
(jobs.time_to_first_step_s): the control plane's and the cloud's overhead, seen by the user.

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('machines', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column('jobs', sa.Column('first_step_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('jobs', sa.Column('time_to_first_step_s', sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column('jobs', 'time_to_first_step_s')
    op.drop_column('jobs', 'first_step_at')
    op.drop_column('jobs', 'machines')
