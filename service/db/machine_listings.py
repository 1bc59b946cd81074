"""The fleet's one listing of its machines per product and scope (issue 25; migration 0009): the worker
holding a row's lease lists the cloud on the row's schedule and stores what it found; every other worker
reads the row instead of listing. Each statement is one round trip; callers own the transaction.

Why a lease column and not pg_try_advisory_lock: an advisory lock lives as long as the session that took
it, so holding it means holding a connection (and a pool slot) for the worker's life, and a lister whose
connection is alive but whose process hangs keeps the lock forever. A lease in the row expires on its
own (a dead or stuck lister is replaced once it lapses), costs no connection between listings, and says
who lists and since when to anyone who looks at the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

# One statement: take or renew the lease, or only read, and report a rate-limit refusal. The row is
# created by the first worker to come (it lists first); a conflict updates it in place, so no reader
# waits on a second statement. `holds` is true when the lease is free to take: its holder's (a renewal)
# or lapsed (its lister died or hangs; whoever comes first takes it over). Only the holder writes the
# schedule (interval_s): it is the one that sees what its listings cost. Any worker refused for the rate
# quota stamps refused_at, so the holder slows the whole fleet, not only itself.
_EXCHANGE = text("""
INSERT INTO machine_listings AS m (product, scope, lister, lease_expires_at, interval_s, refused_at)
VALUES (:product, :scope, :me, now() + make_interval(secs => :lease_s), :interval_s,
        CASE WHEN :refused THEN now() END)
ON CONFLICT (product, scope) DO UPDATE SET
    lister = CASE WHEN m.lister = :me OR m.lease_expires_at < now() THEN :me ELSE m.lister END,
    lease_expires_at = CASE WHEN m.lister = :me OR m.lease_expires_at < now()
                            THEN now() + make_interval(secs => :lease_s) ELSE m.lease_expires_at END,
    interval_s = CASE WHEN m.lister = :me OR m.lease_expires_at < now() THEN :interval_s ELSE m.interval_s END,
    refused_at = CASE WHEN :refused THEN now() ELSE m.refused_at END
RETURNING m.lister = :me AS mine, m.interval_s,
          EXTRACT(EPOCH FROM now() - m.listed_at)::float8 AS age_s,
          EXTRACT(EPOCH FROM now() - m.refused_at)::float8 AS refused_age_s,
          EXTRACT(EPOCH FROM m.refused_at)::float8 AS refused_epoch,
          -- The lister lists now unless another worker's listing (a reaper's, a teardown's, a create's)
          -- began less than fresh_s ago: it is not sent what it is about to replace.
          CASE WHEN m.lister = :me AND (m.listed_at IS NULL OR m.listed_at <= now() - make_interval(secs => :fresh_s))
               THEN NULL ELSE m.machines END AS machines
""")

# A listing replaces the stored one only if it began later: a slow listing (a lister that lost its lease
# mid-way, or a worker listing after its own create) must not overwrite a newer one with older news.
_STORE = text("""
UPDATE machine_listings SET listed_at = now() - make_interval(secs => :age_s), machines = :machines
 WHERE product = :product AND scope = :scope
   AND (listed_at IS NULL OR listed_at < now() - make_interval(secs => :age_s))
""").bindparams(bindparam("machines", type_=JSONB))

@dataclass(frozen=True)
class StoredListing:
    mine: bool  # the caller holds the lease: it lists now
    interval_s: float  # the fleet's schedule
    age_s: float | None  # how long ago the stored listing began; None: none stored yet
    refused_age_s: float | None  # how long ago a worker was last refused for the rate quota
    refused_epoch: float | None  # and when, by the database's clock: the same refusal reads the same
    machines: dict[str, Any] | None  # the stored listing (name -> the product's record); `mine`: only a fresh one


def exchange_listing(session: Session, product: str, scope: str, me: str, *, lease_s: float, interval_s: float,
                     fresh_s: float, refused: bool) -> StoredListing:
    """Take or renew the lease if it is free or ours, else read the stored listing (the lister too, if one
    began within fresh_s); `refused`: this worker was refused for the rate quota since its last exchange."""
    row = session.execute(_EXCHANGE, {"product": product, "scope": scope, "me": me, "lease_s": lease_s,
                                      "interval_s": interval_s, "fresh_s": fresh_s, "refused": refused}).one()
    return StoredListing(row.mine, row.interval_s, row.age_s, row.refused_age_s, row.refused_epoch, row.machines)


def store_listing(session: Session, product: str, scope: str, *, age_s: float, machines: dict[str, Any]) -> bool:
    """Store a complete listing begun `age_s` seconds ago; False when a newer one is stored (or no row)."""
    result = session.execute(_STORE, {"product": product, "scope": scope, "age_s": age_s, "machines": machines})
    return bool(result.rowcount)  # type: ignore[attr-defined]

