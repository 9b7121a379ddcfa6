"""Instances can run as an unprivileged user instead of the agent's (often
root) user: a real process whose kernel credentials are checked."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from controlplane.nodeagent.sandbox import ProcessBackend
from controlplane.nodeagent.sandbox.cgroups import open_cgroups
from controlplane.nodeagent.sandbox.process import run_as_prefix
from tests.nodeagent.conftest import echo_spec

SYSTEM_PYTHON = "/usr/bin/python3"  # readable by any user (a pyenv one may sit in /root)
SERVE = (
    "import os, socket, time\n"
    "s = socket.socket(); s.bind((os.environ['HOST'], int(os.environ['PORT']))); s.listen()\n"
    "time.sleep(60)\n"
)


def _cgroup(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def _uids(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError("no Uid line")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs a root agent")
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs the system python3")
async def test_instance_runs_as_the_configured_user(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    # With cgroups too when they can be made: the launcher joins the group as
    # root, then setpriv drops to the user before the function's code runs.
    backend = ProcessBackend(log_dir=tmp_path, user="nobody", cgroups=open_cgroups("auto"))
    spec = echo_spec()
    spec.command[:] = [SYSTEM_PYTHON, "-c", SERVE]
    spec.workdir = "/"
    spec.readiness_path = ""
    try:
        sb = await backend.start("n-0", "as-nobody", spec)
        assert _uids(sb.pid or 0) == [nobody.pw_uid] * 4  # real, effective, saved, fs
        assert os.geteuid() == 0  # the agent itself kept its user
        if backend.cgroups is not None:
            assert "as-nobody" in _cgroup(sb.pid or 0)
    finally:
        await backend.close()


def test_unknown_user_or_no_right_to_switch_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError) as e:
        run_as_prefix("no-such-user-here")
    assert "--instance-user" in str(e.value)
    if os.geteuid() == 0:
        prefix = run_as_prefix(str(pwd.getpwnam("nobody").pw_uid))
        assert prefix[0].endswith("setpriv") and "--clear-groups" in prefix
