"""The process Beam's local runner starts for a forked worker (see ``worker_fork.py``).

In: the zygote's socket name (argv[1]), the environment Beam gives a worker,
and this process's stdin, stdout and stderr. Out: this process exits with the
forked worker's exit status.

Standard library only, run as ``python -S -E worker_stand_in.py NAME``: it
starts in milliseconds, where a worker of its own would import Beam for
seconds. It hands the zygote its environment and its three streams, then waits;
the worker holds its connection and exits when this process dies (killed by
the runner or by a stop), so the runner can treat this process as the worker.
"""

import json
import os
import socket
import struct
import sys


def main(name: str) -> int:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect("\0" + name)
        request = json.dumps(dict(os.environ)).encode()
        socket.send_fds(connection, [struct.pack("!I", len(request))], [0, 1, 2])
        connection.sendall(request)
        status = b""
        while len(status) < 4:
            chunk = connection.recv(4 - len(status))
            if not chunk:  # the zygote died (its launcher is gone): so did the worker
                return 1
            status += chunk
    except OSError as err:
        print(f"imgshards: the forked worker could not start: {err}", file=sys.stderr)
        return 1
    code = struct.unpack("!i", status)[0]
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell reports it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
