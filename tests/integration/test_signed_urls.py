"""Artifact links: V4 signed URLs when the credentials can sign, API links otherwise."""

from __future__ import annotations

from service.routes import artifacts
from trainjobs.job_paths import JobPaths


def test_credentials_that_cannot_sign_fall_back_to_api_links(gcs_emulator):
    assert artifacts._signer(JobPaths("gs://bkt/jobs/abc")) is None


