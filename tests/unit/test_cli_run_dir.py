"""`--run-dir` is read before or after the command; a taken gateway port is
a one-line hint, not a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from controlplane.launch.up import gateway_port_free
from controlplane.tools.cli import build_parser


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "--run-dir", "/tmp/rd"],
        ["--run-dir", "/tmp/rd", "up"],
        ["status", "--run-dir=/tmp/rd"],
    ],
)
def test_run_dir_before_or_after_the_command(argv: list[str]) -> None:
    assert build_parser(argv).parse_args(argv).run_dir == "/tmp/rd"


def test_run_dir_default_stands_without_it() -> None:
    default = build_parser([]).get_default("run_dir")
    assert build_parser(["up"]).parse_args(["up"]).run_dir == default


def _taken() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_taken_gateway_port_names_the_way_out() -> None:
    with _taken() as s:
        port = s.getsockname()[1]
        with pytest.raises(RuntimeError) as e:
            gateway_port_free("127.0.0.1", port)
    assert f"--gateway-port {port}" in str(e.value) and "--gateway-port 0" in str(e.value)


@pytest.mark.slow  # a real `galaxy serve gateway` subprocess
def test_gateway_on_a_taken_port_says_so_in_one_line() -> None:
    with _taken() as s:
        listen = f"127.0.0.1:{s.getsockname()[1]}"
        out = subprocess.run(
            [sys.executable, "-m", "controlplane.tools.cli", "serve", "gateway",
             "--controller", "127.0.0.1:1", "--insecure", "--listen", listen],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 2
    assert f"--listen {listen}: cannot listen" in out.stderr
    assert "Traceback" not in out.stderr
