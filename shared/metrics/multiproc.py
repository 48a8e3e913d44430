"""prometheus_client's multiprocess mode for firsttoken's processes.

Every process on a host writes its values to memory-mapped files in one directory
(`FIRSTTOKEN_METRICS_DIR`), and a scrape of any gateway process merges the directory
(MultiProcessCollector): counters and histograms summed over every process that ever wrote
(the dead ones' counts stay counted, so totals never go backwards), live gauges over the
processes still running. A process going away says so at its own shutdown
(:func:`mark_dead`); one killed outright cannot, so each scrape first drops the live gauges of
this host's processes that no longer exist (:func:`sweep_dead`). Another host's processes
(containers sharing the directory) are not checked: theirs stay until the directory is
emptied.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

from prometheus_client import CollectorRegistry, values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

# In a file's name: containers sharing one directory (docker-compose.yml's volume) each number
# their processes from 1, so a pid alone would collide. No "_": the collector splits on it.
HOST = socket.gethostname().replace("_", "-")


def process_id(pid: int | None = None) -> str:
    """The identifier in a process's file names: this host and `pid` (default: this process)."""
    return f"{HOST}-{os.getpid() if pid is None else pid}"


def enable(directory: str) -> None:
    """Switch this process to multiprocess mode; before any metric of it is created (each
    value picks its storage when it is made)."""
    os.makedirs(directory, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    values.ValueClass = values.MultiProcessValue(process_id)  # type: ignore[no-untyped-call]


def fresh_dir(directory: str | Path) -> None:
    """Empty `directory` for a new deployment: files of an earlier run would add its counts."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory, exist_ok=True)


def mark_dead(directory: str, pid: int | None = None) -> None:
    """Process `pid` (default: this one) of this host is gone: its live gauges stop counting."""
    mark_process_dead(process_id(pid), directory)  # type: ignore[no-untyped-call]


def sweep_dead(directory: str) -> None:
    """Mark dead every process of this host that has live gauge files and no longer runs."""
    prefix = f"{HOST}-"
    for path in Path(directory).glob(f"gauge_live*_{prefix}*.db"):
        pid = path.stem.rsplit("_", 1)[-1][len(prefix) :]
        if pid.isdigit() and not _running(int(pid)):
            mark_dead(directory, int(pid))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def collected(directory: str) -> CollectorRegistry:
    """A registry that merges every process's files at each collect."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return registry
