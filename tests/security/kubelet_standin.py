"""A stand-in for the kubelet and its container runtime, for the one thing
tests can do here without them: run a program under a ``Localhost`` seccomp
profile (the OCI runtime spec's JSON), as a container runtime does before it
starts the container's process. It loads the profile with libseccomp
(pyseccomp; loading a filter also sets ``no_new_privs``, as
``allowPrivilegeEscalation: false`` does), then execs the program.

Usage: python kubelet_standin.py PROFILE.json PROGRAM [ARG...]
"""

from __future__ import annotations

import json
import os
import sys

import pyseccomp

_OPS = {
    "SCMP_CMP_EQ": pyseccomp.EQ,
    "SCMP_CMP_NE": pyseccomp.NE,
    "SCMP_CMP_LT": pyseccomp.LT,
    "SCMP_CMP_LE": pyseccomp.LE,
    "SCMP_CMP_GT": pyseccomp.GT,
    "SCMP_CMP_GE": pyseccomp.GE,
    "SCMP_CMP_MASKED_EQ": pyseccomp.MASKED_EQ,
}


def _action(name: str, errno_ret: int) -> object:
    if name == "SCMP_ACT_ALLOW":
        return pyseccomp.ALLOW
    if name == "SCMP_ACT_ERRNO":
        return pyseccomp.ERRNO(errno_ret)
    raise SystemExit(f"kubelet stand-in: action {name} is not supported here")


def load(profile: dict) -> None:
    """Install profile on this process (and what it execs)."""
    f = pyseccomp.SyscallFilter(defaction=_action(profile["defaultAction"], 1))
    for rule in profile["syscalls"]:
        action = _action(rule["action"], rule.get("errnoRet", 1))
        # OCI: for MASKED_EQ, value is the mask and valueTwo the datum.
        args = [
            pyseccomp.Arg(a["index"], _OPS[a["op"]], a["value"], a.get("valueTwo", 0))
            for a in rule.get("args", [])
        ]
        for name in rule["names"]:
            try:
                f.add_rule(action, name, *args)
            except (ValueError, RuntimeError):
                pass  # not a syscall of this architecture
    f.load()


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        load(json.load(fh))
    os.execvp(sys.argv[2], sys.argv[2:])
