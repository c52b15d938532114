//! The fuzz targets' glue lives in `glue.rs` so that the regression replay
//! (`tests/fuzz_regressions.rs` in the main crate) runs the very same code.

pub mod glue;
