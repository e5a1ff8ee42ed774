"""A process whose allocators erase what they free: how the service bounds what its input path leaves.

Before a record reaches the learner it passes through the source (file reads, the Kafka client's
fetch responses, the payload ``bytes``), the codec (``orjson``/``json`` objects, CSV fields, the
decoded arrays) and the libraries under them. Each of these copies is freed, not erased, and the
allocators hand freed memory back only when a later allocation of the same size wants it: issue 32
found records from the start of a stream in the memory of a run long after. The learners wipe
what they compute (docs/privacy.md, "Process memory"), but the input path runs through code that
panpriv does not own, so the process itself is made to erase what it frees:

- ``PYTHONMALLOC=pymalloc_debug``: Python's allocator with its debug hooks, which fill every freed
  block — a ``float``, a ``bytes`` line, a ``str`` field — with a fixed byte (CPython's
  ``PYMEM_DEADBYTE``);
- ``GLIBC_TUNABLES=glibc.malloc.perturb=255:glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0``:
  glibc overwrites what C code frees (numpy's arrays, the libraries' buffers), and keeps no
  per-thread cache or fast bin of freed blocks, which it would hand back without overwriting.
  glibc's overwrite leaves the last 8 bytes of a block whose successor is free (they belong to the
  successor's header), which is why Python objects — a float's value is its last 8 bytes — are
  left to the debug hooks. Memory returned to the operating system (large blocks) is gone anyway.

Both are read when a process starts, so the long-running commands (:data:`COMMANDS`) re-execute
themselves once with them set (:func:`ensure`); the process keeps its PID, arguments and the rest
of its environment. What stays unerased is small and recent: CPython's free lists (the last 100
freed floats; containers of pointers), numpy's cache of small freed data buffers (at most 7 per
size below 1 KiB), the last 8 bytes of freed C buffers, a library's own long-lived buffers
(measured and named in docs/privacy.md, "The input path"), and what the operating system holds
(socket buffers, the page cache). The cost: about 1.3–1.6 × the CPU time of a JSON stream
(``benchmarks/memory_hygiene.py``).

``PANPRIV_ALLOCATOR=default`` turns this off (then the input path's bound does not hold); only
glibc on Linux is handled (elsewhere the command runs as it is and says so at start). A program
that embeds panpriv's Python API sets the two variables itself before it starts.
"""

from __future__ import annotations

import os
import platform
import sys

COMMANDS = frozenset({"run", "worker", "coordinate", "encode", "shuffle", "analyze"})
"""The commands that hold records or states for a long time, and so start with the wiping allocator."""

SWITCH = "PANPRIV_ALLOCATOR"
"""``default``: run with the usual allocator; set to ``wiping`` by the re-execution itself."""

PYTHONMALLOC = "pymalloc_debug"
TUNABLES = "glibc.malloc.perturb=255:glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0"


def wiping() -> bool:
    """Whether this process was started with the wiping allocator (by :func:`ensure`)."""
    return os.environ.get(SWITCH) == "wiping"


def supported() -> bool:
    return sys.platform == "linux" and platform.libc_ver()[0] == "glibc" and bool(sys.executable)


def ensure(command: str | None) -> None:
    """Re-execute this process with the wiping allocator if ``command`` is one of :data:`COMMANDS`
    and it was not started with it (module docstring). Returns only if nothing is to be done."""
    if command not in COMMANDS or wiping() or os.environ.get(SWITCH) == "default" or not supported():
        return
    env = dict(os.environ)
    env["PYTHONMALLOC"] = PYTHONMALLOC
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES", ""), TUNABLES]))
    env[SWITCH] = "wiping"
    sys.stdout.flush()
    sys.stderr.flush()
    # The original command line after the interpreter: ``-m panpriv …`` or the script, with the
    # interpreter's own options kept.
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
