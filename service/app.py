"""The FastAPI application, wired in one place."""

from __future__ import annotations

from fastapi import FastAPI

from service import errors, outages
from service.db.session import check_migrated, get_engine, session_factory
from service.routes import artifacts, datasets, health, jobs, modules


def create_app(database_url: str, *, check_schema: bool = True) -> FastAPI:
    engine = get_engine(database_url)
    if check_schema:
        check_migrated(engine)
    app = FastAPI(title="trainjobs", version="0.1.0",
                  description="Run TensorFlow training jobs on Cloud TPUs and GPU VMs.")
    app.state.session_factory = session_factory(engine)
    errors.install(app)
    outages.install(app)  # 503s, within seconds, while PostgreSQL or storage is down
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(artifacts.router)
    app.include_router(datasets.router)
    app.include_router(modules.router)
    return app
