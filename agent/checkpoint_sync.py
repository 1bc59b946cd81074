"""A program's checkpoint directory in the job's storage, uploaded as it is written, in whole sets
(issue 37).

The program saves where it likes under its checkpoint directory: Keras' `BackupAndRestore`, a
`tf.train.CheckpointManager`, files of its own. The agent looks at the directory at every turn of its
loop (a stat per file; less often when the directory is large, `scan_every_s`) and uploads what it
holds as soon as it is whole:

- settled: nothing in it changed for SETTLE_S (a save is a burst of writes), or the runtime said it
  saved (`tj.callbacks()`, `tj.checkpoint_saved()`), or the program has exited by itself;
- complete by its writer's own last step (`unfinished`): Keras 3 writes `latest.weights.h5` in place,
  then `training_metadata.json`, so the second must be readable and not older than the first;
  TensorFlow writes a checkpoint's data and index, then the `checkpoint` state file naming it; and no
  save's temporary files (TensorFlow's `<prefix>_temp/`, `.tempstate`, `.tmp`) are newer than
  STALE_TEMP_S.

A directory that changed and has not gone up for TRAINJOBS_PROGRAM_SYNC_S (60) goes up anyway, settled or
not, whole by those rules or not (a file of the program's own may be called `checkpoint`), with a warning.

A set goes up as new objects, `sets/<set>/<path>`, beside those of the last set whose files did not
change, and becomes what a restore reads with one write of `committed.json`, which names every file's
object; the objects no longer named are deleted after it. Files that change while they upload (the
program saved again) void the set: it is not committed. An agent killed mid-upload leaves the last
committed set as it was, and `restore` downloads exactly what `committed.json` names, so the next
attempt never starts from half a save. A program killed by a signal (agent/program.py) gets its last
set uploaded only if it had settled before it died: a file written in its last moments may be cut off.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainjobs import storage

log = logging.getLogger("trainjobs.agent")

COMMITTED = "committed.json"
SETS = "sets"
SETTLE_S = 0.5  # quiet this long after its last write, a directory holds a whole save
STALE_TEMP_S = 60.0  # a save's temporary file older than this is left behind by a dead writer: ignored
MIN_SCAN_S = 0.2  # the agent's loop turn
SCAN_COST_SHARE = 0.02  # the scans' CPU at most this share of one core: a large directory is looked at less often
RETRY_S = 5.0  # after an upload that failed or was voided ...
MAX_RETRY_S = 300.0  # ... doubling after each failure in a row up to this (a name storage refuses fails every time)
MAX_FILES = 20_000  # in a set: committed.json stays under COMMITTED_MAX_BYTES
COMMITTED_MAX_BYTES = 8 << 20
HEAD_BYTES = 1 << 20  # of a `checkpoint` state file or training_metadata.json: theirs hold a few hundred bytes

# Names a save writes aside and renames into place: TensorFlow's sharded save (`ckpt-3_temp/part-...`),
# its bundle writer (`ckpt-3.index.tempstate123`), atomic writes (`checkpoint.tmp<hex>`), Orbax's
# `.orbax-checkpoint-tmp-*`. Never uploaded; a fresh one means a save is under way.
_TEMPORARY = re.compile(r"(_temp$|\.tempstate|\.tmp|-tmp-)")
_TF_STATE = "checkpoint"  # tf.train.CheckpointManager's (and tf_keras BackupAndRestore's) state file
_TF_LATEST = re.compile(r'^model_checkpoint_path:\s*"([^"]*)"', re.M)
_KERAS_METADATA, _KERAS_WEIGHTS = "training_metadata.json", "latest.weights.h5"


def sync_every_s() -> float:
    """TRAINJOBS_PROGRAM_SYNC_S: the longest a changed directory that never settles waits for an upload."""
    try:
        return float(os.environ.get("TRAINJOBS_PROGRAM_SYNC_S") or 60.0)
    except ValueError:
        return 60.0


@dataclass(frozen=True)
class Scan:
    files: dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns): what a set is made of
    newest_ns: int  # the latest change seen: files, temporaries and folders (a rename or delete in one)
    temporaries: dict[str, int]  # relative path -> mtime_ns of what a save writes aside

    def settled_at(self, t: float) -> bool:
        return self.newest_ns <= (t - SETTLE_S) * 1e9


def scan(root: Path) -> Scan:
    """Every regular file under root (a link only where it stays inside, as storage.local_files), with
    its size and modification time; one stat each."""
    files: dict[str, tuple[int, int]] = {}
    temporaries: dict[str, int] = {}
    newest = 0
    resolved = root.resolve()
    stack = [(root, "")]
    while stack:
        folder, rel_folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
            newest = max(newest, os.stat(folder).st_mtime_ns)
        except OSError:
            continue  # removed while we looked (a save's temporary folder), or the program made it unreadable
        for entry in entries:
            rel = f"{rel_folder}{entry.name}"
            try:
                if entry.is_symlink() and not Path(entry.path).resolve().is_relative_to(resolved):
                    continue
                if entry.is_dir():
                    if not entry.is_symlink():
                        stack.append((Path(entry.path), rel + "/"))
                    continue
                st = entry.stat()
            except (OSError, RuntimeError):  # RuntimeError: a link in a loop (Path.resolve, Python < 3.13)
                continue
            if not stat.S_ISREG(st.st_mode):  # a named pipe or socket: opened to upload, it would block the agent
                continue
            newest = max(newest, st.st_mtime_ns)
            if _TEMPORARY.search(entry.name) or any(_TEMPORARY.search(p) for p in rel.split("/")[:-1]):
                temporaries[rel] = st.st_mtime_ns
            else:
                files[rel] = (st.st_size, st.st_mtime_ns)
    return Scan(files, newest, temporaries)


def unfinished(root: Path, found: Scan, now: float) -> str | None:
    """Why the files found are not a whole save by their writers' own order, or None."""
    for rel, mtime in found.temporaries.items():
        if mtime > (now - STALE_TEMP_S) * 1e9:
            return f"{rel} is a save's temporary file"
    for rel, (_, mtime) in found.files.items():
        folder, _, name = rel.rpartition("/")
        prefix = f"{folder}/" if folder else ""
        if name == _KERAS_METADATA:
            weights = found.files.get(prefix + _KERAS_WEIGHTS)
            if weights is not None and weights[1] > mtime:
                return f"{prefix}{_KERAS_WEIGHTS} is newer than {rel}"
            try:
                epoch = json.loads(_head(root / rel)).get("epoch")
            except (OSError, ValueError, AttributeError, RecursionError):
                epoch = None
            if not isinstance(epoch, int):
                return f"{rel} is not readable yet"
        elif name == _TF_STATE:
            try:
                latest = _TF_LATEST.search(_head(root / rel).decode(errors="replace"))
            except OSError:
                latest = None
            if latest is None:
                return f"{rel} names no checkpoint yet"
            ckpt = prefix + latest.group(1).replace("\\", "/").rsplit("/", 1)[-1]
            index = found.files.get(f"{ckpt}.index")
            if index is None or index[1] > mtime or not any(f.startswith(f"{ckpt}.data-") for f in found.files):
                return f"{rel} names {ckpt}, whose files are not all there"
    return None


def _head(path: Path) -> bytes:
    """The start of a writer's small file, HEAD_BYTES at most: a file of the program's own by that name
    may be gigabytes, read at every look."""
    with path.open("rb") as f:
        return f.read(HEAD_BYTES)


class CheckpointWatch:
    """The chief's watch over the program's checkpoint directory (`upload=False` on the other hosts:
    each writes its own, and only the chief's is kept). `committed` is what `restore` found."""

    def __init__(self, local: Path, remote: str, *, upload: bool, attempt: int, committed: dict[str, Any] | None):
        self.local, self.remote, self.upload, self.attempt = local, remote.rstrip("/"), upload, attempt
        committed_files = (committed or {}).get("files", {})
        # What is in storage: relative path -> (size, mtime_ns of the local file it came from, object).
        self._stored: dict[str, tuple[int, int, str]] = {}
        for rel, (size, mtime) in (scan(local).files.items() if committed_files else ()):
            if rel in committed_files:  # just downloaded: unchanged since
                self._stored[rel] = (size, mtime, committed_files[rel]["object"])
        self._sets = 0
        self._next_scan = 0.0
        self._changed_since: float | None = None  # when the directory first differed from storage
        self._not_before = 0.0  # after a failed or voided upload
        self._failures = 0  # uploads failed in a row
        self.commits = 0

    # --- the agent's loop ---

    def turn(self, *, saved: bool = False) -> None:
        """A turn of the agent's loop while the program runs: look if it is time, upload if whole.
        `saved`: the runtime just said a save is complete (look now, no need to wait for quiet)."""
        now = time.monotonic()
        if not self.upload or (now < self._next_scan and not saved) or now < self._not_before:
            return
        try:
            self._turn(now, saved)
        except Exception as exc:  # whatever the program did to its directory, the job goes on
            log.warning("could not look at the program's checkpoint directory: %s", exc)
            self._not_before = now + RETRY_S

    def _turn(self, now: float, saved: bool) -> None:
        started = time.thread_time()  # this thread's CPU: the heartbeat's and the output pump's are not the scan's
        found = scan(self.local)
        # A large directory is looked at less often: its scans' CPU stays under SCAN_COST_SHARE of a core.
        self._next_scan = now + max(MIN_SCAN_S, (time.thread_time() - started) / SCAN_COST_SHARE)
        if not self._differs(found):
            self._changed_since = None
            return
        if self._changed_since is None:
            self._changed_since = now
        overdue = now - self._changed_since >= sync_every_s()
        if saved or overdue or found.settled_at(time.time()):
            self._commit(found, why="saved" if saved else "overdue" if overdue else "settled", overdue=overdue)

    def last(self, *, alive_until: float | None) -> None:
        """After the program ended. `alive_until`: None if it exited by itself (nothing writes any
        more); else the last time.time() it was seen running (killed): a set that had not settled by
        then may hold a file cut off mid-write, and the last committed set stays."""
        if not self.upload:
            return
        try:
            found = scan(self.local)
        except Exception as exc:
            log.warning("could not look at the program's checkpoint directory: %s", exc)
            return
        if not self._differs(found):
            return
        if alive_until is not None and not found.settled_at(alive_until):
            log.warning("the program's checkpoint directory changed in its last %.1fs: not uploaded (the "
                        "last whole set uploaded stays)", SETTLE_S)
            return
        self._commit(found, why="final")

    # --- committing a set ---

    def _differs(self, found: Scan) -> bool:
        return found.files.keys() != self._stored.keys() or any(
            self._stored[rel][:2] != state for rel, state in found.files.items())

    def _commit(self, found: Scan, why: str, overdue: bool = False) -> None:
        now = time.monotonic()
        if (reason := unfinished(self.local, found, time.time())) is not None:
            if not overdue:
                log.debug("checkpoint directory not uploaded yet: %s", reason)
                return
            log.warning("the checkpoint directory changed %.0fs ago and has not been whole since (%s): uploading "
                        "it as it is", sync_every_s(), reason)
        if len(found.files) > MAX_FILES:
            log.warning("the checkpoint directory holds %d files, over the %d a set may have: not uploaded",
                        len(found.files), MAX_FILES)
            self._not_before = now + sync_every_s()
            return
        self._sets += 1
        set_id = f"a{self.attempt}-{self._sets:06d}"
        changed = [rel for rel, state in found.files.items()
                   if rel not in self._stored or self._stored[rel][:2] != state]
        new = {rel: f"{SETS}/{set_id}/{rel}" for rel in changed}
        objects = {rel: new.get(rel) or self._stored[rel][2] for rel in found.files}
        files = {rel: {"object": objects[rel], "size": found.files[rel][0]} for rel in sorted(found.files)}
        if (size := len(json.dumps(files))) > COMMITTED_MAX_BYTES - 1024:  # what restore reads, with room for the rest
            log.warning("the checkpoint directory's %d file names take %d bytes in committed.json, over the %d a "
                        "restore reads: not uploaded (the last whole set uploaded stays)", len(files), size,
                        COMMITTED_MAX_BYTES)
            self._not_before = now + sync_every_s()
            return
        try:
            self._upload(new)
            if scan(self.local).files != found.files:  # written again while it uploaded: not one save
                log.info("checkpoint set %s changed while it uploaded: left for the next one", set_id)
                self._delete(new.values())
                self._not_before = now + min(RETRY_S, sync_every_s())
                return
            storage.write_json(f"{self.remote}/{COMMITTED}", {
                "set": set_id, "attempt": self.attempt, "committed_at": datetime.now(timezone.utc).isoformat(),
                "files": files,
            })
        except Exception as exc:  # a later turn tries again; the job goes on
            self._failures += 1
            wait = min(RETRY_S * 2 ** (self._failures - 1), MAX_RETRY_S)
            log.warning("could not upload the program's checkpoints (%d time(s) in a row; next try in %.0fs): %s",
                        self._failures, wait, exc)
            self._delete(new.values())
            self._not_before = now + wait
            return
        self._failures = 0
        gone = {obj for _, _, obj in self._stored.values()} - set(objects.values())
        self._stored = {rel: (*found.files[rel], objects[rel]) for rel in found.files}
        self._changed_since = None
        self.commits += 1
        log.info("checkpoint set %s uploaded (%s): %d file(s), %d new", set_id, why, len(found.files), len(new))
        self._delete(gone)

    def _upload(self, objects: dict[str, str]) -> None:
        if not objects:
            return
        from google.cloud.storage import transfer_manager

        pairs = [(str(self.local / rel), storage.blob(f"{self.remote}/{obj}")) for rel, obj in objects.items()]
        transfer_manager.upload_many(pairs, max_workers=8, worker_type=transfer_manager.THREAD, raise_exception=True)

    def _delete(self, objects: Any) -> None:
        for obj in objects:
            try:
                storage.blob(f"{self.remote}/{obj}").delete()
            except Exception:  # an object left over costs storage, nothing else: the next start removes it
                pass


def restore(remote: str, local: Path, *, clean: bool) -> tuple[list[Path], dict[str, Any] | None]:
    """The last committed set of the job's checkpoints, downloaded into `local`: (its files, what
    committed.json said). `clean` (the chief): objects no set names are deleted (an upload an
    earlier attempt was killed in)."""
    from google.api_core.exceptions import NotFound

    remote = remote.rstrip("/")
    for _ in range(3):  # a set committed meanwhile (an earlier attempt's agent not stopped yet) deletes objects
        committed = _committed(remote, local)
        if committed is None:
            if clean:
                _delete_unnamed(remote, None)
            return [], None
        try:
            paths = _download(remote, local, committed)
        except NotFound:
            log.warning("a checkpoint object went while it was restored; reading committed.json again")
            shutil.rmtree(local, ignore_errors=True)  # none of the voided set's files stays
            local.mkdir(parents=True, exist_ok=True)
            continue
        if clean:
            _delete_unnamed(remote, committed)
        return paths, committed
    log.error("the job's checkpoints changed during three restores: the program starts without one")
    return [], None


def _committed(remote: str, local: Path) -> dict[str, Any] | None:
    """committed.json, checked: the program can write its job's storage, so a name in it that would land
    outside `local`, or an object outside sets/, is refused as a whole."""
    try:
        doc = storage.read_json_bounded(f"{remote}/{COMMITTED}", COMMITTED_MAX_BYTES)
    except (ValueError, RecursionError, storage.ObjectTooLarge) as exc:  # RecursionError: JSON nested too deep
        log.error("the job's committed.json cannot be read (%s): the program starts without a checkpoint", exc)
        return None
    if doc is None:
        return None
    files = doc.get("files") if isinstance(doc, dict) else None
    if (not isinstance(files, dict) or len(files) > MAX_FILES or not _plain_names(list(files))
            or storage.restorable(list(files), local) != list(files)
            or not all(isinstance(f, dict) and isinstance(o := f.get("object"), str) and o.startswith(f"{SETS}/")
                       and ".." not in o.split("/") for f in files.values())):
        log.error("the job's committed.json is not one the agent wrote: the program starts without a checkpoint")
        return None
    return dict(doc)


def _plain_names(names: list[str]) -> bool:
    """Each a file's path as scan() gives it ('a/b', no '', '.' or '..' part), and none also a folder of
    another: '.' or 'x/..' would be the directory itself, 'a' beside 'a/b' a file where a folder goes."""
    parts = [name.split("/") for name in names]
    folders = {"/".join(p[:i]) for p in parts for i in range(1, len(p))}
    return all(s not in ("", ".", "..") for p in parts for s in p) and folders.isdisjoint(names)


def _download(remote: str, local: Path, committed: dict[str, Any]) -> list[Path]:
    from google.cloud.storage import transfer_manager

    files: dict[str, dict[str, Any]] = committed["files"]
    paths = [local / rel for rel in files]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    pairs = [(storage.blob(f"{remote}/{f['object']}"), str(local / rel)) for rel, f in files.items()]
    if pairs:
        transfer_manager.download_many(pairs, max_workers=8, worker_type=transfer_manager.THREAD,
                                       raise_exception=True)
    return paths


def _delete_unnamed(remote: str, committed: dict[str, Any] | None) -> None:
    named = {f"{remote}/{f['object']}" for f in (committed or {}).get("files", {}).values()}
    try:
        for uri in storage.list_uris(f"{remote}/{SETS}/"):
            if uri not in named:
                storage.blob(uri).delete()
    except Exception as exc:  # left over: costs storage only, and the next start tries again
        log.warning("could not remove checkpoint objects no set names: %s", exc)


def read_committed(remote: str, rel: str) -> bytes | None:
    """One file of the last committed set, as stored (for tests and tools); None if the set lacks it."""
    doc = storage.read_json(f"{remote.rstrip('/')}/{COMMITTED}") or {}
    entry = doc.get("files", {}).get(rel)
    return None if entry is None else bytes(storage.blob(f"{remote.rstrip('/')}/{entry['object']}").download_as_bytes())

