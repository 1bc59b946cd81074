"""The advisor's advice on each job (issue 24): jobs.advice, a JSON list of {rule, evidence, suggestion,
expected_gain} the worker computes from the job's own numbers (trainjobs/advice.py) as it progresses and
when it ends; NULL until the worker first advises.

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('advice', postgresql.JSONB(astext_type=sa.Text()), nullable=True))


def downgrade() -> None:
    op.drop_column('jobs', 'advice')
