"""POST /v1/modules: upload your model code (a .py file, or a package as .zip / .tar.gz); use the
answer as model.module in a job spec. The agent downloads it and calls model.function."""

from __future__ import annotations

from fastapi import APIRouter, UploadFile
from fastapi.concurrency import run_in_threadpool

from service.deps import ProjectId
from service.errors import ApiError
from service.schemas import AUTHED, ModulePublic, error_responses
from trainjobs import storage
from trainjobs.uploads import (MAX_MODULE_BYTES, UploadError, UploadTooLarge, check_filename, find_upload,
                              max_upload_bytes, store_upload)

router = APIRouter(prefix="/v1/modules", tags=["models"])


@router.post("", status_code=201, response_model=ModulePublic, responses=error_responses(*AUTHED, 400, 413))
async def upload_module(file: UploadFile, project: ProjectId) -> ModulePublic:
    filename = file.filename or ""
    try:
        check_filename(filename, "module")
    except UploadError as exc:
        raise ApiError(422, f"{exc} (my_model.py, or a package as .zip or .tar.gz)", "invalid_request",
                       [{"field": "file", "reason": "unsupported file name"}]) from exc
    if file.size is not None and file.size > MAX_MODULE_BYTES:
        raise ApiError(413, f"model code over {MAX_MODULE_BYTES >> 20} MiB: ship weights as data, not code")
    try:
        sha256, size = await run_in_threadpool(store_upload, file.file, filename, kind="module",
                                               project_id=str(project), max_bytes=max_upload_bytes("module"))
    except UploadTooLarge as exc:
        raise ApiError(413, str(exc)) from exc
    if size == 0:
        raise ApiError(422, "the uploaded file is empty", "invalid_request", [{"field": "file", "reason": "empty"}])
    blob = await run_in_threadpool(find_upload, str(project), sha256)
    if blob is None:  # stored a moment ago; gone only if someone deleted it in between
        raise ApiError(503, "the upload was stored but cannot be found; try again")
    return ModulePublic(module=f"gs://{storage.bucket_name()}/{blob.name}", sha256=sha256, size=size)
