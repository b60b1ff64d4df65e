"""Facts about the host that pick defaults (thread count), and the versions
of the packages installed beside pyspec."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import lru_cache


@lru_cache(maxsize=1)
def physical_cores() -> int:
    """Physical CPU cores this process may use. Hyper-threads share a core's
    matmul units, so llama.cpp runs fastest with one thread per physical core."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(_physical_cores_on_host(), allowed))


def _physical_cores_on_host() -> int:
    try:
        if sys.platform.startswith("linux"):
            cores = set()
            phys = core = None
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    key = key.strip()
                    if key == "physical id":
                        phys = value.strip()
                    elif key == "core id":
                        core = value.strip()
                    elif not line.strip():
                        if core is not None:
                            cores.add((phys, core))
                        phys = core = None
            if core is not None:
                cores.add((phys, core))
            if cores:
                return len(cores)
        elif sys.platform == "darwin":
            out = subprocess.run(["sysctl", "-n", "hw.physicalcpu"], capture_output=True, text=True, check=True)
            return max(1, int(out.stdout.strip()))
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return max(1, os.cpu_count() or 1)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS's choice)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def package_version(dist: str, missing: str = "unknown") -> str:
    """The installed version of distribution ``dist`` (``missing`` when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return missing
