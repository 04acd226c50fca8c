//! Run execution on the node: admission, event sinks, cancellation.

mod credit;
mod emitter;
mod manager;
mod spec;

pub use credit::Credit;
pub use emitter::Emitter;
pub use manager::RunManager;
pub use spec::{EventSink, Operation, RunSpec, SinkClosed};
