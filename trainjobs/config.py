"""Where configuration comes from: environment for servers, $TRAINJOBS_HOME/config.json for clients."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("TRAINJOBS_HOME", Path.home() / ".trainjobs"))


@dataclass(frozen=True)
class ClientConfig:
    api_url: str
    api_key: str | None


def load_client_config() -> ClientConfig:
    """config.json written by `trainjobs up`; TRAINJOBS_API_URL / TRAINJOBS_API_KEY override it."""
    path = home() / "config.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    return ClientConfig(
        api_url=os.environ.get("TRAINJOBS_API_URL") or data.get("api_url") or "http://127.0.0.1:8080",
        api_key=os.environ.get("TRAINJOBS_API_KEY") or data.get("api_key"),
    )


def save_client_config(api_url: str, api_key: str) -> Path:
    path = home() / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"api_url": api_url, "api_key": api_key}, indent=2) + "\n")
    tmp.chmod(0o600)  # it holds a secret
    tmp.replace(path)
    return path


def database_url_from_env() -> str | None:
    url = os.environ.get("TRAINJOBS_DATABASE_URL")
    if url and url.startswith("postgresql://"):
        url = url.replace("postgresql://", "postgresql+psycopg://", 1)
    return url
