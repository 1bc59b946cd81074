"""The dashboard: static files under /ui (service/ui/, no build step, nothing from a CDN), and / sends
a browser there. The page signs in with an API key it keeps in sessionStorage and calls the same /v1
API as every client."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

UI_DIR = Path(__file__).resolve().parent.parent / "ui"


def install(app: FastAPI) -> None:
    app.mount("/ui", StaticFiles(directory=UI_DIR, html=True), name="ui")

    @app.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse("/ui/")
