"""`galaxy certs`: the CA and the component certificates for mutual TLS.

init     a CA and one certificate per component identity (idempotent)
issue    one more identity's certificate
rotate   a new key and certificate for an identity, same CA
show     identity, SANs and end of validity of every certificate
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from controlplane.runtime import tls
from controlplane.tools.common import CliError


def add_subparser(sub: Any) -> None:
    """``galaxy certs init | issue | rotate | show``."""
    c = sub.add_parser("certs", help="make and inspect TLS certificates (mutual TLS)")
    csub = c.add_subparsers(dest="certs_command", required=True)
    hosts_help = (
        "DNS name or IP address the certificate is valid for; repeatable "
        f"(default: {' '.join(tls.DEFAULT_HOSTS)}; none for client/ identities)"
    )
    for name, helptext, func in (
        ("init", "a CA and a certificate per component and client/admin", cmd_init),
        ("issue", "a certificate for one more identity", cmd_issue),
        ("rotate", "a new key and certificate for an identity (same CA)", cmd_rotate),
        ("show", "identity, SANs and end of validity of every certificate", cmd_show),
    ):
        sp = csub.add_parser(name, help=helptext)
        sp.add_argument("--dir", required=True, help="directory of the CA and certificates")
        if name in ("issue", "rotate"):
            sp.add_argument("identity", help="e.g. dispatch or client/alice")
        if name != "show":
            help_ = hosts_help if name != "rotate" else "as issue (default: keep the current hosts)"
            sp.add_argument("--host", action="append", default=None, help=help_)
        sp.set_defaults(func=func)


def _hosts(args: argparse.Namespace, identity: str) -> list[str]:
    if args.host is not None:
        return list(args.host)
    return [] if identity.startswith("client/") else list(tls.DEFAULT_HOSTS)


def _need_ca(d: Path) -> None:
    if not (d / "ca.pem").is_file() or not (d / "ca-key.pem").is_file():
        raise CliError(f"no CA in {d} (ca.pem, ca-key.pem); run `galaxy certs init --dir {d}`")


class _Errors:
    """Turns what tls raises into one-line CliErrors (no tracebacks)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, e: BaseException | None, tb: Any) -> None:
        if isinstance(e, ValueError):
            raise CliError(str(e)) from None
        if isinstance(e, OSError):
            where = f"{e.filename}: " if e.filename else ""
            raise CliError(f"{where}{e.strerror or e}") from None


async def cmd_init(args: argparse.Namespace) -> int:
    """A CA (if missing) and every missing or unusable default certificate."""
    d = Path(args.dir)
    with _Errors():
        written = tls.ensure(d, tls.DEFAULT_IDENTITIES, args.host or tls.DEFAULT_HOSTS)
    for identity in ("ca", *tls.DEFAULT_IDENTITIES):
        print(f"{'wrote' if identity in written else 'kept '} {d / identity}.pem")
    return 0


async def cmd_issue(args: argparse.Namespace) -> int:
    """A certificate for a new identity; an existing one is left to rotate."""
    d = Path(args.dir)
    with _Errors():
        path = tls.cert_path(d, args.identity)
        _need_ca(d)
        if path.exists():
            raise CliError(f"{path} exists; use `galaxy certs rotate` to replace it")
        tls.issue(d, args.identity, _hosts(args, args.identity))
    print(f"wrote {path}")
    return 0


async def cmd_rotate(args: argparse.Namespace) -> int:
    """A new key and certificate for an existing identity."""
    d = Path(args.dir)
    with _Errors():
        path = tls.cert_path(d, args.identity)
        _need_ca(d)
        if not path.exists():
            raise CliError(f"{path} does not exist; use `galaxy certs issue` first")
        tls.rotate(d, args.identity, args.host)
    print(f"wrote {path} (new key; processes pick it up when they next start)")
    return 0


async def cmd_show(args: argparse.Namespace) -> int:
    """One line per certificate: identity, SANs, end of validity, problems."""
    d = Path(args.dir)
    with _Errors():
        _need_ca(d)
        ca = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
        print(f"{'ca':<13} {ca.subject.rfc4514_string()}  not after {_when(ca)}{_problems(ca, ca)}")
        for path, cert in _certs(d):
            name = tls.describe(cert)["identity"] or "(no Galaxy identity)"
            sans = ", ".join(_san_text(g) for g in tls.sans(cert))
            # A file not named after its identity is pointed out by name.
            where = "" if path == d / f"{name}.pem" else f"  [{path.relative_to(d)}]"
            print(f"{name:<13} {sans}  not after {_when(cert)}{_problems(cert, ca)}{where}")
    return 0


def _certs(d: Path) -> Iterator[tuple[Path, x509.Certificate]]:
    """Every certificate under d except the CA's, in name order."""
    for path in sorted(d.rglob("*.pem")):
        if path.name.endswith("-key.pem") or path == d / "ca.pem" or path.name.startswith("."):
            continue
        try:
            yield path, x509.load_pem_x509_certificate(path.read_bytes())
        except ValueError:
            raise CliError(f"{path}: not a PEM certificate") from None


def _san_text(g: x509.GeneralName) -> str:
    if isinstance(g, x509.UniformResourceIdentifier):
        return str(g.value)
    label = {x509.DNSName: "DNS", x509.IPAddress: "IP"}.get(type(g), type(g).__name__)
    return f"{label}:{g.value}"


def _when(cert: x509.Certificate) -> str:
    return cert.not_valid_after_utc.strftime("%Y-%m-%d %H:%M UTC")


def _problems(cert: x509.Certificate, ca: x509.Certificate) -> str:
    """ "  (EXPIRED, ...)" for what would make a peer refuse cert, else ""."""
    out = []
    if cert.not_valid_after_utc <= datetime.datetime.now(datetime.UTC):
        out.append("EXPIRED")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        out.append("NOT ISSUED BY ca.pem")
    return f"  ({', '.join(out)})" if out else ""
