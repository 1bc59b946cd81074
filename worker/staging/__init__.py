"""Dataset staging: the worker turns whatever a job names as its data into sharded TFRecords in GCS,
which the agent on the accelerator machine downloads and trains on.

    gs://BUCKET/datasets/<sha256>/manifest.json                          (manifest.py)
    gs://BUCKET/datasets/<sha256>/shards/train-00000-of-0000N.tfrecord   (example_proto.py)
    gs://BUCKET/datasets/<sha256>/shards/validation-00000-of-0000M.tfrecord

The folder is content-addressed (content_hash.py), so staging the same data twice uploads nothing.
Sources: sources.py and gcs_source.py; formats: formats.py; label rules: examples.py.
TensorFlow is never imported here: the worker stays light, TFRecords are written by hand.
"""

from worker.staging.errors import DatasetError
from worker.staging.stage import StagedDataset, stage_dataset

__all__ = ["DatasetError", "StagedDataset", "stage_dataset"]
