"""The dashboard: static files under /ui (service/ui/, no build step, nothing from a CDN), and / sends
a browser there. The page signs in with an API key it keeps in sessionStorage and calls the same /v1
API as every client. /docs is the API reference, a page of the same kind (ui/docs.html renders
/openapi.json): FastAPI's own would run Swagger UI from a CDN on this origin, next to the key."""

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

    @app.get("/docs", include_in_schema=False)
    def docs() -> RedirectResponse:
        return RedirectResponse("/ui/docs.html")
