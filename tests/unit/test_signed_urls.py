"""Artifact links: V4 signed URLs when the credentials can sign (signing is local, no network), and
the paths an artifact link may name. Credentials that cannot sign: tests/integration/test_signed_urls.py."""

from __future__ import annotations

import pytest

from service.errors import ApiError
from service.routes import artifacts
from trainjobs import storage
from trainjobs.job_paths import JobPaths


def _service_account_client():
    """A storage client whose credentials hold a private key: signing is local, no network."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from google.cloud import storage as gcs
    from google.oauth2 import service_account

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    creds = service_account.Credentials.from_service_account_info({
        "type": "service_account", "client_email": "trainjobs@example.iam.gserviceaccount.com",
        "private_key": pem, "private_key_id": "1", "token_uri": "https://oauth2.example/token", "project_id": "p"})
    return gcs.Client(project="p", credentials=creds)


def test_signing_credentials_give_15_minute_v4_urls(monkeypatch):
    monkeypatch.setattr(storage, "client", _service_account_client)
    sign = artifacts._signer(JobPaths("gs://bkt/jobs/abc"))
    assert sign is not None
    url = sign("saved_model/saved_model.pb")
    assert "/bkt/jobs/abc/artifacts/saved_model/saved_model.pb?" in url
    assert "X-Goog-Algorithm=GOOG4-RSA-SHA256" in url and "X-Goog-Expires=900" in url


@pytest.mark.parametrize("path", ["../spec.json", "/etc/passwd", "a/../../b", "..", "", "a\\..\\b", "x\x00y"])
def test_paths_leaving_the_artifact_directory_are_refused(path):
    with pytest.raises(ApiError) as exc:
        artifacts.safe_artifact_path(path)
    assert exc.value.status == 400


@pytest.mark.parametrize("path,expected", [("model.tflite", "model.tflite"), ("saved_model/./x.pb", "saved_model/x.pb")])
def test_paths_inside_are_normalised(path, expected):
    assert artifacts.safe_artifact_path(path) == expected
