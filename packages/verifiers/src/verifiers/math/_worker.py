"""Math worker process: reads JSON requests on stdin, answers one JSON line each on stdout.

Started by `verifiers.math.pool`; not a public entry point. The address-space limit is set
before sympy is imported, so a hostile `2^{10^9}` ends in MemoryError (answered as "not
equal") instead of eating the host's memory.
"""

from __future__ import annotations

import json
import resource
import signal
import sys


def main() -> None:
    memory_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns our lifetime
    from verifiers.math.compare import Options, equivalent

    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            opts = Options(**request.get("options", {}))
            reply: dict[str, object] = {"equal": bool(equivalent(request["gold"], request["pred"], opts))}
        except MemoryError:
            reply = {"equal": False, "error": "memory limit"}
        except Exception as exc:  # never let one bad input kill a warm worker
            reply = {"equal": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
