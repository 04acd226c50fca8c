//! iop-node: runs beside model servers, dials out to the edge, registers,
//! receives its provider config and executes runs.

pub mod adapter;
pub mod run;
pub mod upstream;
