"""A job's own code attacking its storage guard (issue 18, findings 3 and 6).

This file is uploaded as a job's model module (tests/e2e/test_storage_guard.py) and runs inside the
agent, so it imports only the standard library at the top. Each attempt speaks raw HTTP to the
guard, as hostile code would, to make the guard check one object and the emulator write another;
`build_model` runs them all and reports each status. `hold_a_download` asks for a large object of
its own and never reads the answer.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

FORGED = b"raise SystemExit('forged code ran')\n"


def request(guard: str, head: str, body: bytes = b"") -> int:
    """Send one request exactly as written (header lines joined by CRLF) and return the status."""
    host, port = guard.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode("latin-1") + b"\r\n" + body)
        answer = b""
        while b"\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _multipart(boundary: str, name: str, content: bytes) -> bytes:
    return (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
            f"{json.dumps({'name': name})}\r\n--{boundary}\r\nContent-Type: text/x-python\r\n\r\n").encode() \
        + content + f"\r\n--{boundary}--\r\n".encode()


def _gzip_hiding(visible: bytes, compressed: bytes) -> bytes:
    """A gzip stream of `compressed` whose header comment is `visible`: read raw, the body is
    `visible` (and binary noise the multipart parser skips); decompressed, it is `compressed`."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = deflate.compress(compressed) + deflate.flush()
    header = b"\x1f\x8b\x08\x10" + b"\0\0\0\0\0\xff" + b"\r\n" + visible + b"\0"  # FCOMMENT
    return header + data + struct.pack("<II", zlib.crc32(compressed), len(compressed))


def attempts(bucket: str, own: str, target: str) -> dict[str, Callable[[str], int]]:
    """What a job may try, each meant to write `target` (outside its boundary) while showing the
    guard `own` (inside it)."""
    upload = f"POST /upload/storage/v1/b/{bucket}/o?uploadType=multipart HTTP/1.1\nHost: x\nConnection: close\n"
    two_boundaries = _multipart("SEEN", own, b"harmless") + b"\r\n" + _multipart("USED", target, FORGED)
    hidden = _gzip_hiding(_multipart("B", own, b"harmless"), _multipart("B", target, FORGED))
    media = f"POST /upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(own, safe='')}"
    return {
        # The reported bypass: the emulator reads the first Content-Type, the guard read the last.
        "two Content-Types differing in case": lambda g: request(
            g, upload + f"Content-Type: multipart/related; boundary=USED\ncontent-type: multipart/related; "
                        f"boundary=SEEN\nContent-Length: {len(two_boundaries)}\n", two_boundaries),
        "two Content-Types in the same case": lambda g: request(
            g, upload + f"Content-Type: multipart/related; boundary=USED\nContent-Type: multipart/related; "
                        f"boundary=SEEN\nContent-Length: {len(two_boundaries)}\n", two_boundaries),
        # Same root: the emulator decompresses by the first Content-Encoding, the guard saw the last (empty).
        "two Content-Encodings": lambda g: request(
            g, upload + "Content-Type: multipart/related; boundary=B\nContent-Encoding: gzip\ncontent-encoding: \n"
                        f"Content-Length: {len(hidden)}\n", hidden),
        "a gzip-encoded upload": lambda g: request(
            g, upload + f"Content-Type: multipart/related; boundary=B\nContent-Encoding: gzip\n"
                        f"Content-Length: {len(hidden)}\n", hidden),
        "a folded Content-Type": lambda g: request(
            g, upload + f"Content-Type: multipart/related;\n boundary=USED\nContent-Length: {len(two_boundaries)}\n",
            two_boundaries),
        "a multipart upload of three parts": lambda g: request(
            g, upload + f"Content-Type: multipart/related; boundary=USED\nContent-Length: "
                        f"{len(_three_parts(own))}\n", _three_parts(own)),
        "name twice in the query": lambda g: request(
            g, f"{media}&name={quote(target, safe='')} HTTP/1.1\nHost: x\nConnection: close\nContent-Length: 6\n",
            b"forged"),
        "a length given two ways": lambda g: request(
            g, f"{media} HTTP/1.1\nHost: x\nConnection: close\nContent-Length: 6\nTransfer-Encoding: chunked\n",
            b"forged"),
        "Host twice": lambda g: request(
            g, f"{media} HTTP/1.1\nHost: x\nhost: y\nConnection: close\nContent-Length: 6\n", b"forged"),
        "a method override": lambda g: request(
            g, f"GET /storage/v1/b/{bucket}/o/{quote(target, safe='')} HTTP/1.1\nHost: x\nConnection: close\n"
               "X-HTTP-Method-Override: DELETE\n"),
        "an encoded slash and dot segments in the path": lambda g: request(
            g, f"DELETE /storage/v1/b/{bucket}/o/{quote(own, safe='')}%2F..%2F..%2F..%2F{quote(target, safe='')} "
               "HTTP/1.1\nHost: x\nConnection: close\n"),
        "the XML API": lambda g: request(
            g, f"PUT /{bucket}/{target} HTTP/1.1\nHost: x\nConnection: close\nContent-Length: 6\n", b"forged"),
    }


def _three_parts(name: str) -> bytes:
    return _multipart("USED", name, FORGED).replace(b"\r\n--USED--", b"\r\n--USED\r\n\r\nextra\r\n--USED--")


def _own_job_dir() -> tuple[str, str]:
    """(bucket, key prefix) of this job's directory: the agent was started with --job-dir."""
    job_dir = sys.argv[sys.argv.index("--job-dir") + 1]
    bucket, _, key = job_dir.removeprefix("gs://").partition("/")
    return bucket, key.rstrip("/")


def _small_model(input_shape: Any, num_classes: int) -> Any:
    import keras

    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(num_classes, activation="softmax")])


def build_model(input_shape: Any, num_classes: int, params: dict[str, Any]) -> Any:
    guard = os.environ["STORAGE_EMULATOR_HOST"]
    bucket, own = _own_job_dir()
    report = {what: attempt(guard) for what, attempt in attempts(bucket, f"{own}/decoy.py", params["target"]).items()}
    Path(params["report"]).write_text(json.dumps(report))
    return _small_model(input_shape, num_classes)


def hold_a_download(input_shape: Any, num_classes: int, params: dict[str, Any]) -> Any:
    """Store a large object in its own directory, ask the guard for it, read nothing until the test
    says so."""
    guard = os.environ["STORAGE_EMULATOR_HOST"]
    bucket, own = _own_job_dir()
    name = quote(f"{own}/large.bin", safe="")
    size = params["size"]
    status = request(guard, f"POST /upload/storage/v1/b/{bucket}/o?uploadType=media&name={name} HTTP/1.1\n"
                            f"Host: x\nConnection: close\nContent-Length: {size}\n", os.urandom(size))
    assert status == 200, status
    host, port = guard.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes nothing
    sock.connect((host, int(port)))
    sock.sendall(f"GET /download/storage/v1/b/{bucket}/o/{name}?alt=media HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    sock.recv(1)  # the answer has begun: the emulator has taken the request; the rest is left unread
    Path(params["holding"]).write_text("")
    deadline = time.monotonic() + 900
    while not Path(params["release"]).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    sock.close()
    return _small_model(input_shape, num_classes)

