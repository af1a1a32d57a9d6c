"""The boot folder `sweep capture` and `sweep exec` put first on a child program's
PYTHONPATH: its sitecustomize.py starts the capture or loads a run's answers (a package
only so that an install ships it)."""
