"""Where workers run: this machine's processes or a Ray cluster, behind one seam (runtime.py)."""
