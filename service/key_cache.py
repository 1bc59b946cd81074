"""API keys this process accepted, remembered for a few seconds, so that a request costs the database
its own work and not a key lookup too (issue 25: the lookup was a second query on every request).

Revocation is pushed: revoke_api_key sends NOTIFY in the revoking transaction (service/db/projects.py),
so PostgreSQL delivers it when, and only if, the revoke commits. Each API process LISTENs on a
connection of its own (KeyListener) and forgets the key. The notification is a hint, not the record:
- an entry lives at most ttl_s whatever arrives (a key deleted by hand, in SQL, sends nothing);
- nothing is remembered while the listener is not connected (a notification sent meanwhile is lost to
  it), and everything is forgotten the moment its connection fails;
- a lookup that started before an invalidation (or a reconnect) is not stored after it: without the
  epoch check, a request could read the key as valid, the revoke commit and its notification drop
  nothing, and the request then store the revoked key for ttl_s.
Only accepted keys are kept. A refused key always goes to the database, and so through the failure
throttle (service/auth_throttle.py): nothing here lets a guess skip it.
"""

from __future__ import annotations

import logging
import select
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DisconnectionError

from service.auth_throttle import env_number
from service.db.projects import KEY_REVOKED_CHANNEL

log = logging.getLogger("trainjobs.api")

CHANNEL = KEY_REVOKED_CHANNEL  # payload: the key's sha256, hex
TTL_ENV = "TRAINJOBS_API_KEY_CACHE_TTL_S"
DEFAULT_TTL_S = 10.0  # how late a key removed without a notification is still accepted
MAX_KEYS = 10_000
RECONNECT_S = 1.0


def ttl_from_env() -> float:
    return env_number(TTL_ENV, DEFAULT_TTL_S)


@dataclass
class KeyCacheCounts:
    hits: int = 0
    misses: int = 0
    invalidations: int = 0  # keys forgotten on a notification, or all of them on a lost listener
    listener_connects: int = 0


class KeyCache:
    """key hash -> project, for ttl_s at most. Used from the database threads and the listener's."""

    def __init__(self, ttl_s: float, max_keys: int = MAX_KEYS, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.max_keys, self._clock = ttl_s, max_keys, clock
        self._lock = threading.Lock()
        self._keys: OrderedDict[bytes, tuple[uuid.UUID, float]] = OrderedDict()  # hash -> (project, expires)
        self._epoch = 0  # moves on every invalidation and every change of the listener's state
        self._listening = False
        self._socket: select.poll | None = None  # the listener's connection, to see what it has not read
        self.counts = KeyCacheCounts()

    def get(self, key_hash: bytes) -> uuid.UUID | None:
        with self._lock:
            entry = self._keys.get(key_hash)
            if entry is not None and entry[1] <= self._clock():
                del self._keys[key_hash]
                entry = None
            # Unread bytes on the listener's socket may be a revoke this request must see: the listener
            # reads them only under this lock (drain), so a hit is never served between the two.
            if entry is not None and not self._unread():
                self.counts.hits += 1
                return entry[0]
            self.counts.misses += 1
            return None

    def _unread(self) -> bool:
        return self._socket is None or bool(self._socket.poll(0))

    def epoch(self) -> int:
        """Taken before the database lookup whose answer may be stored (store)."""
        with self._lock:
            return self._epoch

    def store(self, key_hash: bytes, project: uuid.UUID, epoch: int) -> None:
        """Remember an accepted key, unless anything was invalidated since `epoch` or no one listens."""
        with self._lock:
            if not self._listening or epoch != self._epoch or self.ttl_s <= 0:
                return
            self._keys[key_hash] = (project, self._clock() + self.ttl_s)
            self._keys.move_to_end(key_hash)
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)

    def listening(self, conn: psycopg.Connection[tuple[object, ...]] | None) -> None:
        """The listener's connection is up (LISTEN in force) or gone (None): either way, start from nothing."""
        with self._lock:
            self._drop_all()
            self._listening = conn is not None
            self._socket = None
            if conn is not None:
                self._socket = select.poll()
                self._socket.register(conn.pgconn.socket, select.POLLIN)
                self.counts.listener_connects += 1

    def drain(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """Read what the listener's connection received and forget each key named, under the lock
        that get() checks the socket under. A failed read forgets everything before it lets go."""
        with self._lock:
            try:
                conn.pgconn.consume_input()
                if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the key listener's connection is closed")
                while (note := conn.pgconn.notifies()) is not None:
                    try:
                        key_hash = bytes.fromhex(note.extra.decode())
                    except ValueError:  # not a hash: forget everything rather than guess
                        self._drop_all()
                        continue
                    self._epoch += 1
                    self.counts.invalidations += self._keys.pop(key_hash, None) is not None
            except BaseException:
                self._drop_all()
                self._listening, self._socket = False, None
                raise

    def _drop_all(self) -> None:
        self._epoch += 1
        self.counts.invalidations += len(self._keys)
        self._keys.clear()

    def size(self) -> int:
        with self._lock:
            return len(self._keys)


class KeyListener:
    """LISTEN on CHANNEL on a connection of its own (psycopg, outside the pool: it is held for the
    process's life), forgetting each key named; reconnects after RECONNECT_S when the connection
    fails, and the cache holds nothing until it is back."""

    def __init__(self, engine: Engine, cache: KeyCache):
        self.cache = cache
        url = engine.url.set(drivername="postgresql")
        self._dsn = url.render_as_string(hide_password=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainjobs-key-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()  # seen within the second notifies() waits at most
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                # The same keepalives as the pool's (service/db/session.py): a server gone under an
                # idle LISTEN is noticed within about half a minute, and the TTL covers that half minute.
                with psycopg.connect(self._dsn, autocommit=True, application_name="trainjobs-key-listener",
                                     connect_timeout=5, keepalives=1, keepalives_idle=10, keepalives_interval=5,
                                     keepalives_count=3) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.cache.listening(conn)  # only from here on is every revoke seen
                    readable = select.poll()
                    readable.register(conn.pgconn.socket, select.POLLIN)
                    while not self._stop.is_set():
                        if readable.poll(1000):
                            self.cache.drain(conn)
            except Exception as exc:  # noqa: BLE001 - the database went away; the cache is dropped below
                if not self._stop.is_set():
                    log.warning("API key listener: %s: %s; keys are checked in the database until it is back",
                                type(exc).__name__, exc)
            finally:
                self.cache.listening(None)
            self._stop.wait(RECONNECT_S)

def _dead_at_checkout(dbapi_connection: psycopg.Connection[tuple[object, ...]], record: object,
                      proxy: object) -> None:
    # A pooled connection waits idle: the server sends nothing on it unasked, except its goodbye
    # (pg_terminate_backend, a restart: an error message, then the close). Before the cache, a
    # request's first statement was the key lookup, retried on a dropped connection
    # (session.retry_if_dropped); on a hit the first statement is the route's own, which cannot be
    # retried. One poll of the socket (no round trip) finds such a connection, and the pool replaces
    # it (SQLAlchemy retries a checkout that raises DisconnectionError).
    poller = select.poll()
    poller.register(dbapi_connection.fileno(), select.POLLIN)
    if poller.poll(0):
        raise DisconnectionError("the server closed (or wrote to) an idle pooled connection")


def replace_dropped_connections(engine: Engine) -> None:
    """Check each connection the pool hands out for a server that closed it (once per engine)."""
    if not event.contains(engine, "checkout", _dead_at_checkout):
        event.listen(engine, "checkout", _dead_at_checkout)
