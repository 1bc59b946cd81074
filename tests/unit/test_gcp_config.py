"""A Google Cloud worker's configuration comes from TRAINJOBS_GCP_* variables, and a missing or
malformed one is named. The agent's wheel and startup script: tests/integration/test_gcp_cloud.py."""

from __future__ import annotations

import pytest

from worker.gcp.config import ConfigError, GcpConfig


def test_configuration_comes_from_trainjobs_gcp_variables() -> None:
    config = GcpConfig.from_env({
        "TRAINJOBS_GCP_PROJECT": "proj", "TRAINJOBS_GCP_ZONE": "us-central2-b",
        "TRAINJOBS_GCP_FALLBACK_ZONES": "us-central1-a, europe-west4-a", "TRAINJOBS_GCP_NETWORK": "train",
        "TRAINJOBS_GCP_SERVICE_ACCOUNT": "vm@proj.iam.gserviceaccount.com", "TRAINJOBS_GCP_TAGS": "a,b",
        "TRAINJOBS_GCP_CAPACITY_WAIT_MINUTES": "45", "TRAINJOBS_TPU_API_ENDPOINT": "http://127.0.0.1:8470",
        "TRAINJOBS_GCP_WATCH_SECONDS": "30"})
    assert config.zones == ("us-central2-b", "us-central1-a", "europe-west4-a")
    assert (config.network, config.tags, config.capacity_wait_s) == ("train", ("a", "b"), 2700.0)
    assert config.service_account == "vm@proj.iam.gserviceaccount.com"
    assert config.tpu_api_endpoint == "http://127.0.0.1:8470"
    assert config.watch_every_s == 30.0


@pytest.mark.parametrize("env, variable", [
    ({"TRAINJOBS_GCP_ZONE": "us-central2-b"}, "TRAINJOBS_GCP_PROJECT"),
    ({"TRAINJOBS_GCP_PROJECT": "proj"}, "TRAINJOBS_GCP_ZONE"),
    ({"TRAINJOBS_GCP_PROJECT": "p", "TRAINJOBS_GCP_ZONE": "z", "TRAINJOBS_GCP_CAPACITY_WAIT_MINUTES": "soon"},
     "TRAINJOBS_GCP_CAPACITY_WAIT_MINUTES"),
    ({"TRAINJOBS_GCP_PROJECT": "p", "TRAINJOBS_GCP_ZONE": "z", "TRAINJOBS_GCP_WATCH_SECONDS": "0"},
     "TRAINJOBS_GCP_WATCH_SECONDS"),
])
def test_missing_or_malformed_configuration_names_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        GcpConfig.from_env(env)
