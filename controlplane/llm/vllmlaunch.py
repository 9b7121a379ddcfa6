"""The vllm-cpu runtime's entry: vLLM's OpenAI server on a packed model file.

The node agent hands the runtime the cached model file (``{model}``, one
safetensors file whose header carries ``config.json`` and the tokenizer:
``vllmmodel``). This writes those small files into the instance's private
directory beside a symlink to the cached weights (no copy), sets vLLM's CPU
defaults where the spec's env left them unset, and replaces itself with
``python -m vllm.entrypoints.openai.api_server`` on ``$HOST:$PORT`` with
the same interpreter (the vLLM virtualenv's)::

    python -m controlplane.llm.vllmlaunch --model FILE [vLLM flags...]

Standard library only: it runs in the vLLM virtualenv, which need not have
Galaxy's dependencies.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from controlplane.llm.vllmmodel import PackError, small_files

#: vLLM's CPU settings when the spec's env does not set them: the KV cache's
#: size in GiB (vLLM's default, 4, is more than a small node gives one
#: instance), and no usage report to the outside (this network has none)
CPU_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
#: the checkpoint's weights file, a symlink to the cached packed file
WEIGHTS = "model.safetensors"


def unpack(model: Path, into: Path) -> Path:
    """A checkpoint directory for vLLM under ``into``: the packed small files
    written out, the weights a symlink to ``model``."""
    files = small_files(model)
    ckpt = into / "checkpoint"
    ckpt.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (ckpt / name).write_text(text)
    link = ckpt / WEIGHTS
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(model.resolve())
    return ckpt


def environment(base: Mapping[str, str], threads: int) -> dict[str, str]:
    """The server's environment: ``base`` with the CPU defaults filled in
    (the spec's env wins), and torch's thread count."""
    env = dict(base)
    for k, v in CPU_DEFAULTS.items():
        env.setdefault(k, v)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


def server_argv(python: str, ckpt: Path, env: Mapping[str, str], rest: list[str]) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` on the checkpoint,
    listening where the node agent said, with ``rest`` (the spec's flags)."""
    name = env.get("GALAXY_FUNCTION", "") or "model"
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ckpt)]
    argv += ["--host", env.get("HOST", "127.0.0.1"), "--port", env.get("PORT", "8000")]
    if not any(a.startswith("--served-model-name") for a in rest):
        argv += ["--served-model-name", name]
    return argv + rest


def main(argv: list[str] | None = None) -> int:
    """Unpack the model and exec vLLM's server (returns only on an error)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="the packed model file (the node cache's)")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS unless the env sets it")
    args, rest = p.parse_known_args(argv)
    base = os.environ.get("GALAXY_INSTANCE_DIR") or tempfile.mkdtemp(prefix="galaxy-vllm-")
    try:
        ckpt = unpack(Path(args.model), Path(base))
    except (OSError, PackError) as e:
        print(f"vllmlaunch: {e}", file=sys.stderr)
        return 2
    env = environment(os.environ, args.threads)
    cmd = server_argv(sys.executable, ckpt, env, rest)
    sys.stdout.flush()
    os.execve(cmd[0], cmd, env)
    return 1  # pragma: no cover - execve does not return


if __name__ == "__main__":
    raise SystemExit(main())
