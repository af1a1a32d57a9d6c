"""What a run has found so far: its running totals and best."""
