"""Sweeps (issue 22): the sweeps and their trials, and a schema of Optuna's own (`optuna`), where the
worker's RDB storage keeps each sweep's study in the tables Optuna creates and migrates itself.

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE SCHEMA IF NOT EXISTS optuna")
    op.create_table(
        'sweeps',
        sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
        sa.Column('project_id', sa.UUID(), nullable=False),
        sa.Column('name', sa.String(length=128), nullable=False),
        sa.Column('spec', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('status', sa.String(length=16), server_default='RUNNING', nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('note', sa.Text(), nullable=True),
        sa.Column('lease_owner', sa.String(length=200), nullable=True),
        sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['project_id'], ['projects.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_sweeps_project_created', 'sweeps', ['project_id', sa.text('created_at DESC'), sa.text('id DESC')])
    op.create_index('ix_sweeps_active', 'sweeps', ['lease_expires_at'],
                    postgresql_where=sa.text("status IN ('RUNNING', 'CANCELLING')"))
    op.create_table(
        'sweep_trials',
        sa.Column('sweep_id', sa.UUID(), nullable=False),
        sa.Column('number', sa.Integer(), nullable=False),
        sa.Column('optuna_trial_id', sa.Integer(), nullable=False),
        sa.Column('job_id', sa.UUID(), nullable=False),
        sa.Column('params', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('state', sa.String(length=16), server_default='RUNNING', nullable=False),
        sa.Column('value', sa.Float(), nullable=True),
        sa.Column('curve', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column('cost_usd', sa.Float(), server_default='0', nullable=False),
        sa.Column('accelerator_s', sa.Float(), server_default='0', nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('sweep_id', 'number'),
        sa.UniqueConstraint('job_id'),
    )


def downgrade() -> None:
    op.drop_table('sweep_trials')
    op.drop_index('ix_sweeps_active', table_name='sweeps')
    op.drop_index('ix_sweeps_project_created', table_name='sweeps')
    op.drop_table('sweeps')
    op.execute("DROP SCHEMA IF EXISTS optuna CASCADE")
