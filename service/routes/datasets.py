"""POST /v1/datasets: upload a dataset file, streamed to GCS; use the answer as dataset.source."""

from __future__ import annotations

from fastapi import APIRouter, UploadFile
from fastapi.concurrency import run_in_threadpool

from service.deps import ProjectId
from service.errors import ApiError
from service.schemas import AUTHED, DatasetPublic, error_responses
from trainjobs.uploads import UploadError, UploadTooLarge, check_filename, max_upload_bytes, store_upload

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


@router.post("", status_code=201, response_model=DatasetPublic, responses=error_responses(*AUTHED, 400, 413))
async def upload_dataset(file: UploadFile, project: ProjectId) -> DatasetPublic:
    # Starlette spools the multipart body to disk past 1 MB, and store_upload streams it to GCS in
    # chunks while hashing: the dataset is never whole in memory.
    filename = file.filename or "data"
    try:
        check_filename(filename, "dataset")
    except UploadError as exc:
        raise ApiError(422, str(exc), "invalid_request", [{"field": "file", "reason": "unsupported file name"}]) from exc
    try:
        sha256, size = await run_in_threadpool(store_upload, file.file, filename, kind="dataset",
                                               project_id=str(project), max_bytes=max_upload_bytes("dataset"))
    except UploadTooLarge as exc:
        raise ApiError(413, str(exc)) from exc
    if size == 0:
        raise ApiError(422, "the uploaded file is empty", "invalid_request", [{"field": "file", "reason": "empty"}])
    return DatasetPublic(dataset=f"dataset:{sha256}", sha256=sha256, size=size, filename=filename)
