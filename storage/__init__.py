"""What survives a crash: records, journal, Parquet table, snapshot."""
