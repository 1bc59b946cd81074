"""Drop write-only job columns: jobs.machine and jobs.heartbeat_at were written and never read.

Adoption finds a job's machine by its deterministic name and its labels, and a worker's liveness is
its lease (lease_expires_at), so neither column carried anything a reader used.

Revision ID: 0002
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_column('jobs', 'machine')
    op.drop_column('jobs', 'heartbeat_at')


def downgrade() -> None:
    op.add_column('jobs', sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('jobs', sa.Column('machine', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
