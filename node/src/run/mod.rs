//! Run execution on the node: admission, event sinks, cancellation.

mod spec;

pub use spec::{EventSink, RunSpec, SinkClosed};
