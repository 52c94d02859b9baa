//! Per-rank inputs of the dsv41 engine (rank files, token map, RoPE, kit).
