//! Configuration for both binaries, in two layers: raw serde structs that
//! reject unknown fields, then validated typed configs. Errors name the key
//! (and the value, unless the key holds a secret). String values may
//! reference environment variables as `${NAME}` or `${NAME:-default}`.

pub mod affinity;
pub mod api_keys;
pub mod cluster;
pub mod edge;
pub mod env;
pub mod error;
pub mod node;
pub mod provider;
mod raw;
mod secret;
pub mod store;
pub mod testing;
pub mod tls;
pub mod workspace;

pub use affinity::AffinitySettings;
pub use api_keys::{ApiKeyEntry, EngineDown, KeyLimits};
pub use cluster::ClusterSettings;
pub use edge::{
    EdgeConfig, EmbeddedNode, HandshakeSettings, HttpSettings, LinkProbe, ModelGroup, ModelTarget, NodeEntry,
};
pub use error::ConfigError;
pub use node::{NodeConfig, ReconnectPolicy, DEFAULT_STREAM_COALESCE, MAX_EDGES};
pub use provider::{MockSettings, NativeApis, ProviderEntry, ProviderKind, UpstreamUrl};
pub use secret::Secret;
pub use store::{StoreSettings, DEFAULT_STORE_PATH};
pub use testing::TestingSettings;
pub use tls::{EdgeTls, ListenerTls, TlsHandshakeLimits, HTTP_TLS_HANDSHAKES, NODE_TLS_HANDSHAKES};
pub use workspace::{AgentBudget, AgentEntry, WorkspaceEntry, WorkspaceHost, WorkspaceLimits, WorkspaceOp};
