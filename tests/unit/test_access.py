"""Tokens, roles and namespaces (controlplane.runtime.access): the pure rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.runtime import access
from controlplane.runtime.access import Kind, Principal, TokenCache

DEV_A = Principal(Kind.TOKEN, "ci", access.DEVELOPER, "team-a", "0" * 16)
INV_A = Principal(Kind.TOKEN, "app", access.INVOKER, "team-a", "1" * 16)
ADMIN = Principal(Kind.TOKEN, "ops", access.ADMIN, "", "2" * 16)
COMPONENT = access.caller("dispatch", None)
ANON_CERT = access.caller("client/admin", None)


def m(service: str, name: str) -> str:
    return f"/galaxy.v1.{service}/{name}"


def test_a_token_round_trips_and_only_its_hash_is_kept():
    token, rec = access.new_token("ci", access.DEVELOPER, "team-a", now_unix=5.0)
    tid, secret = access.parse(token) or ("", "")
    assert token.startswith("glx_") and tid == rec.id and len(tid) == 16
    assert secret not in repr(rec) and rec.sha256 == access.digest(secret)
    assert access.matches(rec, secret)
    assert not access.matches(rec, secret[:-1] + ("0" if secret[-1] != "0" else "1"))
    assert rec.principal() == Principal(Kind.TOKEN, "ci", access.DEVELOPER, "team-a", tid)


def test_admin_tokens_have_no_namespace():
    _, rec = access.new_token("ops", access.ADMIN, "team-a")
    assert rec.namespace == ""


@pytest.mark.parametrize(
    "text",
    ["", "glx_", "glx_abc_def", "glx_" + "g" * 16 + "_x", "glx_" + "a" * 16, "Bearer x", "x" * 500],
)
def test_malformed_tokens_do_not_parse(text):
    assert access.parse(text) is None


def test_bearer_header():
    assert access.bearer("Bearer abc") == "abc"
    assert access.bearer("bearer  abc ") == "abc"
    assert access.bearer("Basic abc") is None
    assert access.bearer("Bearer ") is None


@pytest.mark.parametrize(
    ("method", "who", "code"),
    [
        # Anyone: health and reflection.
        ("/grpc.health.v1.Health/Check", access.ANONYMOUS_PRINCIPAL, None),
        ("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", ANON_CERT, None),
        # No token: refused on the public API.
        (m("Controller", "ListFunctions"), ANON_CERT, "UNAUTHENTICATED"),
        (m("Controller", "GetRuntime"), access.ANONYMOUS_PRINCIPAL, "UNAUTHENTICATED"),
        # ... but may reach Dispatch: public functions answer it (check_invoke).
        (m("Dispatch", "Dispatch"), access.ANONYMOUS_PRINCIPAL, None),
        (m("Controller", "GetMembership"), access.ANONYMOUS_PRINCIPAL, None),
        # Invoker: invoke only.
        (m("Dispatch", "Dispatch"), INV_A, None),
        (m("Dispatch", "Release"), INV_A, None),
        (m("Controller", "GetMembership"), INV_A, None),
        (m("Controller", "DeployFunction"), INV_A, "PERMISSION_DENIED"),
        (m("Controller", "GetFunction"), INV_A, "PERMISSION_DENIED"),
        # Developer: its functions, not tokens, runtimes or the cluster.
        (m("Controller", "DeployFunction"), DEV_A, None),
        (m("Controller", "SetTraffic"), DEV_A, None),
        (m("Controller", "ListRuntimes"), DEV_A, None),
        (m("Controller", "PutRuntime"), DEV_A, "PERMISSION_DENIED"),
        (m("Controller", "CreateToken"), DEV_A, "PERMISSION_DENIED"),
        (m("Controller", "GetClusterStatus"), DEV_A, "PERMISSION_DENIED"),
        (m("Dispatch", "ListInstances"), DEV_A, "PERMISSION_DENIED"),
        # Admin: every public method...
        (m("Controller", "CreateToken"), ADMIN, None),
        (m("Controller", "GetClusterStatus"), ADMIN, None),
        # ... and no internal one: no token opens those.
        (m("Dispatch", "Coordinate"), ADMIN, "PERMISSION_DENIED"),
        (m("NodeAgent", "CreateInstance"), ADMIN, "PERMISSION_DENIED"),
        (m("Controller", "LookupToken"), ADMIN, "PERMISSION_DENIED"),
        (m("Controller", "RegisterInstance"), DEV_A, "PERMISSION_DENIED"),
        # Components: everything, as before tokens.
        (m("Dispatch", "Coordinate"), COMPONENT, None),
        (m("Controller", "LookupToken"), COMPONENT, None),
    ],
)
def test_who_may_call_what(method, who, code):
    refusal = access.decide(method, who)
    assert (refusal.code if refusal else None) == code
    if refusal is not None:
        assert method in refusal.message


def test_a_token_wins_over_the_certificate_that_forwards_it():
    # The gateway and a forwarding Dispatch carry the caller's token: the
    # call gets the caller's rights, never the component's.
    assert access.caller("gateway", INV_A) is INV_A
    assert access.decide(m("Controller", "DeployFunction"), access.caller("gateway", INV_A))


def test_refusals_name_the_caller_without_secrets():
    r = access.decide(m("Controller", "DeployFunction"), INV_A)
    assert r is not None and "token 1111111111111111 (invoker in namespace team-a)" in r.message
    r = access.decide(m("Dispatch", "Coordinate"), ANON_CERT)
    assert r is not None and "certificate client/admin without a token" in r.message


def test_namespaces():
    assert access.check_namespace(DEV_A, "team-a", "function f") is None
    assert access.check_namespace(ADMIN, "team-b", "function f") is None
    assert access.check_namespace(COMPONENT, "team-b", "function f") is None
    r = access.check_namespace(DEV_A, "team-b", "function f")
    assert r is not None and r.code == "PERMISSION_DENIED"
    assert r.message.startswith("function f is in namespace team-b")
    # A function stored without a namespace is in "default".
    dev_default = Principal(Kind.TOKEN, "d", access.DEVELOPER, "default", "3" * 16)
    assert access.check_namespace(dev_default, "", "function f") is None
    assert access.check_namespace(DEV_A, "", "function f") is not None


def test_cache_keeps_answers_for_its_ttl_and_is_bounded():
    _, rec = access.new_token("ci", access.DEVELOPER, "team-a")
    c = TokenCache(ttl_s=10.0, max_entries=2)
    assert c.get(rec.id, 0.0) == (False, None)
    c.put(rec.id, rec, 0.0)
    c.put("f" * 16, None, 1.0)  # a miss is remembered too
    assert c.get(rec.id, 9.9) == (True, rec)
    assert c.get("f" * 16, 5.0) == (True, None)
    assert c.get(rec.id, 10.0) == (False, None)  # expired: look it up again
    c.put("e" * 16, None, 2.0)
    assert len(c) == 2 and c.get(rec.id, 3.0) == (False, None)  # oldest dropped
    c.forget("e" * 16)
    assert c.get("e" * 16, 3.0) == (False, None)


@pytest.mark.slow
@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None, derandomize=True, database=None)
def test_any_header_parses_or_is_refused_never_raises(text: str) -> None:
    """Whatever a client sends as authorization: a token or None, never an
    exception (a traceback would be an INTERNAL answer)."""
    token = access.bearer(text)
    parsed = access.parse(token) if token else None
    if parsed is not None:
        assert token == f"glx_{parsed[0]}_{parsed[1]}"
    assert access.parse(text) is None or text.startswith("glx_")


def test_public_functions_answer_anyone_others_need_a_token_of_their_namespace() -> None:
    anon = access.caller("gateway", None, anonymous=True)
    assert anon.kind is Kind.ANONYMOUS  # the gateway's certificate lends nothing
    assert access.check_invoke(anon, "team-a", True, "function f") is None
    r = access.check_invoke(anon, "team-a", False, "function f")
    assert r is not None and r.code == "UNAUTHENTICATED" and "not public" in r.message
    assert access.check_invoke(INV_A, "team-a", False, "function f") is None
    r = access.check_invoke(INV_A, "team-b", False, "function f")
    assert r is not None and r.code == "PERMISSION_DENIED"
    # Anonymous never passes a namespace check (deploy, delete, read).
    assert access.check_namespace(anon, "", "function f") is not None
