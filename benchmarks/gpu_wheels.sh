#!/usr/bin/env bash
# Download the small wheels benchmarks/gpu_smoke.sh needs on a bare GPU machine (CPython 3.12,
# manylinux x86_64; torch, transformers, accelerate and peft are already there) into the
# git-ignored .gpu-wheels/, at the versions of requirements/cpu.lock (~27 MiB in all, botocore
# most of it):
#   pydantic (+ core, annotated-types, typing-inspection, typing-extensions): contract.spec
#   trl, datasets (+ dill, multiprocess, fsspec's pinned version): the TRL comparison
#   the service part (benchmarks/gpu_service.py; the import closure of the API, the embedded
#   worker and the SDK, measured): fastapi, starlette, annotated-doc, uvicorn, python-multipart,
#   sqlalchemy, alembic, mako, pydantic-settings, python-dotenv, tenacity, orjson,
#   prometheus-client, boto3 (+ botocore, s3transfer, jmespath: storage imports them), and
#   math-verify (+ latex2sympy2-extended, antlr4-python3-runtime) for the math evaluation's
#   verifier child (trainer/rewards/_verify_child.py)
# pyarrow, pandas, xxhash, and httpx, click and h11 come from the GPU image (datasets needs
# pyarrow >= 24).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PKGS="pydantic pydantic-core annotated-types typing-inspection typing-extensions trl datasets dill multiprocess fsspec
fastapi starlette annotated-doc uvicorn python-multipart sqlalchemy alembic mako pydantic-settings
python-dotenv tenacity orjson prometheus-client boto3 botocore s3transfer jmespath
math-verify latex2sympy2-extended antlr4-python3-runtime"
reqs=()
for p in $PKGS; do
    v=$(grep -i "^$p==" requirements/cpu.lock | head -1 | cut -d= -f3)
    [ -n "$v" ] || { echo "$p is not in requirements/cpu.lock" >&2; exit 1; }
    reqs+=("$p==$v")
done
platforms=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64 manylinux1_x86_64 any; do
    platforms+=(--platform "$p")
done
mkdir -p .gpu-wheels
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .gpu-wheels "${reqs[@]}"
ls .gpu-wheels && du -sh .gpu-wheels
