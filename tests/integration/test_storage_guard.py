"""The local storage guard lets through only what it checked, the agent runs only the code that was
uploaded, one job cannot stall another's storage, and what a guard refuses reaches the worker's log
(issue 18: finding 3, finding 6, and the refusals deleted with the machine).

The attacks are tests/support/guard_attacks.py: a real job's model module in the tests marked `tf`, and the
same requests from the test process against a guard of its own for the quick matrix."""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from agent import sandbox_relay
from tests.support import guard_attacks
from tests.support import scaled
from tests.support.tenancy import JOB, ORIGINAL, PROJECT_A, stored
from trainjobs import storage
from worker.boundary import storage_guard
from worker.boundary.access import JobBoundary, Scope
from worker.boundary.guard_refusals import FORWARDED, REFUSALS, RefusalForwarder, RefusalLog
from trainjobs.vm_metadata import LABEL_JOB
from worker.local.provisioner import LocalProvisioner

TARGET = f"uploads/{PROJECT_A}/{'a' * 64}/their_model.py"  # another project's model code


@pytest.fixture(params=["loopback", "unix socket"])
def guard(request, bucket, tmp_path) -> Iterator[str]:
    """The URL of a guard for job JOB (its directory read and write, nothing else), with another
    project's module in the bucket; its refusals go to tmp_path/REFUSALS. Reached on its loopback port, or
    as a sandboxed machine reaches it: through agent/sandbox_relay.py to its unix socket (issue 36, 10)."""
    storage.bucket(bucket).blob(TARGET).upload_from_string(ORIGINAL)
    boundary = JobBoundary(JOB, read=(), write=(Scope(bucket, f"jobs/{JOB}/"),))
    server = storage_guard.serve(boundary, os.environ["STORAGE_EMULATOR_HOST"], refusals=tmp_path / REFUSALS)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if request.param == "loopback":
        yield f"http://127.0.0.1:{server.server_address[1]}"
    else:
        path = os.path.join(tempfile.mkdtemp(), storage_guard.UNIX_SOCKET)  # TMPDIR: short enough for AF_UNIX
        unix = storage_guard.serve_unix(server, path)
        threading.Thread(target=unix.serve_forever, daemon=True).start()
        relay = sandbox_relay.relay(0, path)
        yield f"http://127.0.0.1:{relay.getsockname()[1]}"
        relay.close()
        unix.shutdown()
        unix.server_close()
    server.shutdown()
    server.server_close()


# --- 1. the guard forwards exactly what it checked -------------------------------------------------

@pytest.mark.parametrize("attempt", list(guard_attacks.attempts("b", "own", "target")))
def test_a_request_the_emulator_could_read_another_way_is_refused(guard, bucket, attempt):
    status = guard_attacks.attempts(bucket, f"jobs/{JOB}/decoy.py", TARGET)[attempt](guard)

    assert stored(bucket, TARGET) == ORIGINAL, status
    assert status == 403
    assert stored(bucket, f"jobs/{JOB}/decoy.py") is None


def test_the_same_upload_with_one_of_each_header_is_let_through(guard, bucket):
    body = guard_attacks._multipart("B", f"jobs/{JOB}/model.py", b"mine")
    head = (f"POST /upload/storage/v1/b/{bucket}/o?uploadType=multipart HTTP/1.1\nHost: x\nConnection: close\n"
            f"Content-Type: multipart/related; boundary=B\nContent-Length: {len(body)}\n")

    assert guard_attacks.request(guard, head, body) == 200
    assert stored(bucket, f"jobs/{JOB}/model.py") == b"mine"


# --- 2. the agent runs only the bytes that were uploaded -------------------------------------------


# --- 3. one job cannot stall the others' storage ---------------------------------------------------

def test_a_download_nobody_reads_leaves_the_emulator_free(guard, bucket):
    """In-process: the guard reads the emulator's whole answer before it writes any to the job."""
    storage.bucket(bucket).blob(f"jobs/{JOB}/large.bin").upload_from_string(os.urandom(96 << 20))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", int(guard.rsplit(":", 1)[1])))
    try:
        sock.sendall(f"GET /download/storage/v1/b/{bucket}/o/jobs%2F{JOB}%2Flarge.bin?alt=media HTTP/1.1\r\n"
                     "Host: x\r\n\r\n".encode())
        sock.settimeout(scaled(60))
        assert sock.recv(1) == b"H"  # the answer has begun: the emulator has taken the request
        blob = storage.bucket(bucket).blob(TARGET)
        assert blob.download_as_bytes(timeout=scaled(60)) == ORIGINAL  # straight to the emulator
    finally:
        sock.close()


# --- 4. refusals reach the worker's log ------------------------------------------------------------

def test_refusals_are_forwarded_once_with_the_job_the_worker_knows(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="trainjobs.worker")
    refusals = RefusalLog(tmp_path / REFUSALS)
    refusals.record("POST", "/upload/storage/v1/b/tj/o?uploadType=multipart", "the Content-Type header is given twice")
    # What every job's storage client asks by itself (bucket metadata) is refused too, but is no news.
    refusals.record("GET", "/storage/v1/b/tj", "reading a bucket's metadata", routine=True)
    forwarder = RefusalForwarder()

    forwarder.finish("machine", tmp_path, JOB)
    refusals.record("GET", "/storage/v1/b/tj/o", "listing gs://tj/*")
    forwarder.finish("machine", tmp_path, JOB)

    assert [r.getMessage() for r in caplog.records if r.name == "trainjobs.worker" and r.levelno >= logging.WARNING] == [
        f"job {JOB}: storage guard refused POST '/upload/storage/v1/b/tj/o?uploadType=multipart': "
        "the Content-Type header is given twice",
        f"job {JOB}: storage guard refused GET '/storage/v1/b/tj/o': listing gs://tj/*"]


def test_files_the_job_planted_in_its_machine_directory_break_neither_forwarding_nor_delete(tmp_path, caplog):
    """The job's code can write into its machine's directory: a directory where the progress file goes,
    a negative offset. The machine's delete still completes and the other machines' refusals still
    reach the log."""
    caplog.set_level(logging.WARNING, logger="trainjobs.worker")
    mine, other = tmp_path / "mine", tmp_path / "other"
    for directory in (mine, other):
        directory.mkdir()
        RefusalLog(directory / REFUSALS).record("GET", "/storage/v1/b/tj/o", f"listing from {directory.name}")
    (mine / (FORWARDED + ".tmp")).mkdir()
    (other / FORWARDED).write_text("-5")
    forwarder = RefusalForwarder()

    forwarder.finish("mine", mine, JOB)  # raised IsADirectoryError, and the delete with it
    forwarder.finish("other", other, JOB)

    messages = [r.getMessage() for r in caplog.records if r.name == "trainjobs.worker"]
    assert any("listing from mine" in m for m in messages) and any("could not forward" in m for m in messages)
    assert any("listing from other" in m for m in messages)


def test_a_deleted_machines_last_refusals_reach_the_log_of_the_worker_that_deletes_it(tmp_path, caplog):
    """Even a worker that never watched the machine (it restarted, say) forwards what is left before
    the machine's directory, the guard's log with it, is removed."""
    caplog.set_level(logging.WARNING, logger="trainjobs.worker")
    provisioner = LocalProvisioner(tmp_path / "machines")
    machine = provisioner.root / "m1"
    machine.mkdir()
    (provisioner.root / "m1.json").write_text(json.dumps({
        "name": "m1", "labels": {LABEL_JOB: JOB}, "devices": 1, "created": time.time(), "logs": str(machine),
        "pids": [], "started": {}}))
    RefusalLog(machine / REFUSALS).record("GET", "/storage/v1/b/tj/o?prefix=uploads%2F", "listing gs://tj/uploads/*")

    provisioner.delete("m1")

    assert not machine.exists()
    assert [r.getMessage() for r in caplog.records if r.name == "trainjobs.worker"] == [
        f"job {JOB}: storage guard refused GET '/storage/v1/b/tj/o?prefix=uploads%2F': listing gs://tj/uploads/*"]


def test_a_refusal_log_the_job_floods_is_logged_in_bounded_lines(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="trainjobs.worker")
    refusals = RefusalLog(tmp_path / REFUSALS)
    for i in range(5000):
        refusals.record("GET", f"/storage/v1/b/tj/o/{i}", "reading")

    RefusalForwarder().finish("machine", tmp_path, JOB)

    lines = [r.getMessage() for r in caplog.records if r.name == "trainjobs.worker"]
    assert len(lines) < 1000
    assert any(line.startswith(f"job {JOB}: its storage guard refused") and "more requests" in line for line in lines)
