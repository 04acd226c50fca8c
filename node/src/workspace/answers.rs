//! The answers of the workspace calls, and their closed error labels
//! (beside [`FileError`]'s and [`CommandError`](super::command::CommandError)'s
//! own): ids, a status and a label, never a path.

use iop_core::wire::pb::{self, WorkspaceStatus as Status};

use super::files::{Entry, EntryKind, FileError};

/// Error labels of the workspace answers.
pub mod label {
    /// The reference is not in the node's catalog.
    pub const UNKNOWN_WORKSPACE: &str = "unknown_workspace";
    /// The authority asked for is beyond the catalog entry.
    pub const AUTHORITY_EXCEEDS_CATALOG: &str = "authority_exceeds_catalog";
    /// Not a safe request id.
    pub const REQUEST_ID_INVALID: &str = "request_id_invalid";
    /// Open already (or opened once and cleaned).
    pub const ALREADY_OPEN: &str = "already_open";
    /// Not open, or its cleanup has begun.
    pub const NOT_OPEN: &str = "not_open";
    /// An operation the authority does not grant.
    pub const OPERATION_DENIED: &str = "operation_denied";
    /// A command id the authority does not grant.
    pub const COMMAND_DENIED: &str = "command_denied";
    /// An empty or too long tool id.
    pub const TOOL_ID_INVALID: &str = "tool_id_invalid";
    /// A tool id the request used already.
    pub const DUPLICATE_TOOL_ID: &str = "duplicate_tool_id";
    /// The request used all the tool ids it may.
    pub const TOO_MANY_TOOLS: &str = "too_many_tools";
    /// Content beyond the write limit.
    pub const TOO_LARGE: &str = "too_large";
    /// An artifact kind or operation not given.
    pub const ARTIFACT_INVALID: &str = "artifact_invalid";
    /// Too much at once on the node.
    pub const BUSY: &str = "busy";
    /// The operation's thread was lost (it panicked).
    pub const LOST: &str = "io";
}

/// Whether a file error is about the input (refused before any effect) or
/// the operation failed.
pub(super) fn file_status(e: FileError) -> Status {
    match e {
        FileError::PathInvalid
        | FileError::PathReserved
        | FileError::Symlink
        | FileError::EscapesRoot
        | FileError::SpecialFile
        | FileError::TooLarge
        | FileError::NotAFile
        | FileError::NotADirectory => Status::Invalid,
        FileError::NotFound | FileError::Denied | FileError::Io | FileError::Unsupported => Status::Failed,
    }
}

/// An open's answer.
pub fn open_answer(request_id: &str, status: Status, error: &str) -> pb::WorkspaceOpenResponse {
    pb::WorkspaceOpenResponse { request_id: request_id.to_owned(), status: status as i32, error: error.to_owned() }
}

/// A tool call's answer, its identities echoed.
pub fn tool_answer(req: &pb::WorkspaceToolRequest, status: Status, error: &str) -> pb::WorkspaceToolResponse {
    pb::WorkspaceToolResponse {
        request_id: req.request_id.clone(),
        stage_id: req.stage_id.clone(),
        tool_id: req.tool_id.clone(),
        operation: req.operation,
        status: status as i32,
        error: error.to_owned(),
        ..Default::default()
    }
}

/// An artifact call's answer.
pub fn artifact_answer(
    req: &pb::WorkspaceArtifactRequest,
    status: Status,
    error: &str,
) -> pb::WorkspaceArtifactResponse {
    pb::WorkspaceArtifactResponse {
        request_id: req.request_id.clone(),
        kind: req.kind,
        operation: req.operation,
        status: status as i32,
        error: error.to_owned(),
        ..Default::default()
    }
}

/// A cleanup's answer.
pub fn cleanup_answer(request_id: &str, status: Status, error: &str) -> pb::WorkspaceCleanupResponse {
    pb::WorkspaceCleanupResponse { request_id: request_id.to_owned(), status: status as i32, error: error.to_owned() }
}

pub(super) fn cleaned_answer(request_id: &str, result: Result<(), FileError>) -> pb::WorkspaceCleanupResponse {
    match result {
        Ok(()) => cleanup_answer(request_id, Status::Ok, ""),
        Err(e) => cleanup_answer(request_id, Status::Failed, &e.to_string()),
    }
}

pub(super) fn list_entry(e: Entry) -> pb::WorkspaceListEntry {
    let kind = match e.kind {
        EntryKind::File => pb::WorkspaceEntryKind::File,
        EntryKind::Directory => pb::WorkspaceEntryKind::Directory,
        EntryKind::Symlink => pb::WorkspaceEntryKind::Symlink,
        EntryKind::Other => pb::WorkspaceEntryKind::Other,
    };
    pb::WorkspaceListEntry { name: e.name, kind: kind as i32 }
}
