"""What to try, and in what order: the search strategies, the warm start, the compile schedule."""
