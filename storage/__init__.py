"""What survives a crash: the trial record, the journal (its file and its meaning), the
Parquet table, the snapshot and best.json, the run directory's lock, the best-config cache."""
