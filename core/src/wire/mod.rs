//! The edge↔node wire: generated prost types and the sans-IO frame codec.

mod codec;
mod event;
mod run_events;
mod workspace;

pub use codec::{
    decode, decode_frame, encode, encode_run_event, encode_run_events, encode_run_request, encode_tunnel_body,
    encode_tunnel_request, encode_tunnel_start, encode_tunnel_whole, Frame, TunnelHead, WireError,
    DEFAULT_MAX_FRAME_BYTES,
};
pub use event::{decode_event, short_text_parts};
pub use run_events::{run_events_by_hand, run_frame_by_hand, Events, RunFrame};
pub use workspace::{WorkspaceAnswer, WorkspaceCall};

/// Generated from `proto/iop/runtime.proto`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/iop.runtime.rs"));
}
