"""How an attempt's ranks are started and followed: one interface (base.Launcher), two
implementations (local subprocess, Kubeflow Trainer TrainJob)."""

from worker.launchers.base import Launcher, LauncherError, LaunchRequest, LaunchState, LaunchStatus

__all__ = ["LaunchRequest", "LaunchState", "LaunchStatus", "Launcher", "LauncherError"]
