"""The worker side: the trial worker, the backends it runs trials on, their compile pool,
launcher and timing, and the records it exchanges with the driver (protocol.py)."""
