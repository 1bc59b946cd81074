"""Per-epoch scalars as TensorBoard event files, written locally and mirrored to <job-dir>/tensorboard/.

tf.summary.scalar lives in the tensorboard package, which the agent does not need to train (TF 2.21
raises TBNotInstalledError without it), so this writes the same record itself: tf.summary.write
with the scalars plugin's metadata, which TensorBoard reads as an ordinary scalar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainjobs import storage


NOT_SCALARS = ("epoch", "attempt")  # the step and a label, not curves


class ScalarLog:
    def __init__(self, local_dir: Path, remote: str):
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        self.local_dir, self.remote = local_dir, remote
        local_dir.mkdir(parents=True, exist_ok=True)
        self._writer = tf.summary.create_file_writer(str(local_dir))
        self._metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
        ).SerializeToString()

    def write(self, step: int, scalars: dict[str, Any]) -> None:
        import tensorflow as tf

        with self._writer.as_default():
            for tag, value in scalars.items():
                if isinstance(value, (int, float)) and tag not in NOT_SCALARS:
                    tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step, metadata=self._metadata)
        self._writer.flush()

    def upload(self) -> None:
        storage.upload_dir(self.local_dir, self.remote)

    def close(self) -> None:
        self._writer.close()
