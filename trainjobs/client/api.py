"""Python client for the trainjobs API."""

from __future__ import annotations

import builtins
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from trainjobs.config import load_client_config
from trainjobs.states import TERMINAL, SweepStatus


_RETRIED_STATUSES = (502, 503, 504)  # a proxy or the API itself could not answer this time
_SWEEP_TERMINAL = frozenset(s for s in SweepStatus if s.terminal)


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any]):
        err = body.get("error", {}) if isinstance(body, dict) else {}
        self.status, self.code = status, err.get("error", "error")
        self.message, self.details = err.get("message", str(body)), err.get("details", [])
        super().__init__(f"{status} {self.code}: {self.message}")


class ApiUnreachable(Exception):
    """Nothing answers at the API's URL (connection refused, unknown host, timed out connecting)."""

    def __init__(self, url: str, cause: Exception):
        self.url = url
        super().__init__(f"cannot reach the trainjobs API at {url} ({type(cause).__name__}: {cause}); "
                         "start a local stack with `trainjobs up`, or set TRAINJOBS_API_URL")


class StreamUnsupported(Exception):
    """The API answered a follow request without text/event-stream (a server from before streaming)."""


@dataclass(frozen=True)
class StreamEvent:
    """One server-sent event: `log` {line}, `metric` {one epoch record}, `status` {status}, `end` {status}
    (`error` {code, message} is raised as ApiError by Client.follow)."""

    event: str
    data: dict[str, Any]
    id: str | None


class ArtifactIntegrityError(Exception):
    """A downloaded artifact's size or sha256 is not the listing's; the file was not kept."""


class Client:
    def __init__(self, api_url: str | None = None, api_key: str | None = None, timeout: float = 30.0):
        cfg = load_client_config()
        self.api_url = (api_url or cfg.api_url).rstrip("/")
        key = api_key or cfg.api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.api_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """The JSON object every /v1 route answers with, or ApiError (ApiUnreachable when nothing listens)."""
        try:
            r = self._http.request(method, path, **kw)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ApiUnreachable(self.api_url, exc) from exc
        return self._json_or_raise(r)

    @staticmethod
    def _json_or_raise(r: httpx.Response) -> dict[str, Any]:
        try:
            body = r.json()
        except ValueError:
            body = {"error": {"error": "http", "message": r.text[:500]}}
        if r.status_code >= 400 or not isinstance(body, dict):
            raise ApiError(r.status_code, body)
        return body

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None, retries: int = 3) -> dict[str, Any]:
        """Submit once, even when an answer is lost: every try carries the same Idempotency-Key (one
        is made here when none is given), so a retry after a dropped connection, a timeout or a 502,
        503 or 504 gets the job the first try made (the API replays it), not a second job."""
        key = idempotency_key or f"tj-{uuid.uuid4()}"
        for attempt in range(retries + 1):
            try:
                return self._call("POST", "/v1/jobs", json=spec, headers={"Idempotency-Key": key})
            except ApiUnreachable:
                if attempt == retries:
                    raise
            except httpx.TransportError:  # sent, and the answer lost: the job may exist
                if attempt == retries:
                    raise
            except ApiError as exc:
                if exc.status not in _RETRIED_STATUSES or attempt == retries:
                    raise
            time.sleep(min(4.0, 0.5 * 2 ** attempt))
        raise AssertionError("unreachable")  # the loop returns or raises

    def get(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def list(self, status: builtins.list[str] | None = None, labels: dict[str, str] | None = None, limit: int = 50,
             cursor: str | None = None) -> dict[str, Any]:
        params: builtins.list[tuple[str, str | int]] = [("limit", limit)]
        params += [("status", s) for s in status or []]
        params += [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        if cursor:
            params.append(("cursor", cursor))
        return self._call("GET", "/v1/jobs", params=params)

    def iter_jobs(self, **kw: Any) -> Iterator[dict[str, Any]]:
        cursor = None
        while True:
            page = self.list(cursor=cursor, **kw)
            yield from page["jobs"]
            if not (cursor := page["next_cursor"]):
                return

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def events(self, job_id: str) -> builtins.list[dict[str, Any]]:
        events: builtins.list[dict[str, Any]] = self._call("GET", f"/v1/jobs/{job_id}/events")["events"]
        return events

    def logs(self, job_id: str) -> str:
        """The whole log so far; iter_logs hands it out a page at a time instead."""
        return "".join(self.iter_logs(job_id))

    def iter_logs(self, job_id: str, cursor: str | None = None) -> Iterator[str]:
        """The log so far, one page (at most a MiB) at a time, from `cursor` (a page's end_cursor)."""
        while True:
            params = {"cursor": cursor} if cursor else {}
            page = self._call("GET", f"/v1/jobs/{job_id}/logs", params=params)
            yield str(page["text"])
            if not (cursor := page.get("next_cursor")):  # a server from before pages sends none
                return

    def metrics(self, job_id: str) -> builtins.list[dict[str, Any]]:
        """Per-epoch records so far (loss, accuracy, val_*, examples_per_sec, input_wait_fraction, ...)."""
        epochs = self._call("GET", f"/v1/jobs/{job_id}/metrics").get("epochs")
        if isinstance(epochs, dict):  # an API from before issue 37 answered metrics.json whole under `epochs`
            epochs = epochs.get("history")
        return [e for e in epochs if isinstance(e, dict)] if isinstance(epochs, builtins.list) else []

    def follow(self, job_id: str, what: str, reconnects: int = 5) -> Iterator[StreamEvent]:
        """Server-sent events of `what` ("logs" or "metrics") until the job ends (`end` is the last one).
        A dropped connection is resumed where it stopped (Last-Event-ID), at most `reconnects` times in a
        row. Raises StreamUnsupported at once when the server does not stream."""
        last_id: str | None = None
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_id is not None:
                headers["Last-Event-ID"] = last_id
            try:
                # No read timeout of our own: the server's `: ping` comments keep an idle stream alive,
                # and a silent one for 60 s is treated as dropped.
                with self._http.stream("GET", f"/v1/jobs/{job_id}/{what}", params={"follow": "true"},
                                       headers=headers, timeout=httpx.Timeout(30.0, read=60.0)) as r:
                    if r.status_code >= 400:
                        r.read()
                        self._json_or_raise(r)
                    if not r.headers.get("content-type", "").startswith("text/event-stream"):
                        raise StreamUnsupported(f"{what}?follow=true answered {r.headers.get('content-type')}")
                    for event in parse_sse(r.iter_lines()):
                        failures = 0
                        if event.event == "error":  # the server ends the stream: resuming cannot help
                            code = str(event.data.get("code", "stream"))
                            raise ApiError(401 if code == "key_revoked" else 0, {"error": {
                                "error": code, "message": f"the {what} stream of job {job_id} ended: "
                                                          f"{event.data.get('message', code)}"}})
                        if event.id is not None:
                            last_id = event.id
                        yield event
                        if event.event == "end":
                            return
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if last_id is None:
                    raise ApiUnreachable(self.api_url, exc) from exc
                failures += 1
            except (httpx.ReadError, httpx.ReadTimeout, httpx.RemoteProtocolError):
                failures += 1
            else:
                failures += 1  # the server closed the stream without `end`: resume
            if failures > reconnects:
                raise ApiError(0, {"error": {"error": "stream", "message": f"the {what} stream of job {job_id} "
                                             f"dropped {failures} times in a row"}})
            time.sleep(min(5.0, 0.5 * 2 ** (failures - 1)))

    def artifacts(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}/artifacts")

    def download_artifacts(self, job_id: str, dest: Path) -> builtins.list[Path]:
        """Every artifact into dest, each checked against the size and sha256 the listing gives (the
        job's manifest as the worker kept it): a signed URL reads storage directly, where the object
        may have changed since the job ended. Raises ArtifactIntegrityError and keeps no file then."""
        out = []
        for item in self.artifacts(job_id)["artifacts"]:
            target = (dest / item["path"]).resolve()
            if not target.is_relative_to(dest.resolve()):
                raise ValueError(f"artifact path {item['path']!r} leaves {dest}")
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".part")
            try:
                self._download_checked(item, partial)
                partial.replace(target)
            finally:
                partial.unlink(missing_ok=True)
            out.append(target)
        return out

    def _download_checked(self, item: dict[str, Any], path: Path) -> None:
        url = item["download_url"]
        digest, size = hashlib.sha256(), 0
        # Signed URLs go straight to GCS; API links need our key.
        with (self._http.stream("GET", url) if url.startswith("/") else httpx.stream("GET", url)) as r:
            if r.status_code >= 400:
                r.read()
                self._json_or_raise(r)
            with path.open("wb") as f:
                for chunk in r.iter_bytes(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
                    f.write(chunk)
        if size != item["size"] or digest.hexdigest() != item["sha256"]:
            raise ArtifactIntegrityError(
                f"artifact {item['path']}: got {size} bytes with sha256 {digest.hexdigest()}, expected "
                f"{item['size']} bytes with sha256 {item['sha256']}; it was changed after the job ended")

    def upload_dataset(self, path: Path) -> dict[str, Any]:
        """Upload a dataset file; a folder (an image folder, TFRecord shards) is packed as .tar.gz here,
        on disk, and staging unpacks it: the API takes no host paths, so the data travels."""
        if path.is_dir():
            import tarfile
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                packed = Path(tmp) / "dataset.tar.gz"
                with tarfile.open(packed, "w:gz") as tar:
                    tar.add(path, arcname=path.name)
                return self.upload_dataset(packed)
        with path.open("rb") as f:
            return self._call("POST", "/v1/datasets", files={"file": (path.name, f)}, timeout=None)

    def upload_module(self, path: Path) -> str:
        """Upload model code (a .py file, or a package directory, zipped here); returns the gs:// URI
        to use as model.module or program.source."""
        path = path.resolve()  # a folder given as "." is zipped under its own name
        if path.is_dir():
            import io
            import zipfile

            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                for f in sorted(path.rglob("*")):
                    if f.is_file() and "__pycache__" not in f.parts:
                        zf.write(f, f.relative_to(path.parent).as_posix())
            files = {"file": (f"{path.name}.zip", buf.getvalue())}
            return str(self._call("POST", "/v1/modules", files=files)["module"])
        with path.open("rb") as fh:
            return str(self._call("POST", "/v1/modules", files={"file": (path.name, fh)})["module"])

    def wait(self, job_id: str, timeout: float = 3600, poll: float = 1.0, on_update: Any = None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last = None
        while True:
            job = self.get(job_id)
            if on_update and (job["status"], job.get("progress")) != last:
                on_update(job)
                last = (job["status"], job.get("progress"))
            if job["status"] in TERMINAL:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout:.0f}s")
            time.sleep(poll)

    # --- sweeps (issue 22) ---------------------------------------------------------------------------

    def submit_sweep(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit a sweep spec (trainjobs/spec/sweep.py). Not retried: /v1/sweeps takes no Idempotency-Key,
        so a retry after a lost answer could start a second sweep."""
        return self._call("POST", "/v1/sweeps", json=spec)

    def get_sweep(self, sweep_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/sweeps/{sweep_id}")

    def list_sweeps(self, limit: int = 50) -> builtins.list[dict[str, Any]]:
        """The project's sweeps, newest first."""
        sweeps: builtins.list[dict[str, Any]] = self._call("GET", "/v1/sweeps", params={"limit": limit})["sweeps"]
        return sweeps

    def sweep_trials(self, sweep_id: str) -> builtins.list[dict[str, Any]]:
        """Every trial so far, by number: its parameters, state, objective value and curve, and its job."""
        trials: builtins.list[dict[str, Any]] = self._call("GET", f"/v1/sweeps/{sweep_id}/trials")["trials"]
        return trials

    def cancel_sweep(self, sweep_id: str) -> dict[str, Any]:
        """Ask the sweep to stop (idempotent): it is CANCELLING until its trials' jobs have ended."""
        return self._call("POST", f"/v1/sweeps/{sweep_id}/cancel")

    def wait_sweep(self, sweep_id: str, timeout: float | None = None, poll_s: float = 2.0,
                   on_update: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """The sweep once it is SUCCEEDED, FAILED or CANCELLED; on_update sees each read whose status or
        trial counts changed. Raises TimeoutError after `timeout` seconds (None: waits as long as it runs)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            sweep = self.get_sweep(sweep_id)
            if on_update and (sweep["status"], sweep["trials"]) != last:
                on_update(sweep)
                last = (sweep["status"], sweep["trials"])
            if sweep["status"] in _SWEEP_TERMINAL:
                return sweep
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep {sweep_id} still {sweep['status']} after {timeout:.0f}s")
            time.sleep(poll_s)


def parse_sse(lines: Iterator[str]) -> Iterator[StreamEvent]:
    """text/event-stream lines -> events (the WHATWG format: `event:`, `data:` (joined by newlines),
    `id:`, comments starting with `:`, a blank line ends an event). Data is JSON in our API."""
    event, event_id = "message", None
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                payload = json.loads("\n".join(data))
                yield StreamEvent(event, payload if isinstance(payload, dict) else {"value": payload}, event_id)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue  # a keep-alive comment
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            event_id = value
