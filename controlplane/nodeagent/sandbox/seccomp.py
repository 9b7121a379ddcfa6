"""The seccomp filter of bubblewrap sandboxes, compiled with libseccomp.

The list follows Docker's published default profile (moby/profiles,
``seccomp/default.json``) in the inverse direction: Docker allows a long list
and refuses the rest; this filter allows everything except the system calls
that profile refuses to a container without capabilities, so a new harmless
syscall in a newer libc keeps working. Refused calls fail with EPERM (not a
kill): a runtime that probes for a feature gets a clean error.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyseccomp

# Syscalls Docker's default profile does not give an unprivileged container:
# kernel modules, mounts and namespaces, other processes' memory, keyrings,
# BPF and perf, clocks, swap, reboot, accounting, raw I/O ports, the
# file-handle API used by the "shocker" escape, and userfaultfd (a staple of
# kernel exploits).
DENIED = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module",
    "delete_module", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick",
    "get_kernel_syms", "get_mempolicy", "init_module", "ioperm", "iopl", "kcmp",
    "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "mbind", "mount",
    "mount_setattr", "move_mount", "move_pages", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "open_tree", "perf_event_open", "personality", "pivot_root",
    "process_vm_readv", "process_vm_writev", "ptrace", "query_module", "quotactl",
    "quotactl_fd", "reboot", "request_key", "set_mempolicy", "setns", "settimeofday",
    "stime", "swapoff", "swapon", "sysfs", "syslog", "umount", "umount2", "unshare",
    "uselib", "userfaultfd", "ustat", "vhangup", "vm86", "vm86old",
)  # fmt: skip
_CLONE_NEWUSER = 0x10000000
_TIOCSTI = 0x5412  # push bytes into a terminal's input: a classic sandbox escape


def _rule(f: pyseccomp.SyscallFilter, name: str, *args: pyseccomp.Arg) -> None:
    try:
        f.add_rule(pyseccomp.ERRNO(errno.EPERM), name, *args)
    except (ValueError, RuntimeError):
        pass  # not a syscall of this architecture (e.g. vm86 on x86-64)


def build_filter() -> pyseccomp.SyscallFilter:
    """The filter: allow by default, EPERM for DENIED, new user namespaces
    through clone, and TIOCSTI."""
    f = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    for name in DENIED:
        _rule(f, name)
    # clone with CLONE_NEWUSER: a new user namespace gives its creator every
    # capability inside it, the first step of many kernel exploits. (clone3
    # passes flags in memory a filter cannot read; Docker refuses it with
    # ENOSYS so that libc falls back to clone, and so does this filter.)
    _rule(f, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, _CLONE_NEWUSER, _CLONE_NEWUSER))
    try:
        f.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    except (ValueError, RuntimeError):
        pass
    _rule(f, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, _TIOCSTI))
    return f


def write_bpf(directory: Path) -> Path:
    """Compile the filter to classic BPF (what ``bwrap --seccomp FD`` reads)
    in a new file of directory; its path."""
    fd, name = tempfile.mkstemp(prefix="seccomp-", suffix=".bpf", dir=directory)
    with os.fdopen(fd, "wb") as out:
        build_filter().export_bpf(out)
    return Path(name)


# What bubblewrap itself does to build a sandbox, refused above to what runs
# inside it: new namespaces (clone/unshare with CLONE_NEW*), the sandbox's
# mounts and its new root. An agent that is not root runs bwrap under its
# container's seccomp profile, so that profile must allow exactly these.
BWRAP_NEEDS = ("mount", "umount", "umount2", "pivot_root", "unshare")
#: The file deploy/ ships: the node agent container's Localhost profile.
AGENT_PROFILE = "galaxy-nodeagent.json"
_ARCHES = (
    "SCMP_ARCH_X86_64",
    "SCMP_ARCH_X86",
    "SCMP_ARCH_X32",
    "SCMP_ARCH_AARCH64",
    "SCMP_ARCH_ARM",
)


def agent_profile() -> dict[str, Any]:
    """The seccomp profile of the node agent's container on Kubernetes (the
    OCI runtime spec's JSON, what a ``Localhost`` profile holds): the
    instances' filter without what bubblewrap needs to build a sandbox
    (``BWRAP_NEEDS``, and clone with CLONE_NEWUSER). Each sandbox then loads
    the full filter for what runs inside it."""
    denied = [n for n in DENIED if n not in BWRAP_NEEDS]
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": list(_ARCHES),
        "syscalls": [
            {"names": denied, "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
            {
                "names": ["ioctl"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": errno.EPERM,
                "args": [
                    {
                        "index": 1,
                        "value": 0xFFFFFFFF,
                        "valueTwo": _TIOCSTI,
                        "op": "SCMP_CMP_MASKED_EQ",
                    }
                ],
            },
        ],
    }


if __name__ == "__main__":
    # Regenerates the shipped profile: python -m controlplane.nodeagent.sandbox.seccomp
    json.dump(agent_profile(), sys.stdout, indent=2)
    sys.stdout.write("\n")
