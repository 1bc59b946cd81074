"""A program's checkpoint directory in storage as whole sets (agent/checkpoint_sync.py, issue 37), against the
GCS emulator through the real client: a restore gets exactly the last set committed, whatever an agent was
killed in the middle of; real Keras and TensorFlow saves count as whole when their writers are done."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from agent import checkpoint_sync
from agent.checkpoint_sync import COMMITTED, MIN_SCAN_S, SETS, CheckpointWatch, read_committed, restore, scan, unfinished
from trainjobs import storage


def _remote(bucket: str) -> str:
    return f"gs://{bucket}/jobs/j1/checkpoints"


def _save(root: Path, epoch: int) -> dict[str, bytes]:
    """A save as Keras' BackupAndRestore makes it: the weights, then the metadata saying which epoch."""
    (root / "backup").mkdir(parents=True, exist_ok=True)
    files = {"backup/latest.weights.h5": f"weights after epoch {epoch}".encode() * 100,
             "backup/training_metadata.json": f'{{"epoch": {epoch}, "batch": 0}}'.encode()}
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    return files


def _settle(root: Path) -> None:
    """The directory as a moment after its last save (every modification time 10 s back: SETTLE_S is 0.5 s),
    at the agent's next loop turn."""
    back = time.time() - 10
    for path in [root, *root.rglob("*")]:
        os.utime(path, (back, back), follow_symlinks=False)
    time.sleep(MIN_SCAN_S)


def _restored(bucket: str, tmp_path: Path, name: str) -> dict[str, bytes]:
    local = tmp_path / name
    paths, _ = restore(_remote(bucket), local, clean=True)
    return {p.relative_to(local).as_posix(): p.read_bytes() for p in paths}


class Killed(BaseException):
    """The agent killed: nothing after the moment it strikes runs."""


def test_an_agent_killed_mid_upload_leaves_the_last_whole_set_to_restore(bucket: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    local = tmp_path / "program"
    watch = CheckpointWatch(local, _remote(bucket), upload=True, attempt=1, committed=None)
    first = _save(local, 1)
    _settle(local)
    watch.turn()
    assert watch.commits == 1
    _save(local, 2)
    _settle(local)
    real_upload = CheckpointWatch._upload

    def killed_after_uploading(self: CheckpointWatch, objects: dict[str, str]) -> None:
        real_upload(self, objects)  # epoch 2's files are up, committed.json still names epoch 1's
        raise Killed()

    monkeypatch.setattr(CheckpointWatch, "_upload", killed_after_uploading)
    with pytest.raises(Killed):
        watch.turn()
    assert _restored(bucket, tmp_path, "attempt-2") == first
    # The killed upload's objects are gone once the next attempt's chief restored.
    named = {f"{_remote(bucket)}/{f['object']}" for f in storage.read_json(f"{_remote(bucket)}/{COMMITTED}")["files"].values()}
    assert set(storage.list_uris(f"{_remote(bucket)}/{SETS}/")) == named


def test_a_save_written_while_it_uploads_is_left_for_the_next_set(bucket: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    local = tmp_path / "program"
    watch = CheckpointWatch(local, _remote(bucket), upload=True, attempt=1, committed=None)
    _save(local, 1)
    _settle(local)
    real_upload = CheckpointWatch._upload

    def program_saves_meanwhile(self: CheckpointWatch, objects: dict[str, str]) -> None:
        real_upload(self, objects)
        monkeypatch.setattr(CheckpointWatch, "_upload", real_upload)
        (local / "backup" / "latest.weights.h5").write_bytes(b"weights half-way through epoch 2")

    monkeypatch.setattr(CheckpointWatch, "_upload", program_saves_meanwhile)
    watch.turn()
    assert watch.commits == 0 and storage.read_json(f"{_remote(bucket)}/{COMMITTED}") is None
    assert storage.list_uris(f"{_remote(bucket)}/{SETS}/") == []  # the voided set's objects went
    second = _save(local, 2)
    _settle(local)
    watch._not_before = 0.0  # past the wait after a voided set
    watch.turn()
    assert _restored(bucket, tmp_path, "attempt-2") == second


def test_a_killed_programs_last_unsettled_write_is_not_uploaded_and_one_that_exited_is(bucket: str, tmp_path: Path) -> None:
    local = tmp_path / "program"
    watch = CheckpointWatch(local, _remote(bucket), upload=True, attempt=1, committed=None)
    first = _save(local, 1)
    _settle(local)
    watch.turn()
    _save(local, 2)
    watch.last(alive_until=time.time())  # killed just after writing: a file may be cut off
    assert _restored(bucket, tmp_path, "after-kill") == first
    watch.last(alive_until=None)  # exited by itself: its files are as it left them
    assert read_committed(_remote(bucket), "backup/training_metadata.json") == b'{"epoch": 2, "batch": 0}'


def test_the_next_attempt_uploads_only_what_changed_and_removed_files_leave_the_set(bucket: str, tmp_path: Path) -> None:
    local = tmp_path / "program"
    watch = CheckpointWatch(local, _remote(bucket), upload=True, attempt=1, committed=None)
    _save(local, 1)
    (local / "history.csv").write_text("epoch,loss\n0,1.0\n")
    _settle(local)
    watch.turn()
    again = tmp_path / "attempt-2"
    paths, committed = restore(_remote(bucket), again, clean=True)
    heir = CheckpointWatch(again, _remote(bucket), upload=True, attempt=2, committed=committed)
    heir.turn()
    assert heir.commits == 0  # what it restored is what is stored
    (again / "history.csv").unlink()
    _save(again, 2)
    _settle(again)
    heir.turn()
    doc: dict[str, Any] = storage.read_json(f"{_remote(bucket)}/{COMMITTED}")
    assert set(doc["files"]) == {"backup/latest.weights.h5", "backup/training_metadata.json"}
    assert all(f["object"].startswith(f"{SETS}/a2-") for f in doc["files"].values())
    assert len(storage.list_uris(f"{_remote(bucket)}/{SETS}/")) == 2


def test_a_directory_never_whole_by_the_writers_rules_still_goes_up_once_overdue(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINJOBS_PROGRAM_SYNC_S", "1")
    local = tmp_path / "program"
    local.mkdir()
    (local / "checkpoint").write_text("epoch=3\n")  # the program's own file, not TensorFlow's state file
    _settle(local)
    watch = CheckpointWatch(local, _remote(bucket), upload=True, attempt=1, committed=None)
    watch.turn()
    assert watch.commits == 0
    time.sleep(1.1)  # TRAINJOBS_PROGRAM_SYNC_S
    watch.turn()
    assert read_committed(_remote(bucket), "checkpoint") == b"epoch=3\n"


def test_a_committed_json_naming_files_outside_the_directory_restores_nothing(bucket: str, tmp_path: Path) -> None:
    storage.write_json(f"{_remote(bucket)}/{COMMITTED}", {"files": {"../../.bashrc": {"object": f"{SETS}/x/y"}}})
    assert restore(_remote(bucket), tmp_path / "p", clean=False) == ([], None)
    assert not (tmp_path / ".bashrc").exists()


@pytest.mark.tf
def test_keras_backup_and_restore_and_a_checkpoint_manager_saves_go_up_whole_and_restore(bucket: str, tmp_path: Path) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    local = tmp_path / "program"
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")

    class StopAfterTwo(keras.callbacks.Callback):  # the docs' InterruptingCallback: fit ends, the backup stays
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if epoch == 2:
                raise RuntimeError("Interrupting!")

    with pytest.raises(RuntimeError):
        model.fit(x, y, epochs=5, verbose=0,
                  callbacks=[keras.callbacks.BackupAndRestore(str(local / "backup")), StopAfterTwo()])
    step = tf.Variable(7)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), str(local / "tf"), max_to_keep=2)
    for _ in range(3):
        manager.save()
    found = scan(local)
    assert unfinished(local, found, time.time()) is None, found
    watch = CheckpointWatch(local, _remote(bucket), upload=True, attempt=1, committed=None)
    watch.last(alive_until=None)
    again = tmp_path / "attempt-2"
    restore(_remote(bucket), again, clean=True)
    assert {p.relative_to(again).as_posix() for p in again.rglob("*") if p.is_file()} == set(found.files)
    # Each restores as its writer reads it: fit goes on at epoch 3, the manager finds its last save.
    resumed = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    resumed.compile(optimizer="adam", loss="mse")
    history = resumed.fit(x, y, epochs=5, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(str(again / "backup"))])
    assert len(history.history["loss"]) == 3
    assert tf.train.CheckpointManager(tf.train.Checkpoint(step=tf.Variable(0)), str(again / "tf"), 2).latest_checkpoint \
        == str(again / "tf" / "ckpt-3")


@pytest.mark.parametrize("files", [
    {".": {"object": f"{SETS}/x/y"}},  # the directory itself
    {"x/..": {"object": f"{SETS}/x/y"}},
    {"a": {"object": f"{SETS}/x/y"}, "a/b": {"object": f"{SETS}/x/y"}},  # a file where a folder goes
    {"a//b": {"object": f"{SETS}/x/y"}},
    "[" * 100_000,  # nested past the parser's depth
], ids=["dot", "dot-dot inside", "file and folder", "empty part", "deep"])
def test_a_committed_json_the_agent_could_not_have_written_is_refused_as_a_whole(bucket: str, tmp_path: Path,
                                                                                 files: Any) -> None:
    storage.blob(f"{_remote(bucket)}/{SETS}/x/y").upload_from_string(b"the program's own object")
    if isinstance(files, str):
        storage.blob(f"{_remote(bucket)}/{COMMITTED}").upload_from_string(files)
    else:
        storage.write_json(f"{_remote(bucket)}/{COMMITTED}", {"files": files})
    local = tmp_path / "p"
    local.mkdir()  # as the agent makes it before restoring

    assert restore(_remote(bucket), local, clean=False) == ([], None)  # the program starts without a checkpoint
    assert local.is_dir() and list(local.iterdir()) == []


def test_a_set_whose_committed_json_a_restore_would_refuse_is_not_committed(bucket: str, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(checkpoint_sync, "COMMITTED_MAX_BYTES", 4096)  # as 8 MiB is to ~20,000 long names
    local = tmp_path / "program"
    watch = CheckpointWatch(local, _remote(bucket), upload=True, attempt=1, committed=None)
    first = _save(local, 1)
    _settle(local)
    watch.turn()
    for i in range(40):  # files of the program's own, with long names
        (local / "shards" / f"{i:03d}").mkdir(parents=True)
        (local / "shards" / f"{i:03d}" / ("part-" + "x" * 60)).write_bytes(b"s")
    watch.last(alive_until=None)
    # Committed, the set's committed.json would be refused by the restore, which then restores nothing at all.
    assert _restored(bucket, tmp_path, "attempt-2") == first


def test_uploads_that_keep_failing_are_tried_less_and_less_often_and_a_success_resets_it(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A file name storage refuses (a newline in it, over 1,024 bytes) fails every upload: tried every
    # 5 s for the whole run, each try uploaded and deleted the rest of the set again.
    local = tmp_path / "program"
    watch = CheckpointWatch(local, _remote(bucket), upload=True, attempt=1, committed=None)
    _save(local, 1)
    _settle(local)
    real_upload = CheckpointWatch._upload

    def refused(self: CheckpointWatch, objects: dict[str, str]) -> None:
        raise OSError("400 the object name is not valid")

    monkeypatch.setattr(CheckpointWatch, "_upload", refused)
    waits = []
    for _ in range(8):
        before = time.monotonic()
        watch._not_before = 0.0  # the turn comes: how long it then puts the next one off
        watch.turn(saved=True)
        waits.append(watch._not_before - before)
    assert watch.commits == 0
    assert all(later > earlier for earlier, later in zip(waits[:6], waits[1:7])), waits
    assert waits[-1] == pytest.approx(checkpoint_sync.MAX_RETRY_S, abs=1.0), waits
    monkeypatch.setattr(CheckpointWatch, "_upload", real_upload)
    watch._not_before = 0.0
    watch.turn(saved=True)
    assert watch.commits == 1
    _save(local, 2)
    monkeypatch.setattr(CheckpointWatch, "_upload", refused)
    before = time.monotonic()
    watch.turn(saved=True)
    assert watch._not_before - before == pytest.approx(checkpoint_sync.RETRY_S, abs=1.0)  # counted afresh
