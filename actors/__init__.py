"""The GPU side: the trial worker actor, its backends and timing."""
