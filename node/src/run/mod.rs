//! Run execution on the node: admission, event sinks, cancellation.

mod credit;
mod emitter;
mod gate;
pub mod lease;
mod manager;
mod record;
mod spec;
pub mod watchdog;

pub use credit::Credit;
pub use emitter::Emitter;
pub use gate::{Class, Gate, Gates};
pub use manager::RunManager;
pub use spec::{EventSink, Operation, RunSpec, SinkClosed};
