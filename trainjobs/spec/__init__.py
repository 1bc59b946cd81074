"""The job spec: what a user asks for, validated before anything is stored or paid for.

Imports only Pydantic and the core's tables (the catalogue, the model table, the TPU runtimes), so the
API, the worker and the agent on the accelerator VM share it. Every contradiction we can see at submit
time is rejected here with the field that is wrong (`loc`) and the reason, so a job never fails later for
a reason we could have checked.

One module per section of the spec, what is declared apart from what follows from it:
    strict.py        what every section shares: strict fields, storable values, stored specs read leniently
    accelerator.py   spec.accelerator (TPU, GPU, CPU)
    dataset.py       spec.dataset and each format's options
    model.py         spec.model (the model table itself: trainjobs/model_params.py)
    program.py       spec.program: the user's own training program (excludes model)
    training.py      spec.training: epochs, batch, optimizer, learning rate, checkpoints
    export.py        spec.export
    limits.py        spec.limits
    labels.py        spec.labels (GCP's label rules)
    distribution.py  strategy, precision and workers against the accelerator, the batch over the replicas
    job.py           JobSpec, SPEC_VERSION, parse_stored
    derived.py       what follows from a spec: strategy, replicas, batch, learning rate, accelerators,
                     machines, price
    errors.py        a refused spec told as [{field, reason}]
"""

from trainjobs.model_params import BUILTIN_MODELS, KERAS_APPLICATIONS
from trainjobs.spec.accelerator import Accelerator, CpuAccelerator, GpuAccelerator, TpuAccelerator
from trainjobs.spec.dataset import (
    OPTION_FORMATS, DatasetFormat, DatasetOptions, DatasetSpec, guess_format, options_problem,
)
from trainjobs.spec.derived import resolve_strategy
from trainjobs.spec.distribution import Precision, Strategy, check_consistency
from trainjobs.spec.errors import closest_field, describe_errors
from trainjobs.spec.export import DEFAULT_CALIBRATION_EXAMPLES, ExportSpec, TfliteExport
from trainjobs.spec.job import SPEC_VERSION, JobSpec, parse_stored
from trainjobs.spec.labels import RESERVED_LABEL_PREFIX, label_problem
from trainjobs.spec.limits import MAX_RUNTIME, LimitsSpec
from trainjobs.spec.model import MAX_PARAMS_BYTES, ModelSpec
from trainjobs.spec.program import ProgramSpec
from trainjobs.spec.strict import MAX_NESTING, STORED, Int, Number
from trainjobs.spec.training import TrainingSpec

__all__ = [
    "BUILTIN_MODELS", "DEFAULT_CALIBRATION_EXAMPLES", "KERAS_APPLICATIONS", "MAX_NESTING", "MAX_PARAMS_BYTES",
    "MAX_RUNTIME", "OPTION_FORMATS", "RESERVED_LABEL_PREFIX", "SPEC_VERSION", "STORED", "Accelerator",
    "CpuAccelerator", "DatasetFormat", "DatasetOptions", "DatasetSpec", "ExportSpec", "GpuAccelerator", "Int",
    "JobSpec", "LimitsSpec", "ModelSpec", "ProgramSpec", "Number", "Precision", "Strategy", "TfliteExport", "TpuAccelerator",
    "TrainingSpec", "check_consistency", "closest_field", "describe_errors", "guess_format", "label_problem",
    "options_problem", "parse_stored", "resolve_strategy",
]
