"""The driver side of the sweep: spec, space, driver loop, signals, CLI."""

# Exit codes of the `sweep` command; 128 + the signal number when a signal stopped it.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
