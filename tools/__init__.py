"""Developer and operator tools, run from the repo root; nothing of the service imports them.
Each is one file:

    lock            `python tools/lock.py`: resolve requirements/cpu.lock and gpu.lock
    deploy_check    `python tools/deploy_check.py`: static checks of the Dockerfiles and manifests
    deploy_trainjob the checks of deploy/k8s/trainjob.yaml (run by deploy_check)
    openai_server   `python -m tools.openai_server`: an OpenAI-compatible chat server over a
                    local model (the offline judge of instruction evaluations, and in tests)
"""
