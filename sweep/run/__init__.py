"""One invocation of a sweep: the session's steps, the driver loop, the run directory, signals."""
