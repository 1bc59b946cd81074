"""When a program's checkpoint directory holds a whole save (agent/checkpoint_sync.py, issue 37): the files
are laid out as Keras' BackupAndRestore and TensorFlow's CheckpointManager leave them at each step of a
save, with the modification times they would have. The same rules over real saves and storage:
tests/integration/test_checkpoint_sets.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent.checkpoint_sync import SETTLE_S, STALE_TEMP_S, scan, unfinished


def _write(root: Path, rel: str, data: str, at: float) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data)
    os.utime(path, (at, at))


T = time.time() - 100  # every save below happened well before now: settled


KERAS_DONE = [("backup/latest.weights.h5", "w" * 100, T), ("backup/training_metadata.json", '{"epoch": 2, "batch": 0}', T + 0.01)]
TF_DONE = [("ckpt-3.data-00000-of-00001", "d" * 100, T), ("ckpt-3.index", "i", T + 0.01),
           ("checkpoint", 'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-3"\n', T + 0.02)]


@pytest.mark.parametrize(("files", "why"), [
    (KERAS_DONE, None),
    # Keras writes the weights in place, then the metadata: weights newer than the metadata are the next save, under way.
    ([KERAS_DONE[1], ("backup/latest.weights.h5", "w" * 50, T + 1)], "latest.weights.h5 is newer than"),
    ([KERAS_DONE[0], ("backup/training_metadata.json", '{"epo', T + 1)], "is not readable yet"),  # cut off mid-write
    (TF_DONE, None),
    # TensorFlow's state file names a checkpoint whose index is not there yet, or newer than it.
    ([TF_DONE[0], TF_DONE[2]], "whose files are not all there"),
    ([TF_DONE[0], ("ckpt-3.index", "i", T + 1), TF_DONE[2]], "whose files are not all there"),
    ([("checkpoint", "", T)], "names no checkpoint yet"),
    # A sharded save in progress, and the atomic writes' temporaries: a save is under way.
    (TF_DONE + [("ckpt-4_temp/part-00000-of-00001.data-00000-of-00001", "d", time.time())], "temporary"),
    (TF_DONE + [("ckpt-4.index.tempstate1234", "i", time.time())], "temporary"),
    # ... unless it was left by a writer that died long ago.
    (TF_DONE + [("ckpt-4.index.tempstate1234", "i", time.time() - STALE_TEMP_S - 1)], None),
    # Files of the program's own: whole once settled.
    ([("history.csv", "epoch,loss\n0,1.0\n", T), ("notes/model.keras", "zip", T)], None),
], ids=["keras saved", "keras writing its weights", "keras metadata cut off", "tf saved", "tf index missing",
        "tf index newer than its state", "tf state empty", "tf sharded save under way", "tf bundle being written",
        "a stale temporary", "files of its own"])
def test_a_save_counts_as_whole_only_once_its_writer_took_its_last_step(
        tmp_path: Path, files: list[tuple[str, str, float]], why: str | None) -> None:
    for rel, data, at in files:
        _write(tmp_path, rel, data, at)
    found = scan(tmp_path)
    reason = unfinished(tmp_path, found, time.time())
    assert (reason is None) if why is None else (reason is not None and why in reason), reason
    assert not any("temp" in rel for rel in found.files)  # a save's temporaries never go up


def test_a_directory_settles_once_nothing_in_it_changed_for_a_moment(tmp_path: Path) -> None:
    _write(tmp_path, "a/latest.weights.h5", "w", T)
    for folder in (tmp_path / "a", tmp_path):  # made just now, as its save was
        os.utime(folder, (T, T))
    found = scan(tmp_path)
    assert found.settled_at(time.time())
    (tmp_path / "a" / "old").touch()
    (tmp_path / "a" / "old").unlink()  # a removal changes only its folder
    found = scan(tmp_path)
    assert not found.settled_at(time.time()) and found.settled_at(time.time() + SETTLE_S + 0.1)
    assert set(found.files) == {"a/latest.weights.h5"}


def test_a_link_out_of_the_directory_is_not_part_of_a_set(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _write(root, "w.h5", "w", T)
    (tmp_path / "secret").write_text("s")
    (root / "leak").symlink_to(tmp_path / "secret")
    (root / "inside").symlink_to(root / "w.h5")
    assert set(scan(root).files) == {"w.h5", "inside"}


def test_a_named_pipe_or_socket_is_not_part_of_a_set(tmp_path: Path) -> None:
    import socket

    _write(tmp_path, "w.h5", "w", T)
    os.mkfifo(tmp_path / "pipe")  # opened to upload, a pipe no one writes blocks the agent's loop for good
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock"))
        assert set(scan(tmp_path).files) == {"w.h5"}


def test_a_link_in_a_loop_is_left_out_and_the_rest_is_a_set(tmp_path: Path) -> None:
    _write(tmp_path, "w.h5", "w", T)
    (tmp_path / "loop").symlink_to("loop")  # every look at the directory failed, and no save went up again
    assert set(scan(tmp_path).files) == {"w.h5"}


def test_a_large_file_of_the_programs_own_called_checkpoint_is_not_read_whole(tmp_path: Path) -> None:
    import tracemalloc

    with open(tmp_path / "checkpoint", "wb") as f:  # its own single-file save, by TensorFlow's state file's name
        f.truncate(64 << 20)  # sparse: no disk
    found = scan(tmp_path)
    tracemalloc.start()
    try:
        reason = unfinished(tmp_path, found, time.time())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reason is not None and "names no checkpoint" in reason
    assert peak < 8 << 20, peak  # read at every look: the agent held it whole in memory (twice, decoded)
