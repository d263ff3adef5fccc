"""The Batch API on the request path: create, retrieve, list and cancel, each key seeing only its
own batches (owned like files: `files.py`). Running the lines is `batch_runner.py`'s."""

from __future__ import annotations

from fastapi import Request

from raygate.protocol.batches import Batch, BatchList, BatchNotFoundError, CreateBatchRequest
from raygate.protocol.errors import BadRequestError
from raygate.server.serving.files import batch_store
from raygate.server.serving.stored_responses import owner_of

MAX_LIST = 100


async def create(request: Request, body: CreateBatchRequest) -> Batch:
    batch = await batch_store(request).create_batch(owner_of(request), body)
    wake = getattr(request.app.state, "batch_runner", None)
    if wake is not None:
        wake.wake()
    return batch


async def retrieve(request: Request, batch_id: str) -> Batch:
    found = await batch_store(request).get_batch(batch_id, owner_of(request))
    if found is None:
        raise BatchNotFoundError.for_id(batch_id)
    return found


async def listing(request: Request, after: str | None, limit: int) -> BatchList:
    if not 1 <= limit <= MAX_LIST:
        raise BadRequestError(f"`limit` must be between 1 and {MAX_LIST}.", param="limit")
    page, more = await batch_store(request).list_batches(owner_of(request), after, limit)
    return BatchList(
        data=page, has_more=more, first_id=page[0].id if page else None, last_id=page[-1].id if page else None
    )


async def cancel(request: Request, batch_id: str) -> Batch:
    return await batch_store(request).cancel_batch(batch_id, owner_of(request))
