"""Listing by label within a project (issue 12): a GIN index on {project id: labels}.

A label filter was served by a GIN index on labels alone, across every project, or by walking the
project's newest-first index and dropping the rows whose labels do not match: at 100k jobs a
project, a label rare in it but common in another project read the whole project (90 ms). This
indexes the expression jsonb_set('{}', ARRAY[project_id::text], labels), i.e. {project id: labels}
(jsonb_build_object is not immutable), with jsonb_path_ops, which
hashes each path from the root: one entry per (project, label key, value), whose posting list is
exactly that project's jobs with that label. service/db/jobs.py:list_jobs asks it
(labels_in_project) when the project's newest jobs hold no page of matches. Every label filter is
within a project, so the index on labels alone is dropped. Plans: bench/README.md.

Revision ID: 0005
Revises: 0003
"""
from alembic import op

revision = '0005'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX ix_jobs_project_labels ON jobs "
               "USING gin ((jsonb_set('{}', ARRAY[project_id::text], labels)) jsonb_path_ops)")
    op.drop_index('ix_jobs_labels', table_name='jobs', postgresql_using='gin')


def downgrade() -> None:
    op.create_index('ix_jobs_labels', 'jobs', ['labels'], unique=False, postgresql_using='gin')
    op.drop_index('ix_jobs_project_labels', table_name='jobs')
