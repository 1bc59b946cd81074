"""What our GCS emulator adds to gcp-storage-emulator, installed by stack/emulator_process.py.

- Read preconditions, as GCS answers them: a GET of an object or its bytes with `ifGenerationNotMatch`
  (or `ifMetagenerationNotMatch`) naming the live generation is 304 Not Modified, with no body; with
  `ifGenerationMatch` (`ifMetagenerationMatch`) naming another one it is 412 Precondition Failed. A
  download also says which generation it sent (`x-goog-generation`, `x-goog-metageneration`), which the
  client keeps as the blob's. gcp-storage-emulator ignores all of these; the worker reads status.json
  only when its generation changed (issue 25), and must be tested against the answer GCS gives.
  https://cloud.google.com/storage/docs/json_api/v1/objects/get
- A count of the requests it served, by operation, GCS price class, bucket, object and status, at
  GET /_trainjobs/requests?bucket=NAME: what a bench or a test judges our storage traffic by, counted
  where a request arrives, not by our own code's bookkeeping. Class A (writes and lists) and class B
  (reads, 304s included: GCS bills a request whatever it answers) as GCS prices them; deletes are free.
  https://cloud.google.com/storage/pricing#operations-by-class
- Transcoding, as GCS does it (issue 36, finding 2): an object stored with `contentEncoding: gzip` is
  sent as stored, with `Content-Encoding: gzip`, to a client that accepts gzip (the client library asks
  for it on every download, and inflates what it is sent unless told `raw_download`), and inflated by
  the server for one that does not. gcp-storage-emulator sent the stored bytes with no header, so a
  reader that inflates could not be told from one that reads raw.
  https://cloud.google.com/storage/docs/transcoding
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

COUNTS_PATH = "/_trainjobs/requests"
Handler = Callable[..., Any]


def install() -> None:
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    counts: Counter[tuple[str, str, str, str, int]] = Counter()
    lock = threading.Lock()
    conditional = {objects.get, objects.download}
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            wrapped = _transcoded(_preconditions(handler)) if handler in conditional else handler
            handlers[method] = _counted(wrapped, _operation(method, handler), counts, lock)

    def report(request: Any, response: Any, storage: Any) -> None:
        wanted = request.query.get("bucket", [None])[0]
        with lock:
            rows = [{"op": op, "class": cls, "bucket": b, "object": o, "status": s, "count": n}
                    for (op, cls, b, o, s), n in counts.items() if wanted in (None, b)]
        response.json(rows)

    server.HANDLERS = ((rf"^{COUNTS_PATH}$", {server.GET: report}), *server.HANDLERS)


def _operation(method: str, handler: Handler) -> tuple[str, str]:
    """(name, price class) of what a handler serves."""
    name = f"{handler.__module__.rsplit('.', 1)[-1]}.{handler.__name__}"
    if method == "DELETE":
        return name, "free"
    if method == "GET" and handler.__name__ != "ls":
        return name, "B"
    return name, "A"


def _counted(handler: Handler, op: tuple[str, str], counts: Counter[tuple[str, str, str, str, int]],
             lock: threading.Lock) -> Handler:
    def serve(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return handler(request, response, storage, *args, **kwargs)
        finally:
            params = request.params or {}
            name = op[0] + ("(media)" if request.query.get("alt") == ["media"] else "")
            obj = params.get("object_id") or request.query.get("name", [""])[0]  # an upload names it in the query
            key = (name, op[1], params.get("bucket_name", ""), obj, int(response.status))
            with lock:
                counts[key] += 1
    return serve


def _preconditions(handler: Handler) -> Handler:
    def serve(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        from gcp_storage_emulator.exceptions import NotFound

        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        except NotFound:
            return handler(request, response, storage, *args, **kwargs)  # its own 404
        if (failed := _failed(request.query, obj)) is not None:
            response.status = failed
            if failed == HTTPStatus.PRECONDITION_FAILED:
                response.json({"error": {"code": 412, "message": "At least one of the pre-conditions you "
                                                                  "specified did not hold."}})
            return None
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj["metageneration"])
        return handler(request, response, storage, *args, **kwargs)
    return serve


def _transcoded(handler: Handler) -> Handler:
    def serve(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        import gzip

        from gcp_storage_emulator.exceptions import NotFound

        answer = handler(request, response, storage, *args, **kwargs)
        media = request.query.get("alt") == ["media"] or "/download/" in request.path
        if not media or response.status not in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            return answer
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        except NotFound:
            return answer
        if obj.get("contentEncoding") != "gzip":
            return answer
        response["x-goog-stored-content-encoding"] = "gzip"
        if "gzip" in (request.get_header("accept-encoding") or ""):
            response["Content-Encoding"] = "gzip"
        else:  # decompressive transcoding: the whole object, inflated (GCS ignores a range then)
            response._content = gzip.decompress(storage.get_file(request.params["bucket_name"],
                                                                 request.params["object_id"]))
            response.status = HTTPStatus.OK
            response._headers.pop("Content-Range", None)
        return answer
    return serve


def _failed(query: dict[str, list[str]], obj: dict[str, Any]) -> HTTPStatus | None:
    for field, live in (("Generation", str(obj["generation"])), ("Metageneration", str(obj["metageneration"]))):
        if (match := query.get(f"if{field}Match")) and match[0] != live:
            return HTTPStatus.PRECONDITION_FAILED
        if (not_match := query.get(f"if{field}NotMatch")) and not_match[0] == live:
            return HTTPStatus.NOT_MODIFIED
    return None


def request_counts(emulator_url: str, bucket: str) -> list[dict[str, Any]]:
    """The emulator's count of the requests it served on `bucket` (rows as `install` reports them)."""
    import urllib.parse
    import urllib.request

    url = f"{emulator_url}{COUNTS_PATH}?{urllib.parse.urlencode({'bucket': bucket})}"
    with urllib.request.urlopen(url, timeout=30) as answer:
        rows: list[dict[str, Any]] = json.loads(answer.read())
    return rows
