"""The Ray engine's modules: joining or starting a cluster (cluster, join, private,
tokens, procfs), placing workers on it (placement) and running them as actors (runtime,
engine). Imported only where a run uses Ray: `ray` is an extra."""
