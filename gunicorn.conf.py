"""gunicorn's settings wherever redpack's web server runs (`make run`, docker-compose, the lab,
the tests' servers): gunicorn reads this file from the working directory; flags on its command
line (bind, workers, threads) override it.

A hot burst arrives at once: thousands of connections within a millisecond. Connections beyond
what the workers have accepted wait in the kernel's listen queue, and beyond that queue the
kernel drops them, the client resends after 1 s, 3 s, 7 s... (the 9-19 s medians of the
first HTTP comparison). So the queue is as long as the kernel allows (net.core.somaxconn caps
it; 4096 on this machine), and each worker holds up to `worker_connections` connections open
(the threaded worker serves them with its `threads`).
"""

import os

backlog = int(os.environ.get("REDPACK_WEB_BACKLOG", "4096"))
worker_connections = int(os.environ.get("REDPACK_WEB_CONNECTIONS", "10000"))
