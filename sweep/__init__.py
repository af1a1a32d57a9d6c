"""The driver side of the sweep, in folders that follow the flow (spec, search, engines,
run, results, report; docs/design.md draws them), with the command and the Python API on
top. Here, below all of them: the exit codes and the one failure every layer may raise."""

# Exit codes of the `sweep` command; 128 + the signal number when a signal stopped it.
# EXIT_NONE_WORKED: the run is complete, and no config succeeded.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NONE_WORKED = 0, 1, 2, 3


class SweepFailed(Exception):
    """A failure the tool saw that is no mistake of the input (Ray's local start that
    failed): one line of its own, exit EXIT_FAILED."""
