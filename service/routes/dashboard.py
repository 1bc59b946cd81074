"""The dashboard: static files under /ui (service/ui/, no build step, nothing from a CDN), and / sends
a browser there. The page signs in with an API key it keeps in sessionStorage and calls the same /v1
API as every client. /docs is the API reference, a page of the same kind (ui/docs.html renders
/openapi.json): FastAPI's own would run Swagger UI from a CDN on this origin, next to the key.
/ui/states.js gives the page the statuses and their groups from trainjobs/states.py, so it spells none;
/ui/sweep-states.js does the same for sweeps and their trials."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from trainjobs.states import GROUPS, SWEEP_CANCELLABLE, JobStatus, SweepStatus, TrialState, in_order

UI_DIR = Path(__file__).resolve().parent.parent / "ui"


def states_script() -> str:
    """Every status and the job-state groups, as a script that defines JOB_STATES (read by ui/app.js)."""
    groups = {"STATUSES": [s.value for s in JobStatus],
              **{name: [s.value for s in in_order(group)] for name, group in GROUPS.items()}}
    return ("// The job-state groups of trainjobs/states.py (served by service/routes/dashboard.py).\n"
            f"const JOB_STATES = Object.freeze({json.dumps(groups)});\n")


def sweep_states_script() -> str:
    """The sweep statuses, which end a sweep and which may be cancelled, and the trial states, as a script
    that defines SWEEP_STATES (read by ui/app.js)."""
    groups = {"STATUSES": [s.value for s in SweepStatus], "TERMINAL": [s.value for s in SweepStatus if s.terminal],
              "CANCELLABLE": sorted(s.value for s in SWEEP_CANCELLABLE), "TRIAL": {s.name: s.value for s in TrialState}}
    return ("// The sweep and trial states of trainjobs/states.py (served by service/routes/dashboard.py).\n"
            f"const SWEEP_STATES = Object.freeze({json.dumps(groups)});\n")


def install(app: FastAPI) -> None:
    script, sweep_script = states_script(), sweep_states_script()

    # Before the mount: a route added after it would never be reached under /ui.
    @app.get("/ui/states.js", include_in_schema=False)
    def states() -> Response:
        return Response(script, media_type="text/javascript")

    @app.get("/ui/sweep-states.js", include_in_schema=False)
    def sweep_states() -> Response:
        return Response(sweep_script, media_type="text/javascript")

    app.mount("/ui", StaticFiles(directory=UI_DIR, html=True), name="ui")

    @app.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.get("/docs", include_in_schema=False)
    def docs() -> RedirectResponse:
        return RedirectResponse("/ui/docs.html")
