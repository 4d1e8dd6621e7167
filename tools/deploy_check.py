"""Static consistency checks of the deploy files (no Docker daemon, no base images needed).

    python tools/deploy_check.py        # prints every problem, exit 1 if any

What is checked, per Dockerfile stage and manifest (each function returns a list of problems):

* the Python a stage uses (apt packages, venv, the python:X.Y base) is the one its base image
  ships (Ubuntu 24.04: 3.12) and the one its lock file was resolved for (lock header);
* a CUDA base image has the CUDA major of the lock's torch (nvidia-cuda-runtime pin); a stage
  without CUDA installs no CUDA torch;
* locks are installed with --no-deps (-r) or used as constraints (-c), exist and were COPY'd
  first; every `.[extra]` exists in pyproject.toml; every COPY source exists;
* a stage that installs Triton (the CUDA lock) has gcc, libc headers and Python.h;
* the `docker build ... --target T -t IMAGE` lines in the Dockerfiles' headers name real
  targets; docker-compose builds name existing files and targets (a multi-stage file needs one);
* Kubernetes and compose: images come from those build lines, WORKER_GPUS values parse
  (worker.gpus), a declared GPU count equals the pod's nvidia.com/gpu limit, CPU-only workers
  request no GPU, every queue exists and the cpu, gpu and ingress queues all have a consumer.
"""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `python tools/deploy_check.py`
    sys.path.insert(0, str(ROOT))

from tools.deploy_trainjob import check_trainjob, check_worker_account  # noqa: E402
from worker.gpus import parse_worker_gpus  # noqa: E402  (needs the path set above)
from worker.routing import CPU_QUEUE, GPU_QUEUE  # noqa: E402

INGRESS = "celery"
QUEUES = {INGRESS, CPU_QUEUE, GPU_QUEUE}
UBUNTU_PYTHON = {"20.04": "3.8", "22.04": "3.10", "24.04": "3.12", "26.04": "3.14"}
DOCKERFILES = ("deploy/worker.Dockerfile", "deploy/api.Dockerfile")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def runs(self) -> list[str]:
        return [arg for op, arg in self.instructions if op == "RUN"]


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages with their instructions (continuation lines joined, comments dropped)."""
    logical, buf = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not buf:
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        buf += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            if buf.strip():
                logical.append(buf.strip())
            buf = ""
    stages: list[Stage] = []
    for inst in logical:
        op, _, arg = inst.partition(" ")
        op = op.upper()
        if op == "FROM":
            words = arg.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name, words[0]))
        elif stages:
            stages[-1].instructions.append((op, arg.strip()))
    return stages


def build_lines(text: str) -> list[tuple[str, str | None, str]]:
    """(dockerfile, target, image) of each `docker build` line in the file's comments."""
    out = []
    for line in text.splitlines():
        if "docker build" not in line:
            continue
        words = shlex.split(line.lstrip("# ").strip())
        i = words.index("build")
        args = words[i + 1 :]
        opt = {args[j]: args[j + 1] for j in range(len(args) - 1) if args[j].startswith("-")}
        out.append((opt.get("-f", ""), opt.get("--target"), opt.get("-t", "")))
    return out


def lock_header_python(lock: Path) -> str | None:
    m = re.search(r"#\s*CPython (\d+\.\d+)", lock.read_text())
    return m.group(1) if m else None


def lock_pins(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def base_python(base: str) -> str | None:
    m = re.match(r"(?:docker\.io/)?(?:library/)?python:(\d+\.\d+)", base)
    if m:
        return m.group(1)
    m = re.search(r"ubuntu(\d+\.\d+)", base)
    return UBUNTU_PYTHON.get(m.group(1)) if m else None


def cuda_major_of_base(base: str) -> int | None:
    m = re.match(r"(?:nvcr\.io/)?nvidia/cuda:(\d+)\.", base)
    return int(m.group(1)) if m else None


def installed_locks(stage: Stage) -> list[tuple[str, str]]:
    """(flag, path) of every -r/-c lock file a pip install of this stage reads."""
    out = []
    for run in stage.runs():
        for flag, path in re.findall(r"(-r|-c)\s+(\S+\.lock)", run):
            out.append((flag, path))
    return out


def check_stage(stage: Stage, root: Path = ROOT) -> list[str]:
    where = f"stage {stage.name} ({stage.base})"
    problems: list[str] = []
    py = base_python(stage.base)
    runs = " ".join(stage.runs())
    if py is None:
        problems.append(f"{where}: cannot tell which Python the base image ships")
    for used in sorted(set(re.findall(r"python(\d+\.\d+)", runs))):
        if used != py:
            problems.append(f"{where}: uses python{used} but the base image ships {py}")
    copied = [
        src for op, arg in stage.instructions if op == "COPY" for src in shlex.split(arg)[:-1]
    ]
    for src in copied:
        if not src.startswith("--") and not (root / src).exists():
            problems.append(f"{where}: COPY {src}: no such path in the repository")
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    for extras in re.findall(r"\.\[([\w,-]+)\]", runs):
        for extra in extras.split(","):
            if extra not in pyproject["optional-dependencies"]:
                problems.append(f"{where}: installs .[{extra}], not an extra of pyproject.toml")
    cuda = cuda_major_of_base(stage.base)
    for flag, path in installed_locks(stage):
        lock = root / path
        if not lock.exists():
            problems.append(f"{where}: installs {path}, which does not exist")
            continue
        if path not in copied and not any(Path(c) in Path(path).parents for c in copied):
            problems.append(f"{where}: reads {path} without COPYing it first")
        if flag == "-r" and not re.search(rf"--no-deps[^&;]*-r\s+{re.escape(path)}", runs):
            problems.append(f"{where}: {path} must be installed with --no-deps (exactly the lock)")
        lock_py = lock_header_python(lock)
        if lock_py != py:
            problems.append(f"{where}: {path} was resolved for CPython {lock_py}, image has {py}")
        pins = lock_pins(lock)
        torch = pins.get("torch")
        runtime = pins.get("nvidia-cuda-runtime") or pins.get("nvidia-cuda-runtime-cu12")
        torch_cuda = (
            int(runtime.split(".")[0]) if runtime and torch and "+cpu" not in torch else None
        )
        if cuda is not None and flag == "-r":
            if torch_cuda is None:
                problems.append(f"{where}: a CUDA base image installing a lock without CUDA torch")
            elif torch_cuda != cuda:
                problems.append(
                    f"{where}: CUDA {cuda} base image, but torch {torch} in {path} is built for "
                    f"CUDA {torch_cuda} (nvidia-cuda-runtime {runtime})"
                )
        if cuda is None and flag == "-r" and torch_cuda is not None:
            problems.append(f"{where}: installs CUDA torch ({path}) on a base without CUDA")
        if flag == "-r" and "triton" in pins:
            needs = ["gcc", "libc6-dev", f"python{py}-dev"] if cuda else []
            for pkg in needs:
                if not re.search(rf"\b{re.escape(pkg)}\b", runs):
                    problems.append(f"{where}: Triton compiles at the first kernel; install {pkg}")
        if "+cpu" in (torch or "") and flag == "-r" and "--extra-index-url" not in runs:
            problems.append(f"{where}: torch {torch} comes from PyTorch's CPU index only")
    for op, arg in stage.instructions:
        found = re.search(r"WORKER_GPUS=(\S*)", arg) if op == "ENV" else None
        if found:
            problems += _gpus_value(f"{where}: ENV", found.group(1))
    return problems


def _gpus_value(where: str, value: str) -> list[str]:
    try:
        parse_worker_gpus(value)
    except ValueError as exc:
        return [f"{where}: {exc}"]
    return []


def check_dockerfile(path: str, root: Path = ROOT, text: str | None = None) -> list[str]:
    text = (root / path).read_text() if text is None else text
    stages = parse_dockerfile(text)
    problems = [p for s in stages for p in check_stage(s, root)]
    names = {s.name for s in stages}
    for file, target, image in build_lines(text):
        if file != path:
            problems.append(f"{path}: its build line builds {file}")
        if target is None and len(stages) > 1:
            problems.append(f"{path}: `docker build -t {image}` needs --target (several stages)")
        if target is not None and target not in names:
            problems.append(f"{path}: build line names target {target}; stages: {sorted(names)}")
    return problems


def built_images(root: Path = ROOT) -> dict[str, tuple[str, str | None]]:
    """image → (dockerfile, target) from the Dockerfiles' build lines."""
    out = {}
    for path in DOCKERFILES:
        for file, target, image in build_lines((root / path).read_text()):
            out[image] = (file, target)
    return out


def _queues(args: list[str]) -> set[str]:
    for flag in ("-Q", "--queues"):
        if flag in args:
            return set(args[args.index(flag) + 1].split(","))
    return set(QUEUES)  # python -m worker / celery without -Q: every declared queue


def _env_value(env, name: str) -> str | None:
    if isinstance(env, dict):
        return None if env.get(name) is None else str(env[name])
    for item in env or []:
        if item.get("name") == name:
            return str(item.get("value", ""))
    return None


def _is_beat(args: list[str]) -> bool:
    return "celery" in args and "beat" in args


def _one_beat(where: str, replicas: list[int]) -> list[str]:
    """The storage sweep is sent by Celery beat: none means nothing sweeps, two send it twice."""
    if sum(replicas) != 1:
        return [f"{where}: {sum(replicas)} Celery beat processes; run exactly one (the sweep)"]
    return []


def check_compose(root: Path = ROOT, text: str | None = None) -> list[str]:
    doc = yaml.safe_load((root / "docker-compose.yml").read_text() if text is None else text)
    problems: list[str] = []
    consumed: set[str] = set()
    beats = [1 for svc in doc["services"].values() if _is_beat(svc.get("command") or [])]
    problems += _one_beat("compose", beats)
    for name, svc in doc["services"].items():
        build = svc.get("build")
        if isinstance(build, dict):
            file = build.get("dockerfile", "Dockerfile")
            if not (root / file).exists():
                problems.append(f"compose {name}: no {file}")
                continue
            stages = {s.name for s in parse_dockerfile((root / file).read_text())}
            target = build.get("target")
            if target is None and len(stages) > 1:
                problems.append(
                    f"compose {name}: {file} has stages {sorted(stages)}; name a target"
                )
            if target is not None and target not in stages:
                problems.append(f"compose {name}: target {target} not in {file}")
        cmd = svc.get("command") or []
        if "celery" in cmd and "worker" in cmd:
            queues = _queues(cmd)
            consumed |= queues
            problems += [f"compose {name}: unknown queue {q}" for q in sorted(queues - QUEUES)]
            env = svc.get("environment") or {}
            value = _env_value(env, "WORKER_GPUS")
            if value is not None:
                problems += _gpus_value(f"compose {name}: WORKER_GPUS", value)
            if (
                GPU_QUEUE in queues
                and value is not None
                and parse_worker_gpus(value).kind == "none"
            ):
                problems.append(f"compose {name}: a CPU-only worker consumes the gpu queue")
    for q in (INGRESS, CPU_QUEUE):
        if q not in consumed:
            problems.append(f"compose: nobody consumes the {q} queue")
    return problems


def check_k8s(root: Path = ROOT, text: str | None = None) -> list[str]:
    path = root / "deploy/k8s/humanline.yaml"
    docs = [d for d in yaml.safe_load_all(path.read_text() if text is None else text) if d]
    images = built_images(root)
    problems: list[str] = []
    consumed: set[str] = set()
    beats = [
        int(d["spec"].get("replicas", 1))
        for d in docs
        for c in ((d.get("spec") or {}).get("template", {}).get("spec") or {}).get("containers", [])
        if _is_beat(c.get("args") or c.get("command") or [])
    ]
    problems += _one_beat("k8s", beats)
    for doc in docs:
        pod = (doc.get("spec") or {}).get("template", {}).get("spec")
        if not pod:
            continue
        for c in pod.get("containers", []):
            where = f"k8s {doc['metadata']['name']}/{c['name']}"
            if c["image"] not in images:
                problems.append(f"{where}: image {c['image']} is built by no Dockerfile line")
            args = c.get("args") or c.get("command") or []
            if not ("celery" in args and "worker" in args):
                continue
            queues = _queues(args)
            consumed |= queues
            problems += check_worker_account(where, pod, c)
            problems += [f"{where}: unknown queue {q}" for q in sorted(queues - QUEUES)]
            limits = (c.get("resources") or {}).get("limits") or {}
            gpus_limit = int(limits.get("nvidia.com/gpu", 0))
            value = _env_value(c.get("env"), "WORKER_GPUS")
            target = images.get(c["image"], ("", None))[1]
            if value is None:
                problems.append(f"{where}: set WORKER_GPUS (none, all, count:N or ids:...)")
                continue
            bad = _gpus_value(f"{where}: WORKER_GPUS", value)
            if bad:
                problems += bad
                continue
            gpus = parse_worker_gpus(value)
            if gpus.kind == "count" and gpus.count != gpus_limit:
                problems.append(
                    f"{where}: WORKER_GPUS=count:{gpus.count} but nvidia.com/gpu limit {gpus_limit}"
                )
            if gpus.kind in ("all", "ids") and gpus_limit < max(1, len(gpus.ids)):
                problems.append(
                    f"{where}: WORKER_GPUS={value} but nvidia.com/gpu limit {gpus_limit}"
                )
            if gpus.kind in ("none", "inherit") and gpus_limit:
                problems.append(f"{where}: requests {gpus_limit} GPUs but WORKER_GPUS={value!r}")
            if GPU_QUEUE in queues and not gpus.declares_gpus:
                problems.append(f"{where}: consumes the gpu queue with WORKER_GPUS={value!r}")
            if GPU_QUEUE in queues and target == "cpu":
                problems.append(f"{where}: consumes the gpu queue with the CPU image")
            if gpus.declares_gpus and target == "cpu":
                problems.append(f"{where}: declares GPUs but runs the CPU image")
    for q in sorted(QUEUES - consumed):
        problems.append(f"k8s: nobody consumes the {q} queue")
    return problems


def all_problems(root: Path = ROOT) -> list[str]:

    return [
        *(p for f in DOCKERFILES for p in check_dockerfile(f, root)),
        *check_compose(root),
        *check_k8s(root),
        *check_trainjob(built_images(root), root),
    ]


def main() -> int:
    problems = all_problems()
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
