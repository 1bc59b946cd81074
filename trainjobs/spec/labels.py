"""spec.labels: the user's labels, copied onto the job's machines, so GCP's label rules are the spec's.

GCP label rules (https://cloud.google.com/compute/docs/labeling-resources): at most 64 labels; keys 1-63
characters starting with a lowercase letter; keys and values use lowercase letters, digits, '_' and '-';
values may be empty. We copy labels onto VMs, so we refuse what GCP would refuse.
"""

from __future__ import annotations

import re

from trainjobs.vm_metadata import LABEL_PREFIX

_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
RESERVED_LABEL_PREFIX = LABEL_PREFIX  # the machines' own labels use it (trainjobs/vm_metadata.py)
MAX_LABELS = 32  # GCP allows 64; trainjobs adds its own


def label_problem(key: str, value: str) -> str | None:
    """Why GCP would refuse this label, or None. Also checks the label filters of GET /v1/jobs."""
    if not _LABEL_KEY.fullmatch(key):
        return f"label key {key!r} is not a GCP label key: lowercase letters, digits, '_' or '-', starting with a letter, at most 63"
    if not _LABEL_VALUE.fullmatch(value):
        return f"label value {value!r} for {key!r} is not a GCP label value: lowercase letters, digits, '_' or '-', at most 63"
    return None


def labels_problem(labels: dict[str, str]) -> str | None:
    """Why a job cannot carry these labels, or None."""
    if len(labels) > MAX_LABELS:
        return f"at most {MAX_LABELS} labels (GCP allows 64; trainjobs adds its own)"
    for key, value in labels.items():
        if problem := label_problem(key, value):
            return problem
        if key.startswith(RESERVED_LABEL_PREFIX):
            return f"label key {key!r}: the prefix {RESERVED_LABEL_PREFIX!r} is reserved"
    return None
