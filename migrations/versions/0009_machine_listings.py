"""The fleet's one listing of its machines per product (issue 25): machine_listings, one row per product
and scope (the GCP project and the zones listed), written by the worker that holds the row's lease and
read by every other worker's MachineWatch instead of listing the clouds itself.

Revision ID: 0009
Revises: 0008
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'machine_listings',
        sa.Column('product', sa.Text(), nullable=False),  # the provisioner's kind: cloud-tpu, compute-engine
        sa.Column('scope', sa.Text(), nullable=False),  # "<project>/<zone>,<zone>...": what was listed
        sa.Column('lister', sa.Text(), nullable=False),  # the worker whose turn it is to list
        sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=False),
        # When the listing's first request went out (NULL: none stored yet); it knows nothing later.
        sa.Column('listed_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('machines', postgresql.JSONB(astext_type=sa.Text()), nullable=False,
                  server_default=sa.text("'{}'::jsonb")),
        sa.Column('interval_s', sa.Float(), nullable=False),  # the fleet's schedule, stretched by rate limits
        sa.Column('refused_at', sa.DateTime(timezone=True), nullable=True),  # a worker's last rate-limit refusal
        sa.PrimaryKeyConstraint('product', 'scope'),
    )


def downgrade() -> None:
    op.drop_table('machine_listings')
