"""Request dependencies: the session factory and the caller's project."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from service.db.projects import project_for_key
from service.db.session import transaction
from service.errors import ApiError


def get_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.session_factory  # set by create_app
    return factory


Factory = Annotated[sessionmaker[Session], Depends(get_factory)]


def current_project(request: Request, factory: Factory) -> uuid.UUID:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'")
    with transaction(factory) as session:
        project_id = project_for_key(session, secret.strip())
    if project_id is None:
        raise ApiError(401, "unknown or revoked API key")
    return project_id


ProjectId = Annotated[uuid.UUID, Depends(current_project)]
