"""The scripts behind BENCHMARKS.md's figures, each run on the machine its docstring names
and recording its result under benchmarks/results/ (record.py); a package so that one
script can reuse another's steps (`from benchmarks.gpu_sweep import ...`)."""
