"""`/admin/usage`, `/admin/keys` and `/admin/audit`: who used what, the keys kept in the ledger
database, and what admins did (backends/cluster/stores/ledger.py; docs/usage-and-budgets.md).

Every admin route wants the admin key. A key's secret leaves the gateway once, in the answer to
its creation or rotation; the ledger keeps only its digest.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from raygate.backends.cluster.stores.ledger import LedgerClient
from raygate.backends.cluster.stores.ledger_records import GROUPS
from raygate.protocol.errors import BadRequestError
from raygate.protocol.ledger import (
    AuditLog,
    KeyCreate,
    KeyCreated,
    KeyInfo,
    KeyList,
    KeyNotFoundError,
    UsageReport,
)
from raygate.server.access.admin_auth import require_admin_key
from raygate.server.context import request_context

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin_key)])


def _ledger(request: Request) -> LedgerClient:
    ledger: LedgerClient = request.app.state.ledger
    return ledger


def parse_time(value: str | None, param: str) -> float | None:
    """Unix seconds, or an ISO 8601 date or date-time (UTC unless it says otherwise)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise BadRequestError(f"`{param}` must be a finite time.", param=param)
        return seconds
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise BadRequestError(
            f"`{param}` must be Unix seconds or an ISO 8601 date or date-time, not {value!r}.", param=param
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def plain(value: str | None, param: str) -> str | None:
    """A filter as the database can compare it (PostgreSQL's text holds no NUL)."""
    if value is not None and "\x00" in value:
        raise BadRequestError(f"`{param}` may not contain NUL characters.", param=param)
    return value


def parse_groups(value: str) -> list[str]:
    groups = [g.strip() for g in value.split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise BadRequestError(
            f"`group_by` takes {', '.join(GROUPS)} (comma-separated), not {unknown[0]!r}.", param="group_by"
        )
    return groups


@router.get("/usage")
async def usage(
    request: Request,
    group_by: Annotated[
        str, Query(description="Comma-separated: key, model, day, endpoint.")
    ] = "key,model,day",
    key_id: str | None = None,
    model: str | None = None,
    since: Annotated[str | None, Query(description="Unix seconds or ISO 8601; inclusive.")] = None,
    until: Annotated[str | None, Query(description="Unix seconds or ISO 8601; exclusive.")] = None,
) -> UsageReport:
    groups = parse_groups(group_by)
    filters: dict[str, Any] = {
        "key_id": plain(key_id, "key_id"),
        "model": plain(model, "model"),
        "since": parse_time(since, "since"),
        "until": parse_time(until, "until"),
    }
    await request.app.state.ledger_writer.flush()  # this gateway's requests so far are counted
    rows = await _ledger(request).call("report", groups, filters)
    return UsageReport(group_by=groups, data=rows)


@router.post("/keys", status_code=201)
async def create_key(body: KeyCreate, request: Request) -> KeyCreated:
    created: KeyCreated = await _ledger(request).call("create_key", body)
    request_context(request).audit_target = created.id
    await request.app.state.key_sync.refresh()  # usable on this gateway at once
    return created


@router.get("/keys")
async def list_keys(request: Request) -> KeyList:
    return KeyList(data=await _ledger(request).call("list_keys"))


@router.get("/keys/{key_id}")
async def get_key(key_id: str, request: Request) -> KeyInfo:
    info: KeyInfo | None = await _ledger(request).call("get_key", key_id)
    if info is None:
        raise KeyNotFoundError.for_id(key_id)
    return info


@router.post("/keys/{key_id}/rotate")
async def rotate_key(key_id: str, request: Request) -> KeyCreated:
    rotated: KeyCreated | None = await _ledger(request).call("rotate_key", key_id)
    if rotated is None:
        raise KeyNotFoundError.for_id(key_id)
    await request.app.state.key_sync.refresh()
    return rotated


@router.delete("/keys/{key_id}")
async def revoke_key(key_id: str, request: Request) -> KeyInfo:
    revoked: KeyInfo | None = await _ledger(request).call("revoke_key", key_id)
    if revoked is None:
        raise KeyNotFoundError.for_id(key_id)
    await request.app.state.key_sync.refresh()
    return revoked


@router.get("/audit")
async def audit_log(
    request: Request,
    since: Annotated[str | None, Query(description="Unix seconds or ISO 8601; inclusive.")] = None,
    actor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AuditLog:
    """The newest entries first. Admin actions reach the log within a second of their answer."""
    filters = {"since": parse_time(since, "since"), "actor": plain(actor, "actor"), "limit": limit}
    await request.app.state.ledger_writer.flush()
    return AuditLog(data=await _ledger(request).call("audit_log", filters))
