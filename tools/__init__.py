"""Tools for developers, tests and benchmarks, not shipped: random graphs, the float64 evaluator,
synthetic memgraphs, the pass-docs generator and the numba cache warmer. `make` and the tests call them
from the repository root."""
