"""What build am I running? Versions, the libllama this process calls, llama.cpp's
features, its ggml backends and devices, and the defaults pyspec derives from them
(``pyspec info``)."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any, Dict, List

from .. import _core, cpu
from .._loader import llama_lib_path
from .._platform import package_version, physical_cores
from ..server.scheduler import DEFAULT_CACHE_RAM_MB, DEFAULT_CACHE_SLOTS

# The keys of build_info(), in display order (`pyspec info --json` keeps them stable).
KEYS = (
    "pyspec_version",
    "llama_cpp_python_version",
    "python",
    "platform",
    "libllama_path",
    "libllama_shared_with_llama_cpp",
    "libggml_path",
    "system_info",
    "backends",
    "devices",
    "gpu_offload",
    "rpc",
    "supports_mmap",
    "supports_mlock",
    "flash_attn_default",
    "llama_cpp_flash_attn_default",
    "llama_cpp_python_flash_attn_default",
    "threads",
    "cpu_kernels",
    "prompt_cache",
)


def _llama_cpp_python_flash_attn_default() -> Any:
    """The default of ``llama_cpp.Llama(flash_attn=...)`` (False in 0.3.36), read from its signature."""
    try:
        import inspect

        import llama_cpp

        return inspect.signature(llama_cpp.Llama.__init__).parameters["flash_attn"].default
    except Exception:  # noqa: BLE001 - informational only
        return None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def build_info() -> Dict[str, Any]:
    """Everything ``pyspec info`` reports, as one JSON-serialisable dict (keys: :data:`KEYS`)."""
    from .. import __version__

    expected = str(llama_lib_path())
    loaded = _core.libllama_path() or expected
    devices: List[Dict[str, Any]] = list(_core.devices())
    return {
        "pyspec_version": __version__,
        "llama_cpp_python_version": package_version("llama-cpp-python"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        # The file the extension's llama.cpp calls resolve to (dladdr), and whether it
        # is the very file llama_cpp opens (one copy of llama.cpp per process).
        "libllama_path": os.path.realpath(loaded),
        "libllama_shared_with_llama_cpp": _same_file(loaded, expected),
        "libggml_path": os.path.realpath(_core.libggml_path()) if _core.libggml_path() else "",
        "system_info": _core.llama_system_info().strip(),
        "backends": list(_core.backends()),
        "devices": devices,
        "gpu_offload": bool(_core.supports_gpu_offload()),
        # ggml's RPC backend: layers on other machines (`pyspec rpc-server`, --rpc; docs/distributed.md).
        "rpc": {"available": bool(_core.rpc_available()), "protocol": _core.rpc_protocol() or None},
        "supports_mmap": bool(_core.supports_mmap()),
        "supports_mlock": bool(_core.supports_mlock()),
        # pyspec.Model(flash_attn=...) default; llama.cpp's own context default; llama-cpp-python's.
        "flash_attn_default": "auto",
        "llama_cpp_flash_attn_default": _core.flash_attn_default(),
        "llama_cpp_python_flash_attn_default": _llama_cpp_python_flash_attn_default(),
        "threads": physical_cores(),
        "cpu_kernels": _cpu_kernels(),
        # pyspec serve's prompt cache as it starts by default (--cache-slots, --cache-ram).
        "prompt_cache": {"cache_slots": DEFAULT_CACHE_SLOTS, "cache_ram_mib": DEFAULT_CACHE_RAM_MB},
    }


def _cpu_kernels() -> Dict[str, Any]:
    """The CPU's extra weight layouts this build offers, which models leave out
    here, and the AMX verdict (pyspec/cpu.py) with its reason."""
    v = cpu.verdict()
    return {
        # instruction sets the build was compiled for that this CPU lacks (a wheel built elsewhere)
        "missing_instruction_sets": cpu.missing_instruction_sets(),
        "extra_buffer_types": list(_core.cpu_extra_buffer_types()),
        "excluded": cpu.excluded_buffer_types(),
        v.buffer_type.lower(): {"state": v.state, "reason": v.reason, "record": v.recorded},
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _format_cpu_kernels(k: Dict[str, Any]) -> str:
    kept = [b for b in k["extra_buffer_types"] if b not in k["excluded"]]
    verdicts = [f"{name.upper()} {v['state']} ({v['reason']})" for name, v in k.items() if isinstance(v, dict)]
    return (f"CPU kernels       repacked weights: {', '.join(kept) or 'none'}"
            + (f"; left out: {', '.join(k['excluded'])}" if k["excluded"] else "")
            + "".join(f"\n                  {v}" for v in verdicts)
            + (f"\n                  MISSING on this CPU: {', '.join(k['missing_instruction_sets'])} "
               f"(the build was compiled elsewhere: reinstall llama-cpp-python here)"
               if k["missing_instruction_sets"] else ""))


def format_info(info: Dict[str, Any]) -> str:
    """The human-readable report."""
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    lines = [
        f"pyspec            {info['pyspec_version']}",
        f"llama-cpp-python  {info['llama_cpp_python_version']}",
        f"python            {info['python']} ({info['platform']})",
        f"libllama          {info['libllama_path']}",
        f"                  shared with llama_cpp: {yes(info['libllama_shared_with_llama_cpp'])}",
        f"GPU offload       {yes(info['gpu_offload'])}"
        + ("" if info["gpu_offload"] else "  (CPU-only build; see docs/gpu.md)"),
        "RPC               "
        + (f"yes (ggml RPC protocol {info['rpc']['protocol']}: `pyspec rpc-server`, --rpc)" if info["rpc"]["available"]
           else "no  (reinstall with CMAKE_ARGS=\"-DGGML_RPC=ON\"; see docs/distributed.md)"),
        f"flash attention   default {info['flash_attn_default']} (llama.cpp: {info['llama_cpp_flash_attn_default']}; "
        f"llama-cpp-python's Llama: flash_attn={info['llama_cpp_python_flash_attn_default']})",
        f"threads           {info['threads']} (physical cores; --threads overrides)",
        _format_cpu_kernels(info["cpu_kernels"]),
        f"prompt cache      pyspec serve keeps {info['prompt_cache']['cache_slots']} finished conversations in the "
        f"context (--cache-slots) and up to {info['prompt_cache']['cache_ram_mib']:g} MiB more in host memory "
        f"(--cache-ram)",
        "backends:",
    ]
    for b in info["backends"]:
        lines.append(f"  {b['name']}: {', '.join(b['devices']) or '(no devices)'}")
    lines.append("devices:")
    for d in info["devices"]:
        mem = f", {_mib(d['memory_free'])} free of {_mib(d['memory_total'])}" if d.get("memory_total") else ""
        lines.append(f"  {d['name']} [{d['type']}, {d['backend']}]: {d['description']}{mem}")
    lines.append("system info:")
    row = ""
    for part in (p.strip() for p in info["system_info"].split("|")):
        if not part:
            continue
        if row and len(row) + len(part) > 92:
            lines.append(f"  {row}")
            row = ""
        row = f"{row} | {part}" if row else part
    lines.append(f"  {row or '(none)'}")
    return "\n".join(lines)
