"""Columns for tenancy and fault tolerance (issue 8).

- jobs.artifacts: the artifact manifest as the agent wrote it when the job succeeded, copied by the
  worker out of the job's reach; downloads are checked against it.
- jobs.wait_reason: why a queued job has not started (a project quota), for the user to read.
- jobs.accelerators: the chips or GPUs the job holds while it runs, fixed at submit, summed by quotas.
- jobs.driver_failures: consecutive failed driver steps, kept across worker restarts.
- projects.max_running_jobs / max_accelerators: per-project quotas; NULL means the deployment default.

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('artifacts', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column('jobs', sa.Column('wait_reason', sa.Text(), nullable=True))
    op.add_column('jobs', sa.Column('accelerators', sa.Integer(), server_default='0', nullable=False))
    op.add_column('jobs', sa.Column('driver_failures', sa.Integer(), server_default='0', nullable=False))
    op.add_column('projects', sa.Column('max_running_jobs', sa.Integer(), nullable=True))
    op.add_column('projects', sa.Column('max_accelerators', sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column('projects', 'max_accelerators')
    op.drop_column('projects', 'max_running_jobs')
    op.drop_column('jobs', 'driver_failures')
    op.drop_column('jobs', 'accelerators')
    op.drop_column('jobs', 'wait_reason')
    op.drop_column('jobs', 'artifacts')
