"""What the machine is and what this process uses: CPU model and flags, peak RSS."""

from __future__ import annotations

import platform
from pathlib import Path

_STATUS = Path("/proc/self/status")


def cpu_info(path: Path = Path("/proc/cpuinfo")) -> tuple[str, list[str]]:
    """(model name, flags) from /proc/cpuinfo; the platform's answer where that is missing."""
    model, flags = "", []
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in ("model name", "cpu model") and not model:
                model = value.strip()
            elif key in ("flags", "features") and not flags:
                flags = value.split()
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def peak_rss_reset() -> bool:
    """Restart the peak-RSS high-water mark (Linux: write 5 to clear_refs); False where the
    kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """VmHWM from /proc/self/status, else getrusage's process-lifetime peak (ru_maxrss is
    KiB on Linux, bytes on macOS)."""
    import sys

    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource

    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024
