"""Stored responses on the request path: whose they are, reading one, and the three read/delete
endpoints (`GET`/`DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`).

A response belongs to the API key that created it: the store keys rows by the key's digest (never
the key), so with keys on, another key's id answers 404 exactly like an unknown one. A gateway
without keys stores everything under one anonymous owner.
"""

from __future__ import annotations

from typing import Literal

from fastapi import Request

from raygate.backends.cluster.stores.responses import ResponseStoreClient
from raygate.protocol.errors import BadRequestError
from raygate.protocol.response_object import DeletedResponse, ResponseItemList, StoredResponse
from raygate.protocol.responses import ResponseNotFoundError
from raygate.server.context import request_context

MAX_PAGE = 100


def owner_of(request: Request) -> str:
    """The store's owner for this request: the API key's digest, or "" on an open gateway."""
    key = request_context(request).key
    return "" if key is None else key.digest.hex()


def _store(request: Request) -> ResponseStoreClient:
    store: ResponseStoreClient = request.app.state.responses
    return store


async def read_stored(
    store: ResponseStoreClient, response_id: str, owner: str, param: str | None = None
) -> StoredResponse:
    body = await store.get(response_id, owner)
    if body is None:
        raise ResponseNotFoundError.for_id(response_id, param)
    return StoredResponse.model_validate_json(body)


async def retrieve(request: Request, response_id: str) -> StoredResponse:
    return await read_stored(_store(request), response_id, owner_of(request))


async def delete(request: Request, response_id: str) -> DeletedResponse:
    if not await _store(request).delete(response_id, owner_of(request)):
        raise ResponseNotFoundError.for_id(response_id)
    return DeletedResponse(id=response_id)


async def input_items(
    request: Request, response_id: str, limit: int, order: Literal["asc", "desc"], after: str | None
) -> ResponseItemList:
    """A page of the response's own input items (OpenAI's default order: newest first)."""
    if not 1 <= limit <= MAX_PAGE:
        raise BadRequestError(f"`limit` must be between 1 and {MAX_PAGE}.", param="limit")
    stored = await retrieve(request, response_id)
    items = list(stored.input) if order == "asc" else list(reversed(stored.input))
    if after is not None:
        ids = [item.id for item in items]
        if after not in ids:
            raise BadRequestError(f"No input item with id '{after}' in this response.", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return ResponseItemList(
        data=page,
        has_more=len(items) > limit,
        first_id=page[0].id if page else "",
        last_id=page[-1].id if page else "",
    )
