"""The escape suite against the Kubernetes-shaped node agent: the same
hostile function and neighbour as tests/security/test_escape.py, and the
same checks, but the agent runs as the DaemonSet runs it (its exact
arguments: --sandbox bwrap, --cgroups on in a delegated subtree; not root;
the Localhost seccomp profile applied; tests/security/k8s_agent.py). Its
instances get a user namespace from bubblewrap instead of a uid of their
own, and the entry reaches them through the socket factory instead of
setns."""

from __future__ import annotations

import pytest

from tests.nodeagent.delegation import delegated_subtree, skip_reason, unprivileged
from tests.security.k8s_agent import K8sShapedUp
from tests.security.test_escape import (  # noqa: F401 - the suite's checks, run here again
    deploy_probe_and_victim,
    report,
    test_control_plane_secrets_and_neighbours_files_are_not_there,
    test_disk_hog_is_stopped_and_the_neighbour_answers,
    test_fork_loop_is_stopped_and_the_neighbour_answers,
    test_from_the_node_an_instance_without_a_lease_is_refused,
    test_holds_no_socket_it_did_not_make,
    test_memory_hog_is_stopped_and_the_neighbour_answers,
    test_no_direct_http_call_reaches_another_tenants_instance,
    test_no_signal_reaches_another_process,
    test_proc_shows_only_its_own_processes,
    test_the_filesystem_shows_only_what_it_needs,
    victim,
)

_SKIP = skip_reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    user = unprivileged()
    assert user is not None
    with delegated_subtree(user) as d:
        g = K8sShapedUp(tmp_path_factory.mktemp("run"), "--nodes", "0")
        g.start()
        try:
            g.start_agent(user, d)
            deploy_probe_and_victim(g, tmp_path_factory.mktemp("specs"))
            yield g
        finally:
            pids = g.pids()
            g.stop_agent()
            g.stop()
            assert not g.kill_leftovers(pids)


def test_runs_unprivileged_in_a_user_namespace(report, victim, up):  # noqa: F811 - fixtures
    """What differs from a root agent: with no CAP_SETUID (and no setuid
    helper: no_new_privs) an agent cannot give each instance a host uid of
    its own, so its instances share its uid, each in a user namespace of its
    own with no capability. What keeps them apart is the rest of this suite
    (own mount, PID and network namespaces; no signal, file or port of the
    neighbour reachable)."""
    assert report["uid"] != 0 and report["euid"] != 0
    assert int(report["cap_eff"], 16) == 0 and int(report["cap_bnd"], 16) == 0
    assert report["no_new_privs"] == "1"
    assert report["seccomp"] == "2"
    user = unprivileged()
    assert user is not None and up.agent is not None and victim["uid"] == user.pw_uid
