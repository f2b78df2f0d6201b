//! Criterion benchmarks live in benches/; this library is empty.
