"""The directories the agent uploads from a machine hold what the job's code wrote, and that code is
hostile (issue 20: a program writes its model and checkpoint directories itself): a link out of the
directory is not followed, so no file of the machine's leaves with the job's artifacts or checkpoints.
Down, object names with '..': tests/unit/test_program_parts.py (the emulator cannot store them). The
same attack from a program job's own code, through the whole product: tests/e2e/test_programs.py."""

from __future__ import annotations

import os
from pathlib import Path

from trainjobs import storage


def test_a_link_out_of_an_uploaded_directory_is_left_behind_and_one_inside_is_a_file(
        bucket: str, tmp_path: Path) -> None:
    outside = tmp_path / "machine" / "secret.txt"
    outside.parent.mkdir()
    outside.write_text("the machine's")
    model = tmp_path / "model"
    (model / "variables").mkdir(parents=True)
    (model / "variables" / "data").write_bytes(b"weights")
    os.symlink(outside, model / "leak.txt")
    os.symlink(outside.parent, model / "machine")  # a whole folder of it
    os.symlink("variables/data", model / "alias")

    assert [p.relative_to(model).as_posix() for p in storage.local_files(model)] == ["alias", "variables/data"]
    uploaded = storage.upload_dir(model, f"gs://{bucket}/jobs/j/artifacts")

    assert sorted(uploaded) == [f"gs://{bucket}/jobs/j/artifacts/alias", f"gs://{bucket}/jobs/j/artifacts/variables/data"]
    assert storage.blob(f"gs://{bucket}/jobs/j/artifacts/alias").download_as_bytes() == b"weights"
