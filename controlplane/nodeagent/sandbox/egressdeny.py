"""What an instance with egress may not reach: a deny list of networks,
enforced by nftables inside the instance's own network namespace.

slirp4netns turns the instance's connections into sockets of the node, so
without a deny list an instance reaches whatever the node reaches, a
cloud's metadata service (169.254.169.254: the node's credentials) first of
all. Routes cannot deny it: a socket bound to the tap device
(``SO_BINDTODEVICE``, open to any user since Linux 5.7) is sent past a
``prohibit`` route or rule as if the address were on the link (tried: it
connects). An nftables rule on the namespace's output hook sees every
packet the instance sends, and the instance cannot remove it (it holds no
capability in the namespace). A denied TCP connection fails at once with
``EHOSTUNREACH`` (``admin-prohibited``), a UDP send with ``EPERM``.

The rules are loaded with libnftables (Debian's ``libnftables1``, the
library the ``nft`` command is built on). A root agent loads them from its
own thread, entering the namespace and coming back (``load``, ~0.5 ms). An
agent that is not root must enter the user namespace that owns it first,
which only a process of one thread may: it runs this file as a helper
(``python3 -I -S egressdeny.py``, standard library only; ~15 ms) with both
namespaces' descriptors. ``nsenter`` then ``nft`` would not do: the
capabilities a user namespace gives are lost at that exec.
"""

from __future__ import annotations

import sys

#: Link-local IPv4 (the metadata services of AWS, GCP, Azure and OpenStack
#: at 169.254.169.254, AWS's container credentials at 169.254.170.2) and
#: AWS's IPv6 metadata address.
DEFAULT = "169.254.0.0/16,fd00:ec2::254/128"
#: Entries a list may hold (the rules are one set per family).
MAX_ENTRIES = 256
#: nftables' library: what loads the rules (the `nft` command is built on it).
LIBRARY = "libnftables.so.1"
#: The nftables table made in the instance's namespace.
TABLE = "galaxy_egress"


def parse(text: str) -> tuple[str, ...]:
    """The networks of a comma-separated list (``''``: none), normalised;
    ValueError naming the entry that is not a network."""
    import ipaddress

    nets: list[str] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        shown = repr(item[:64]) + ("..." if len(item) > 64 else "")
        try:
            net = ipaddress.ip_network(item)
        except ValueError:
            try:
                meant = ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{shown} is not a network (CIDR, e.g. 169.254.0.0/16)") from None
            raise ValueError(f"{shown} has host bits set (the network is {meant})") from None
        if str(net) not in nets:
            nets.append(str(net))
    if len(nets) > MAX_ENTRIES:
        raise ValueError(f"at most {MAX_ENTRIES} networks, got {len(nets)}")
    return tuple(nets)


def ruleset(nets: tuple[str, ...], ipv6: bool = True) -> str:
    """The nftables script that denies nets (from ``parse``). ipv6: the
    node has IPv6 (a kernel booted without it has no ``inet`` family's IPv6
    half: the table is then IPv4's alone, and IPv6 entries, which such an
    instance cannot reach anyway, are left out)."""
    v4 = [n for n in nets if ":" not in n]
    v6 = [n for n in nets if ":" in n] if ipv6 else []
    # (icmpx: either family's "administratively prohibited"; an ip table has icmp's)
    reject = "icmpx" if ipv6 else "icmp"
    rules = [
        f"{fam} daddr {{ {', '.join(group)} }} reject with {reject} type admin-prohibited"
        for fam, group in (("ip", v4), ("ip6", v6))
        if group
    ]
    body = "\n".join(f"    {r}" for r in rules)
    return (
        f"table {'inet' if ipv6 else 'ip'} {TABLE} {{\n  chain out {{\n"
        "    type filter hook output priority filter; policy accept;\n"
        f"{body}\n  }}\n}}\n"
    )


def has_ipv6() -> bool:
    """Whether this kernel has IPv6 (not booted with ``ipv6.disable=1``)."""
    import os

    return os.path.exists("/proc/sys/net/ipv6")


def unusable() -> str | None:
    """Why this node cannot enforce a deny list (None: it can)."""
    import ctypes

    try:
        ctypes.CDLL(LIBRARY)
    except OSError:
        return (
            f"nftables' library ({LIBRARY}) is not installed (Debian: apt-get install "
            "nftables), and the egress deny list needs it (or --instance-egress-deny '')"
        )
    return None


_NEWUSER, _NEWNET = 0x10000000, 0x40000000  # setns(2)'s namespace kinds


def _setns(fd: int, kind: int) -> None:
    import ctypes
    import os

    if ctypes.CDLL(None, use_errno=True).setns(fd, kind) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def apply(script: str) -> str | None:
    """Load script into this thread's network namespace; nft's error, or None."""
    import ctypes

    nft = ctypes.CDLL(LIBRARY)
    nft.nft_ctx_new.restype = ctypes.c_void_p
    nft.nft_ctx_free.argtypes = [ctypes.c_void_p]
    nft.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    nft.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    nft.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    nft.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    ctx = nft.nft_ctx_new(0)
    if not ctx:
        return "nft_ctx_new failed"
    try:
        nft.nft_ctx_buffer_error(ctx)
        if nft.nft_run_cmd_from_buffer(ctx, script.encode()) != 0:
            return (nft.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace").strip()
        return None
    finally:
        nft.nft_ctx_free(ctx)


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace fd."""
    _setns(fd, _NEWNET)


def load(netns: int, script: str) -> str | None:
    """Load script into the network namespace netns (an fd) from the
    calling thread, which comes back home before anything else runs on it
    (an agent that may enter other namespaces, root: ~0.5 ms, against ~15
    ms for the helper process). nft's error, or None."""
    import os

    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(netns, _NEWNET)
        try:
            return apply(script)
        finally:
            _setns(home, _NEWNET)
    finally:
        os.close(home)


def _helper(netns: int, userns: int | None, script: str) -> str | None:
    # A process of its own: entering a user namespace needs one thread.
    try:
        if userns is not None:
            _setns(userns, _NEWUSER)
        _setns(netns, _NEWNET)
    except OSError as e:
        return str(e)
    return apply(script)


if __name__ == "__main__":
    # argv: NETNS_FD [USERNS_FD]; the script on stdin; the error on stderr.
    user = int(sys.argv[2]) if len(sys.argv) > 2 else None
    error = _helper(int(sys.argv[1]), user, sys.stdin.read())
    if error:
        sys.stderr.write(error[:2000] + "\n")
        sys.exit(1)
