#!/usr/bin/env bash
# The GPU proof in one command (about 5 min on one H100; <= 10 min):
#
#     bash benchmarks/gpu_smoke.sh                # every part; see benchmarks/gpu_smoke.py
#     bash benchmarks/gpu_smoke.sh --self-check   # tiny shapes on the CPU (CI does this)
#
# For a bare GPU machine whose python3 has torch, transformers, accelerate and peft but nothing
# else of ours (no registry there): run benchmarks/gpu_wheels.sh where pip works, carry the
# git-ignored .gpu-wheels/ along, and this script installs them into /tmp first. The last line
# printed is one JSON object with every figure and its target; exit status 0 = all met.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import pydantic, trl, datasets, fastapi, sqlalchemy, uvicorn, math_verify" 2>/dev/null; then
    if compgen -G ".gpu-wheels/*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/humanline-site .gpu-wheels/*.whl
        export PYTHONPATH=/tmp/humanline-site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "packages missing (pydantic, trl, fastapi, ...): run benchmarks/gpu_wheels.sh and carry .gpu-wheels/" >&2
    fi
fi
export PYTHONPATH=$PWD:$PWD/client${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu_smoke.py "$@"
