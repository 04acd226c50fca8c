//! Configuration for both binaries, in two layers: raw serde structs that
//! reject unknown fields, then validated typed configs. Errors name the key
//! (and the value, unless the key holds a secret). String values may
//! reference environment variables as `${NAME}` or `${NAME:-default}`.

pub mod edge;
pub mod env;
pub mod error;
pub mod node;
mod raw;
mod secret;
pub mod testing;

pub use edge::{
    EdgeConfig, EmbeddedNode, HandshakeSettings, HttpSettings, MockSettings, ModelGroup, ModelTarget, NodeEntry,
    ProviderEntry, ProviderKind, UpstreamUrl,
};
pub use error::ConfigError;
pub use node::{NodeConfig, ReconnectPolicy};
pub use secret::Secret;
pub use testing::TestingSettings;
