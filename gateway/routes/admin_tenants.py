"""The control plane's admin API for tenants (admin key only): create, change, list, read.

The policy file's ``tenants:`` are the seed. A tenant created or changed here is stored in
the control store and replaces the file's section of that name as a whole (a PATCH merges
its fields, RFC 7396, over the tenant in force and stores the result); every replica then
serves the merged view: authentication, model lists, limits, routing constraints, queue
weights. Errors: 400 (a bad field, an unknown alias or provider), 404 (unknown tenant on
PATCH/GET), 409 (POST of a tenant that exists), 503 (store unreachable).
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, patch, post

from core.config_tenants import TenantConfig
from core.errors import InvalidRequestError
from gateway.routes.admin_keys import Admin, answer, body_of
from policies.control import NotFoundError
from policies.control.requests import TenantName

PATH = "/admin/tenants"
_fields = msgspec.json.Decoder(dict[str, Any])


class _Named(msgspec.Struct):
    name: TenantName


def _view(admin: Admin, name: str, config: TenantConfig) -> dict[str, Any]:
    from_api = name in admin.control.index.tenants
    in_file = name in admin.state.base_config.tenants
    source = "api" if from_api else "config"
    return {
        "id": name,
        "object": "tenant",
        "source": source,
        "overrides_config": from_api and in_file,
        "config": msgspec.to_builtins(config),
    }


@post(PATH, status_code=201)
async def create_tenant(request: Request[Any, Any, Any]) -> Response[bytes]:
    """``{"name": ..., <the fields of a policy-file tenant>}``."""
    admin = Admin(request)
    fields: dict[str, Any] = await body_of(request, _fields)
    name = fields.pop("name", None)
    try:
        msgspec.convert({"name": name}, _Named)
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(
            "name: a tenant's name: 1 to 64 letters, digits, '.', '_' or '-' "
            f"(starting with a letter or digit): {exc}",
            param="name",
        ) from exc
    record = await admin.control.plane.create_tenant(name, fields, admin.catalog, admin.actor)
    await admin.control.changed()
    return answer(_view(admin, name, record.config), 201)


@patch(PATH + "/{name:str}")
async def update_tenant(request: Request[Any, Any, Any], name: str) -> Response[bytes]:
    """Fields to change (``null`` puts one back to its default)."""
    admin = Admin(request)
    fields: dict[str, Any] = await body_of(request, _fields)
    record = await admin.control.plane.update_tenant(name, fields, admin.catalog, admin.actor)
    await admin.control.changed()
    return answer(_view(admin, name, record.config))


@get(PATH)
async def list_tenants(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every tenant in force (file and API), by name."""
    admin = Admin(request)
    tenants = admin.state.runtime.config.tenants
    data = [_view(admin, name, tenants[name]) for name in sorted(tenants)]
    return answer({"object": "list", "data": data})


@get(PATH + "/{name:str}")
async def get_tenant(request: Request[Any, Any, Any], name: str) -> Response[bytes]:
    admin = Admin(request)
    config = admin.state.runtime.config.tenants.get(name)
    if config is None:
        raise NotFoundError(f"No tenant named '{name}'.", param="tenant", code="tenant_not_found")
    return answer(_view(admin, name, config))
