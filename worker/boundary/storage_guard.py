"""`python -m worker.boundary.storage_guard --upstream URL --boundary FILE --port-file FILE [--refusals FILE]`

The local stand-in for a downscoped token. The GCS emulator checks no credentials, so each local
machine reaches it only through a guard of its own: a loopback HTTP proxy whose address is the
agent's STORAGE_EMULATOR_HOST. It forwards a request only when the object (or listing prefix) it
names lies inside the job's boundary (`worker/boundary/access.py`) and answers anything else with
403 in GCS's JSON error shape, so the client raises `Forbidden` as it would against Cloud Storage.

Requests are routed as the emulator routes them (`gcp_storage_emulator/server.py`): the same path
patterns tried in the same order on the same parsed path, object names unquoted once. Whatever the
guard does not recognise is refused: bucket calls, batch, compose, ACLs, the emulator's own `/wipe`.

The emulator must act on exactly what was checked (issue 18: it read the first of two Content-Type
headers, the guard the last, and a multipart upload named one object to each). So a request whose
headers could read two ways is refused (a name twice in any case, a folded value, Content-Encoding,
a method override, a length given two ways), as is a query naming a parameter twice or a multipart
upload of other than metadata and media, and the emulator is sent a header set the guard builds from
the values it checked (`FORWARDED`), never the job's own.

The emulator answers one request at a time, so the guard reads each answer whole (to a spool file)
before it writes any of it to the job, with a deadline on every read and write on the job's side:
a job that asks for an object and never reads it holds its own guard's thread, not the emulator.
Each refusal also goes to a file the worker forwards to its own log (`worker/boundary/guard_refusals.py`).

A sandboxed machine (worker/local/sandbox.py) has no route to the host's loopback: the guard also listens
on a unix socket in the machine's directory (`--unix-socket`), which the sandbox binds in and a relay inside
serves on the loopback port the job is told (agent/sandbox_relay.py), the same port the guard's links name.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import ThreadingUnixStreamServer
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qs, parse_qsl, unquote, urlparse

from trainjobs.module_command import module_command
from worker.boundary.access import JobBoundary
from worker.boundary.guard_refusals import REFUSALS, RefusalLog

log = logging.getLogger("trainjobs.storage_guard")

_API = r"(?:/storage/v1)?"  # the emulator also serves the JSON API without the /storage/v1 prefix
_BUCKET = r"(?P<bucket>[-.\w]+)"
_OBJECT = r"(?P<object>.*[^/]+)"
COPY = re.compile(rf"{_API}/b/{_BUCKET}/o/{_OBJECT}/(?:copyTo|rewriteTo)/b/(?P<dest_bucket>[-.\w]+)/o/(?P<dest>.*[^/]+)")
OBJECT_SUBRESOURCE = re.compile(rf"{_API}/b/{_BUCKET}/o/{_OBJECT}/(?:compose|acl|restore)")
OBJECT = re.compile(rf"{_API}/b/{_BUCKET}/o/{_OBJECT}")
OBJECTS = re.compile(rf"{_API}/b/{_BUCKET}/o")
BUCKET = re.compile(rf"{_API}/b/{_BUCKET}")
UPLOAD = re.compile(rf"/upload/storage/v1/b/{_BUCKET}/o")
DOWNLOAD = re.compile(rf"/download/storage/v1/b/{_BUCKET}/o/{_OBJECT}")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade", "content-length"}
# Every request header the emulator reads (server.py, handlers/objects.py) other than Host,
# Content-Length, Transfer-Encoding, Content-Encoding and X-HTTP-Method-Override, as it is sent on.
FORWARDED = {"content-type": "Content-Type", "content-range": "Content-Range", "range": "Range",
             "x-upload-content-type": "X-Upload-Content-Type", "x-upload-content-length": "X-Upload-Content-Length"}
CLIENT_TIMEOUT_S = 120.0  # each read from and write to the job's connection (an idle keep-alive one too)
UPSTREAM_TIMEOUT_S = 300.0  # each read from the emulator, which may be busy with other jobs' requests
IN_FLIGHT = 16  # requests one guard forwards at once (each may hold a spooled object); more wait their turn
SPOOL_IN_MEMORY = 8 << 20  # an answer larger than this is spooled to a temporary file
_LENGTH = re.compile(r"[0-9]{1,15}")
UNIX_SOCKET = "storage-guard.sock"  # in the machine's directory, for a sandboxed machine


class Refused(Exception):
    """The request leaves the job's boundary (or is one the guard does not let through at all).
    `routine`: one every job's storage client makes by itself, refused but no sign of anything."""

    def __init__(self, message: str, *, routine: bool = False):
        super().__init__(message)
        self.routine = routine


class Uploads:
    """Resumable upload sessions this guard opened: a chunk names only its upload_id, so the object
    it writes is the one checked when the session was created."""

    def __init__(self) -> None:
        self._ids: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def opened(self, upload_id: str, bucket: str, name: str) -> None:
        with self._lock:
            self._ids[upload_id] = (bucket, name)

    def known(self, upload_id: str) -> bool:
        with self._lock:
            return upload_id in self._ids


def request_headers(raw: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The request's headers by lower-cased name, each of which has one reading, or Refused.

    Two parsers meet here: the guard's (a dict, the last value of a name wins) and the emulator's
    (`Message.get`, the first value of any case wins); a name given twice would read differently
    to each. Values folded over lines, encoded bodies and method overrides are refused for the same
    reason: the emulator would act on something other than what was checked."""
    headers: dict[str, str] = {}
    for name, value in raw:
        key = name.lower()
        if key in headers:
            raise Refused(f"the {name} header is given twice")
        if "\r" in value or "\n" in value:
            raise Refused(f"the {name} header is folded over lines")
        headers[key] = value
    if "content-encoding" in headers:
        raise Refused("encoded request bodies are not let through")
    if "x-http-method-override" in headers:
        raise Refused("method overrides are not let through")
    if "transfer-encoding" in headers and (headers["transfer-encoding"].lower() != "chunked"
                                           or "content-length" in headers):
        raise Refused("a body whose length is given two ways, or by a transfer coding other than chunked")
    if "content-length" in headers and not _LENGTH.fullmatch(headers["content-length"]):
        raise Refused("a Content-Length that is not a number")
    return headers


def check(boundary: JobBoundary, uploads: Uploads, method: str, url: str, headers: dict[str, str],
          body: bytes) -> tuple[str, str] | None:
    """Raise Refused unless the request stays inside the boundary. `url` is the one the emulator will
    parse: http://<the Host header the guard sends>/<the request target>; `headers` come from
    request_headers. Returns (bucket, object) when the request opens a resumable upload, for the
    caller to remember once it is open."""
    parsed = urlparse(url)
    path, query = parsed.path, parse_qs(parsed.query)
    names = [k for k, _ in parse_qsl(parsed.query, keep_blank_values=True)]
    if len(set(names)) != len(names):
        raise Refused("a query that names a parameter twice")
    if (m := COPY.fullmatch(path)) and method == "POST":
        _read(boundary, m["bucket"], unquote(m["object"]))
        _write(boundary, m["dest_bucket"], unquote(m["dest"]))
        return None
    if OBJECT_SUBRESOURCE.fullmatch(path):
        raise Refused("compose, ACLs and restores are not available to jobs")
    if m := OBJECT.fullmatch(path):
        if method == "GET":
            _read(boundary, m["bucket"], unquote(m["object"]))
        elif method in ("DELETE", "PATCH"):
            _write(boundary, m["bucket"], unquote(m["object"]))
        else:
            raise Refused(f"{method} on an object")
        return None
    if m := OBJECTS.fullmatch(path):
        if method == "GET":
            prefix = query.get("prefix", [""])[0]
            if not (boundary.can_list(m["bucket"], prefix) and _plain(prefix.removesuffix("/"))):
                raise Refused(f"listing gs://{m['bucket']}/{prefix}*")
            return None
        if method == "POST" and "uploadType" in query:  # the emulator takes uploads here too
            return _insert(boundary, uploads, m["bucket"], query, headers, body)
        raise Refused(f"{method} on a bucket's objects")
    if m := UPLOAD.fullmatch(path):
        if method == "POST":
            return _insert(boundary, uploads, m["bucket"], query, headers, body)
        if method == "PUT":
            _chunk(uploads, query)
            return None
        raise Refused(f"{method} on the upload endpoint")
    if (m := DOWNLOAD.fullmatch(path)) and method == "GET":
        _read(boundary, m["bucket"], unquote(m["object"]))
        return None
    if BUCKET.fullmatch(path) and method == "GET":
        # google-cloud-storage 3.x looks up each bucket's metadata in the background, for its own
        # telemetry (google/cloud/storage/_bucket_metadata_cache.py), on a job's behalf.
        raise Refused("reading a bucket's metadata", routine=True)
    raise Refused(f"{method} {path}")


def _insert(boundary: JobBoundary, uploads: Uploads, bucket: str, query: dict[str, list[str]],
            headers: dict[str, str], body: bytes) -> tuple[str, str] | None:
    kind = query.get("uploadType", [""])[0]
    if kind == "resumable" and "upload_id" in query:  # a chunk POSTed instead of PUT
        _chunk(uploads, query)
        return None
    if "name" in query:  # the emulator lets the query's name win over the metadata's
        name = query["name"][0]
    elif kind == "multipart":
        name = _multipart_name(headers.get("content-type", ""), body)
    elif kind == "resumable" and headers.get("content-type", "").startswith("application/json"):
        name = _json_name(body)
    else:
        raise Refused(f"an upload ({kind or 'no uploadType'}) without an object name")
    _write(boundary, bucket, name)
    return (bucket, name) if kind == "resumable" else None


def _chunk(uploads: Uploads, query: dict[str, list[str]]) -> None:
    upload_id = query.get("upload_id", [""])[0]
    if not uploads.known(upload_id):
        raise Refused("a resumable upload this job did not open")


def _multipart_name(content_type: str, body: bytes) -> str:
    if not content_type.startswith("multipart/related"):
        raise Refused("a multipart upload that is not multipart/related")
    message = BytesParser().parsebytes(b"Content-Type:" + content_type.encode() + b"\r\n" + body)
    parts = message.get_payload()
    if not isinstance(parts, list) or len(parts) != 2:  # the emulator reads parts 0 and 1 and ignores more
        raise Refused("a multipart upload that is not exactly metadata and media")
    metadata = None if isinstance(parts[0], str) else parts[0].get_payload()
    if not isinstance(metadata, str):
        raise Refused("a multipart upload without metadata")
    return _json_name(metadata.encode())


def _json_name(raw: bytes) -> str:
    try:
        name = json.loads(raw).get("name")
    except (ValueError, AttributeError):
        name = None
    if not isinstance(name, str):
        raise Refused("upload metadata without an object name")
    return name


def _read(boundary: JobBoundary, bucket: str, name: str) -> None:
    if not (_plain(name) and boundary.can_read(bucket, name)):
        raise Refused(f"reading gs://{bucket}/{name}")


def _write(boundary: JobBoundary, bucket: str, name: str) -> None:
    if not (_plain(name) and boundary.can_write(bucket, name)):
        raise Refused(f"writing gs://{bucket}/{name}")


def _plain(name: str) -> bool:
    """No '.', '..' or empty segments: the emulator keeps objects as files under its data directory,
    where such a name would step outside the prefix it was checked against."""
    return "\\" not in name and "\x00" not in name and all(s not in ("", ".", "..") for s in name.split("/"))


def forbidden_body(message: str) -> bytes:
    """GCS's JSON error shape, so google-cloud-storage raises google.api_core.exceptions.Forbidden."""
    return json.dumps({"error": {"code": 403, "message": message,
                                 "errors": [{"message": message, "domain": "global", "reason": "forbidden"}]}}).encode()


class GuardHandler(BaseHTTPRequestHandler):
    """One job's guard; `serve` makes a subclass holding the job's boundary."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the storage client's connection pool expects
    # Headers and body go out in separate writes: with Nagle's algorithm the body then waits for the
    # client's delayed ACK, ~40 ms on every small request.
    disable_nagle_algorithm = True
    timeout = CLIENT_TIMEOUT_S  # on the job's connection (socketserver sets it), so no read or write waits for ever
    boundary: JobBoundary
    uploads: Uploads
    refusals: RefusalLog
    in_flight: threading.BoundedSemaphore
    upstream: str  # the emulator's host:port
    guard_host = ""  # 127.0.0.1:<port> the guard listens on

    def _handle(self) -> None:
        try:
            headers = request_headers(self.headers.items())
        except Refused as exc:
            self.close_connection = True  # its body, unread, must not be taken for a next request
            self._refuse(exc)
            return
        body = self._body(headers)
        try:
            # The emulator parses "http://" + Host + target, so a Host header of the job's making could
            # move the path it acts on away from the one checked here: it always gets its own address.
            opened = check(self.boundary, self.uploads, self.command, f"http://{self.upstream}{self.path}",
                           headers, body)
        except Refused as exc:
            self._refuse(exc)
            return
        with self.in_flight:
            self._forward(headers, body, opened)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    def _refuse(self, exc: Refused) -> None:
        log.log(logging.INFO if exc.routine else logging.WARNING, "refused %s %s: %s", self.command, self.path, exc)
        self.refusals.record(self.command, self.path, str(exc), routine=exc.routine)
        payload = forbidden_body(f"job {self.boundary.job_id} may not do this: {exc}")
        self.send_response(403)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _body(self, headers: dict[str, str]) -> bytes:
        if length := headers.get("content-length"):
            return self.rfile.read(int(length))
        if headers.get("transfer-encoding", "").lower() == "chunked":
            out = bytearray()
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                out += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return bytes(out)
        return b""

    def _forward(self, headers: dict[str, str], body: bytes, opened: tuple[str, str] | None) -> None:
        sent = {FORWARDED[k]: v for k, v in headers.items() if k in FORWARDED}
        sent.update({"Host": self.upstream, "Content-Length": str(len(body))})
        try:
            status, out, payload = self._ask_upstream(sent, body, opened)
        except (OSError, http.client.HTTPException) as exc:
            log.warning("the emulator did not answer %s %s: %s", self.command, self.path, exc)
            self._answer_unavailable()
            return
        with payload:
            size = payload.seek(0, os.SEEK_END)
            payload.seek(0)
            self.send_response(status)
            for k, v in out:
                self.send_header(k, v)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            try:
                shutil.copyfileobj(payload, self.wfile, 1 << 20)  # each write within the socket's timeout
            except OSError as exc:
                self.close_connection = True
                log.warning("job %s stopped reading %s %s: %s", self.boundary.job_id, self.command, self.path, exc)

    def _ask_upstream(self, headers: dict[str, str], body: bytes, opened: tuple[str, str] | None
                      ) -> tuple[int, list[tuple[str, str]], BinaryIO]:
        """(status, headers to send on, the whole answer) from the emulator, whose connection is closed
        before the job is sent a byte: however slowly the job reads, the emulator is free."""
        conn = http.client.HTTPConnection(self.upstream, timeout=UPSTREAM_TIMEOUT_S)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            out = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
            if location := response.getheader("Location"):
                if opened is not None and (upload_id := parse_qs(urlparse(location).query).get("upload_id", [""])[0]):
                    self.uploads.opened(upload_id, *opened)
                out = [(k, self._via_guard(v.encode()).decode() if k.lower() == "location" else v) for k, v in out]
            payload = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)
            try:
                if self._is_media():  # an object's bytes (shards, checkpoints) pass through untouched
                    shutil.copyfileobj(response, payload, 1 << 20)
                else:
                    # Metadata names the emulator in its links (mediaLink, selfLink): they must lead
                    # back here, or the job would learn where to go around the guard.
                    payload.write(self._via_guard(response.read()))
            except BaseException:
                payload.close()
                raise
            return response.status, out, payload  # type: ignore[return-value]  # a spooled file is a binary file
        finally:
            conn.close()

    def _answer_unavailable(self) -> None:
        self.close_connection = True
        payload = json.dumps({"error": {"code": 503, "message": "storage did not answer the job's storage guard"}}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _is_media(self) -> bool:
        """An object's bytes (passed through untouched), not the JSON API's metadata."""
        url = urlparse(self.path)
        return url.path.startswith("/download/") or "media" in parse_qs(url.query).get("alt", [])

    def _via_guard(self, data: bytes) -> bytes:
        return data.replace(f"http://{self.upstream}".encode(), f"http://{self.guard_host}".encode())

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  (the base class's name)
        pass  # a line per request would bury the refusals


def serve(boundary: JobBoundary, upstream: str, port_file: Path | None = None,
          refusals: Path | None = None) -> ThreadingHTTPServer:
    """A guard listening on a free loopback port (written to port_file once it listens), recording
    what it refuses in `refusals`; call serve_forever() on it."""
    target = urlparse(upstream)
    handler: type[GuardHandler] = type("JobGuardHandler", (GuardHandler,), {
        "boundary": boundary, "uploads": Uploads(), "upstream": target.netloc, "refusals": RefusalLog(refusals),
        "in_flight": threading.BoundedSemaphore(IN_FLIGHT)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    port = server.server_address[1]
    handler.guard_host = f"127.0.0.1:{port}"
    if port_file is not None:
        _write_port(port_file, port)
    return server


def _write_port(port_file: Path, port: int) -> None:
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    os.replace(tmp, port_file)  # whole or absent: the provisioner polls for it


def serve_unix(server: ThreadingHTTPServer, path: str) -> ThreadingUnixStreamServer:
    """The same guard (boundary, uploads, refusals) on a unix socket at `path`, for a sandboxed machine;
    call serve_forever() on it. Its links still name the loopback port, which the sandbox's relay serves."""
    job_handler = server.RequestHandlerClass
    assert isinstance(job_handler, type) and issubclass(job_handler, GuardHandler)
    handler: type[GuardHandler] = type("JobGuardUnixHandler", (job_handler,), {
        "disable_nagle_algorithm": False})  # a TCP option: a unix socket has no Nagle
    unix = ThreadingUnixStreamServer(path, handler)
    unix.daemon_threads = True
    return unix


def launch(boundary: JobBoundary, upstream: str, directory: Path, env: dict[str, str],
           timeout_s: float = 30.0, unix_socket: bool = False) -> tuple[int, int]:
    """Start a guard process for one machine, in a session of its own (it outlives a worker that
    dies, as the machine does, and goes when the machine is deleted); return (pid, port). Its
    refusals go to directory/REFUSALS, for the worker to forward (`worker/boundary/guard_refusals.py`).
    `unix_socket`: it also listens on directory/UNIX_SOCKET, there before this returns."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / UNIX_SOCKET).unlink(missing_ok=True)
    (directory / "boundary.json").write_text(boundary.to_json())
    port_file = directory / "storage-guard.port"
    port_file.unlink(missing_ok=True)
    with (directory / "storage-guard.log").open("ab") as out:
        proc = subprocess.Popen(
            module_command("worker.boundary.storage_guard", "--upstream", upstream,
                           "--boundary", str(directory / "boundary.json"), "--port-file", str(port_file),
                           "--refusals", str(directory / REFUSALS), *(["--unix-socket", UNIX_SOCKET] if unix_socket else []),
                           cwd=directory),
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            cwd=directory)  # the socket's name is relative to it: a path may be longer than AF_UNIX takes
    threading.Thread(target=proc.wait, daemon=True).start()  # reap it once it is killed
    deadline = time.monotonic() + timeout_s
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the storage guard did not start; see {directory / 'storage-guard.log'}")
        time.sleep(0.05)
    return proc.pid, int(port_file.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.boundary.storage_guard", description=__doc__)
    parser.add_argument("--upstream", required=True, help="the emulator, http://host:port")
    parser.add_argument("--boundary", required=True, type=Path, help="the job's boundary, as JSON")
    parser.add_argument("--port-file", required=True, type=Path, help="where to write the port it listens on")
    parser.add_argument("--refusals", type=Path, help="where to append what it refuses, a JSON line each")
    parser.add_argument("--unix-socket", help="also listen on this unix socket (for a sandboxed machine)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = serve(JobBoundary.from_json(args.boundary.read_text()), args.upstream, None, args.refusals)
    if args.unix_socket:  # listening before the port file, which tells the provisioner the guard is up
        threading.Thread(target=serve_unix(server, args.unix_socket).serve_forever, daemon=True).start()
    _write_port(args.port_file, server.server_address[1])
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
