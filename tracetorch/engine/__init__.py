"""The private recording engine: the hot path, the per-profile collector and the patches.

Nothing here is public API; :mod:`tracetorch.profiler` drives it and the adapters wire
frameworks to it.
"""
