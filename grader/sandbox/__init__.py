"""The sandbox: isolation backends (``isolation``), the kernel's limits and meters (``cgroup``), and
running a session of tasks with its file exchange (``launch``). Nothing here imports the stages."""
