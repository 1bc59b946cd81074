"""Submit refuses a spec the validation refuses as a 422 naming the field, and stores nothing; a
consistent spec is queued. The whole rejection table, on the spec's validation alone:
tests/unit/test_spec_rejections.py; here a few of its cases through the API: a nested field, a field
whose name is a path into a dict (a built-in model's params), a section left out, a rule across
fields, an image name with a newline."""

from __future__ import annotations

import pytest

from tests.support.jobs import digits_spec

THROUGH_THE_API = [
    # (case id, spec overrides, field named in the error, words in the reason)
    ("unknown nested field", {"training": {"epochs": 1, "epoch": 2}}, "training.epoch", "Extra inputs"),
    ("typo in a built-in model's params", {"model": {"name": "mlp", "params": {"hiden_units": [64]}}},
     "model.params.hiden_units", "did you mean 'hidden_units'?"),
    ("missing dataset", {"dataset": None}, "dataset", "the managed trainer (model) trains on a dataset"),
    ("global batch not divisible", {"training": {"global_batch_size": 33}}, "training.global_batch_size",
     "divide evenly over 2"),
    ("runtime version with a trailing newline",
     {"accelerator": {"type": "tpu", "tpu_type": "v4-8", "runtime_version": "tpu-vm-tf-2.18.0-pjrt\n"}, "strategy": "auto"},
     "accelerator.runtime_version", "not a TensorFlow TPU VM image"),
    ("a variant that is model.tflite", {"export": {"tflite": {"quantization": "dynamic"}, "variants": [
        "tflite_dynamic"]}}, "export.variants.0", "tflite_dynamic is model.tflite already"),
    ("a profile window past the end", {"training": {"epochs": 3, "profile": {"epoch": 4}}}, "training.profile.epoch",
     "after the last epoch (3)"),
]


@pytest.mark.parametrize("overrides,field,reason", [c[1:] for c in THROUGH_THE_API], ids=[c[0] for c in THROUGH_THE_API])
def test_submit_rejects_contradiction_naming_field(api, overrides, field, reason):
    r = api.post("/v1/jobs", json=digits_spec(**overrides))
    assert r.status_code == 422, r.text
    body = r.json()["error"]
    assert body["error"] == "invalid_spec"
    fields = {d["field"]: d["reason"] for d in body["details"]}
    assert field in fields, fields
    assert reason in fields[field], fields[field]
    assert api.get("/v1/jobs").json()["jobs"] == []  # nothing was stored


def test_submit_accepts_consistent_spec(api):
    r = api.post("/v1/jobs", json=digits_spec(accelerator={"type": "gpu", "gpu_type": "nvidia-l4", "count": 2},
                                              strategy="mirrored", precision="mixed_float16"))
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "QUEUED"


def test_malformed_json_is_a_422_not_a_500(api):
    r = api.post("/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert r.json()["error"]["error"] == "invalid_spec"


def test_a_tpu_job_without_an_image_is_stored_with_the_tested_one_of_its_slice_kind(api):
    r = api.post("/v1/jobs", json=digits_spec(accelerator={"type": "tpu", "tpu_type": "v4-32"}, strategy="tpu"))
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["accelerator"]["runtime_version"] == "tpu-vm-tf-2.18.0-pod-pjrt"
