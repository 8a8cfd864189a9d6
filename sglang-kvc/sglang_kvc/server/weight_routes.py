"""SGLang's weight-update endpoints (from disk, from serialized tensors, over a distributed group),
weight reads by name, and GPU memory release/resume.

A missing field is a 400 `{"error": ...}`; an update the engine rejects is a 400
`{"success": false, "message": ...}`, as SGLang answers.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ..engine.engine import Engine
from .http_io import BadRequest, get_engine, read_object

router = APIRouter()

# Options every weight update accepts besides its payload.
_COMMON = ("weight_version", "abort_all_requests", "flush_cache", "load_format")
# the first four are required; timeout_s is sglang-kvc's own (seconds a broadcast may wait)
_GROUP_KEYS = ("master_address", "master_port", "rank_offset", "world_size", "group_name", "backend",
               "timeout_s")


async def _weights_call(fn, body: dict, keys: tuple[str, ...], required: tuple[str, ...] = ()):
    """`fn(**body[keys])` in the thread pool (updates load and copy tensors for seconds)."""
    missing = [k for k in required if k not in body]
    if missing:
        raise BadRequest(f"missing field(s): {', '.join(missing)}")
    kwargs = {k: body[k] for k in keys if k in body}
    try:
        return await run_in_threadpool(fn, **kwargs)
    except (ValueError, FileNotFoundError, TypeError) as e:
        return JSONResponse({"success": False, "message": str(e)}, status_code=400)


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request, engine: Engine = Depends(get_engine)):
    body = await read_object(request)
    return await _weights_call(engine.update_weights_from_disk, body, ("model_path",) + _COMMON,
                               ("model_path",))


@router.post("/update_weights_from_tensor")
async def update_weights_from_tensor(request: Request, engine: Engine = Depends(get_engine)):
    body = await read_object(request)
    return await _weights_call(engine.update_weights_from_tensor, body,
                               ("serialized_named_tensors",) + _COMMON, ("serialized_named_tensors",))


@router.post("/init_weights_update_group")
async def init_weights_update_group(request: Request, engine: Engine = Depends(get_engine)):
    body = await read_object(request)
    return await _weights_call(engine.init_weights_update_group, body, _GROUP_KEYS, _GROUP_KEYS[:4])


@router.post("/update_weights_from_distributed")
async def update_weights_from_distributed(request: Request, engine: Engine = Depends(get_engine)):
    body = await read_object(request)
    return await _weights_call(engine.update_weights_from_distributed, body,
                               ("names", "dtypes", "shapes", "group_name") + _COMMON,
                               ("names", "dtypes", "shapes"))


@router.post("/destroy_weights_update_group")
async def destroy_weights_update_group(request: Request, engine: Engine = Depends(get_engine)):
    body = await read_object(request)
    return await _weights_call(engine.destroy_weights_update_group, body, ("group_name",))


@router.api_route("/get_weights_by_name", methods=["GET", "POST"])
async def get_weights_by_name(request: Request, engine: Engine = Depends(get_engine)):
    body = await read_object(request)
    return await _weights_call(engine.get_weights_by_name, body, ("name", "truncate_size"),
                               ("name",))

# ------------------------------------------------------------ memory


@router.api_route("/release_memory_occupation", methods=["GET", "POST"])
async def release_memory_occupation(request: Request, engine: Engine = Depends(get_engine)):
    body = await read_object(request)
    await run_in_threadpool(engine.release_memory, body.get("tags"))
    return {"success": True, "message": "memory released"}


@router.api_route("/resume_memory_occupation", methods=["GET", "POST"])
async def resume_memory_occupation(request: Request, engine: Engine = Depends(get_engine)):
    body = await read_object(request)
    await run_in_threadpool(engine.resume_memory, body.get("tags"))
    return {"success": True, "message": "memory resumed"}
