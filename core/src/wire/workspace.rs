//! The single-request coordinator's workspace calls as one request type
//! and one answer type, so the edge keeps one table of calls waiting on a
//! link whatever the family, and the answer of a call is checked to be of
//! its own family.

use super::pb::{self, envelope::Body};

/// A workspace request, edge to node.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkspaceCall {
    /// Open the request's use of a workspace.
    Open(pb::WorkspaceOpenRequest),
    /// One tool call.
    Tool(pb::WorkspaceToolRequest),
    /// Read or write the request's plan or review.
    Artifact(pb::WorkspaceArtifactRequest),
    /// Stop running commands.
    Cancel(pb::WorkspaceCancelRequest),
    /// End the request's use of it.
    Cleanup(pb::WorkspaceCleanupRequest),
}

/// A workspace answer, node to edge.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkspaceAnswer {
    /// See [`WorkspaceCall::Open`].
    Open(pb::WorkspaceOpenResponse),
    /// See [`WorkspaceCall::Tool`].
    Tool(pb::WorkspaceToolResponse),
    /// See [`WorkspaceCall::Artifact`].
    Artifact(pb::WorkspaceArtifactResponse),
    /// See [`WorkspaceCall::Cancel`].
    Cancel(pb::WorkspaceCancelResponse),
    /// See [`WorkspaceCall::Cleanup`].
    Cleanup(pb::WorkspaceCleanupResponse),
}

impl WorkspaceCall {
    /// Its envelope body.
    pub fn into_body(self) -> Body {
        match self {
            WorkspaceCall::Open(r) => Body::WorkspaceOpenRequest(r),
            WorkspaceCall::Tool(r) => Body::WorkspaceToolRequest(r),
            WorkspaceCall::Artifact(r) => Body::WorkspaceArtifactRequest(r),
            WorkspaceCall::Cancel(r) => Body::WorkspaceCancelRequest(r),
            WorkspaceCall::Cleanup(r) => Body::WorkspaceCleanupRequest(r),
        }
    }

    /// The request it belongs to.
    pub fn request_id(&self) -> &str {
        match self {
            WorkspaceCall::Open(r) => &r.request_id,
            WorkspaceCall::Tool(r) => &r.request_id,
            WorkspaceCall::Artifact(r) => &r.request_id,
            WorkspaceCall::Cancel(r) => &r.request_id,
            WorkspaceCall::Cleanup(r) => &r.request_id,
        }
    }
}

impl WorkspaceAnswer {
    /// The answer a body holds; `None` when it is no workspace answer.
    pub fn from_body(body: Body) -> Option<Self> {
        Some(match body {
            Body::WorkspaceOpenResponse(r) => WorkspaceAnswer::Open(r),
            Body::WorkspaceToolResponse(r) => WorkspaceAnswer::Tool(r),
            Body::WorkspaceArtifactResponse(r) => WorkspaceAnswer::Artifact(r),
            Body::WorkspaceCancelResponse(r) => WorkspaceAnswer::Cancel(r),
            Body::WorkspaceCleanupResponse(r) => WorkspaceAnswer::Cleanup(r),
            _ => return None,
        })
    }

    /// Its envelope body.
    pub fn into_body(self) -> Body {
        match self {
            WorkspaceAnswer::Open(r) => Body::WorkspaceOpenResponse(r),
            WorkspaceAnswer::Tool(r) => Body::WorkspaceToolResponse(r),
            WorkspaceAnswer::Artifact(r) => Body::WorkspaceArtifactResponse(r),
            WorkspaceAnswer::Cancel(r) => Body::WorkspaceCancelResponse(r),
            WorkspaceAnswer::Cleanup(r) => Body::WorkspaceCleanupResponse(r),
        }
    }

    /// The request it belongs to, as the node echoed it.
    pub fn request_id(&self) -> &str {
        match self {
            WorkspaceAnswer::Open(r) => &r.request_id,
            WorkspaceAnswer::Tool(r) => &r.request_id,
            WorkspaceAnswer::Artifact(r) => &r.request_id,
            WorkspaceAnswer::Cancel(r) => &r.request_id,
            WorkspaceAnswer::Cleanup(r) => &r.request_id,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn answers_come_back_from_their_bodies_and_others_are_returned() {
        let a = WorkspaceAnswer::Cleanup(pb::WorkspaceCleanupResponse { request_id: "r".into(), ..Default::default() });
        let back = WorkspaceAnswer::from_body(a.clone().into_body()).unwrap();
        assert_eq!(back, a);
        assert_eq!(back.request_id(), "r");
        let hb = Body::Heartbeat(pb::Heartbeat::default());
        assert!(WorkspaceAnswer::from_body(hb).is_none());
        let call = WorkspaceCall::Tool(pb::WorkspaceToolRequest { request_id: "q".into(), ..Default::default() });
        assert_eq!(call.request_id(), "q");
        assert!(matches!(call.into_body(), Body::WorkspaceToolRequest(_)));
    }
}
