//! Criterion benchmarks of iop's hot paths, each beside a baseline measured in
//! the same group. They live in `benches/benches/`; `benches/README.md` lists
//! them, says how to run them and records a result table
//! (`benches/table.py` prints one from criterion's output).
