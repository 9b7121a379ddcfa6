"""`galaxy tokens create|list|delete|generate`: bearer tokens and their
roles (docs/security.md, "Tokens and roles")."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from controlplane.controller.tokens_store import check_request
from controlplane.runtime import access, credentials
from controlplane.runtime.errors import InvalidArgument
from controlplane.tools.common import CliError, connect
from controlplane.tools.output import add_output_flag, emit, print_table

_CONTROLLER_HELP = "controller host:port (default: $GALAXY_CONTROLLER or the running `galaxy up`)"


def add_subparser(sub: Any) -> None:
    """``galaxy tokens``."""
    p = sub.add_parser(
        "tokens",
        help="create, list and revoke bearer tokens (admin)",
        description="Roles: admin (everything), developer (deploy and invoke the functions "
        "of one namespace), invoker (invoke the functions of one namespace).",
    )
    ts = p.add_subparsers(dest="tokens_command", required=True)
    c = ts.add_parser("create", help="make a token; it is printed once, keep it")
    c.add_argument("name", help="who or what holds it (free text)")
    c.add_argument("--role", choices=access.ROLES, required=True)
    c.add_argument("--namespace", default="", help="required for developer and invoker")
    c.add_argument("--json", action="store_true", help="print the token and its record as JSON")
    c.set_defaults(func=cmd_create)
    ls = ts.add_parser("list", help="every token's id, name, role and namespace (no secrets)")
    add_output_flag(ls)
    ls.set_defaults(func=cmd_list)
    d = ts.add_parser("delete", help="revoke a token by its id")
    d.add_argument("id", help="the 16 hex digits after glx_ (see `galaxy tokens list`)")
    d.set_defaults(func=cmd_delete)
    for sp in (c, ls, d):
        sp.add_argument("--controller", default=None, help=_CONTROLLER_HELP)
    g = ts.add_parser(
        "generate",
        help="print a new admin token for a controller's --bootstrap-token-file "
        "(no cluster needed; the controller stores only its hash)",
    )
    g.set_defaults(func=cmd_generate)


async def cmd_create(args: argparse.Namespace) -> int:
    """Create a token and print it (once)."""
    try:
        check_request(args.name, args.role, args.namespace)
    except InvalidArgument as e:
        raise CliError(e.message) from None
    async with connect(args) as c:
        reply = await c.create_token(args.name, args.role, args.namespace)
    if args.json:
        print(json.dumps({"token": reply.token, **_info(reply.info)}))
        return 0
    ns = f" in namespace {reply.info.namespace}" if reply.info.namespace else ""
    print(reply.token)
    print(f"# token {reply.info.id}: {reply.info.role}{ns}; shown only now, keep it secret")
    return 0


async def cmd_list(args: argparse.Namespace) -> int:
    """One line per token."""
    async with connect(args) as c:
        tokens = await c.list_tokens()
    rows = [
        (t.id, t.role, t.namespace or "*",
         dt.datetime.fromtimestamp(t.created_unix, dt.UTC).strftime("%Y-%m-%d %H:%M"), t.name)
        for t in tokens
    ]  # fmt: skip
    header = ("ID", "ROLE", "NAMESPACE", "CREATED", "NAME")
    emit(args.output, [_info(t) for t in tokens], lambda: print_table(header, rows))
    return 0


async def cmd_delete(args: argparse.Namespace) -> int:
    """Revoke one token."""
    async with connect(args) as c:
        await c.delete_token(args.id)
    print(f"token {args.id} revoked")
    return 0


async def cmd_generate(args: argparse.Namespace) -> int:
    """Print a fresh admin token (not registered anywhere yet)."""
    print(credentials.generate_admin_token())
    return 0


def _info(i: Any) -> dict[str, Any]:
    return {
        "id": i.id,
        "name": i.name,
        "role": i.role,
        "namespace": i.namespace,
        "created_unix": i.created_unix,
    }
