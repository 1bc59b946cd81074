"""Initial schema: projects, API keys, jobs, job events, idempotency keys.

Revision ID: 0001
Revises: 
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('projects',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('api_keys',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('project_id', sa.UUID(), nullable=False),
    sa.Column('key_hash', sa.LargeBinary(length=32), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key_hash')
    )
    op.create_index(op.f('ix_api_keys_project_id'), 'api_keys', ['project_id'], unique=False)
    op.create_table('jobs',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('project_id', sa.UUID(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('spec', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('labels', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('status', sa.Enum('QUEUED', 'STAGING', 'PROVISIONING', 'RUNNING', 'RECOVERING', 'CANCELLING', 'SUCCEEDED', 'FAILED', 'CANCELLED', name='job_status'), server_default='QUEUED', nullable=False),
    sa.Column('attempt', sa.Integer(), server_default='0', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('staging_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('provisioning_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('running_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('progress', sa.Double(), nullable=True),
    sa.Column('metrics', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('runtime', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('machine', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('dataset_uri', sa.Text(), nullable=True),
    sa.Column('lease_owner', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_jobs_labels', 'jobs', ['labels'], unique=False, postgresql_using='gin')
    op.create_index('ix_jobs_lease', 'jobs', ['lease_expires_at'], unique=False, postgresql_where=sa.text('lease_owner IS NOT NULL'))
    op.create_index('ix_jobs_project_created', 'jobs', ['project_id', sa.literal_column('created_at DESC'), sa.literal_column('id DESC')], unique=False)
    op.create_index('ix_jobs_project_status_created', 'jobs', ['project_id', 'status', sa.literal_column('created_at DESC'), sa.literal_column('id DESC')], unique=False)
    op.create_index('ix_jobs_queued', 'jobs', ['created_at'], unique=False, postgresql_where=sa.text("status = 'QUEUED'"))
    op.create_table('idempotency_keys',
    sa.Column('project_id', sa.UUID(), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('request_hash', sa.LargeBinary(length=32), nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('project_id', 'key')
    )
    op.create_table('job_events',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('from_status', sa.Enum('QUEUED', 'STAGING', 'PROVISIONING', 'RUNNING', 'RECOVERING', 'CANCELLING', 'SUCCEEDED', 'FAILED', 'CANCELLED', name='job_status'), nullable=True),
    sa.Column('to_status', sa.Enum('QUEUED', 'STAGING', 'PROVISIONING', 'RUNNING', 'RECOVERING', 'CANCELLING', 'SUCCEEDED', 'FAILED', 'CANCELLED', name='job_status'), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('worker', sa.String(length=200), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_job_events_job_id'), 'job_events', ['job_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_job_events_job_id'), table_name='job_events')
    op.drop_table('job_events')
    op.drop_table('idempotency_keys')
    op.drop_index('ix_jobs_queued', table_name='jobs', postgresql_where=sa.text("status = 'QUEUED'"))
    op.drop_index('ix_jobs_project_status_created', table_name='jobs')
    op.drop_index('ix_jobs_project_created', table_name='jobs')
    op.drop_index('ix_jobs_lease', table_name='jobs', postgresql_where=sa.text('lease_owner IS NOT NULL'))
    op.drop_index('ix_jobs_labels', table_name='jobs', postgresql_using='gin')
    op.drop_table('jobs')
    op.drop_index(op.f('ix_api_keys_project_id'), table_name='api_keys')
    op.drop_table('api_keys')
    op.drop_table('projects')
    sa.Enum(name='job_status').drop(op.get_bind(), checkfirst=True)
