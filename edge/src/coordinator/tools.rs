//! The Work stage's workspace tools: their strict JSON schemas (only the
//! operations the request was admitted for, `workspace_command` naming
//! only its admitted command ids), the strict decoding of a call (unknown
//! tool, unknown or missing field, wrong type: malformed, before any
//! effect), and a node result projected to the bounded typed JSON the
//! model reads.

use iop_core::{config::WorkspaceOp, wire::pb};
use serde::Deserialize;
use serde_json::{json, Value};

/// A decoded tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCall {
    /// `workspace_read`.
    Read {
        /// Relative path.
        path: String,
    },
    /// `workspace_list`.
    List {
        /// Relative directory (`.` is not a path: the root is "").
        path: String,
        /// The last name of the previous batch.
        after: Option<String>,
    },
    /// `workspace_write`.
    Write {
        /// Relative path.
        path: String,
        /// The whole new content.
        content: String,
    },
    /// `workspace_delete`.
    Delete {
        /// Relative path.
        path: String,
    },
    /// `workspace_command`.
    Command {
        /// An admitted command id.
        command: String,
    },
}

/// Why a call was refused before any effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A tool the stage was not given.
    #[error("unknown_tool")]
    UnknownTool,
    /// Arguments that break the tool's schema.
    #[error("bad_arguments")]
    BadArguments,
    /// A command id that was not admitted.
    #[error("command_denied")]
    CommandDenied,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathArgs {
    path: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    path: String,
    #[serde(default)]
    after: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandArgs {
    command: String,
}

impl ToolCall {
    /// Decodes the call `name(arguments)` against what was admitted.
    pub fn decode(name: &str, arguments: &str, ops: &[WorkspaceOp], command_ids: &[String]) -> Result<Self, Refused> {
        let op = match name {
            "workspace_read" => WorkspaceOp::Read,
            "workspace_list" => WorkspaceOp::List,
            "workspace_write" => WorkspaceOp::Write,
            "workspace_delete" => WorkspaceOp::Delete,
            "workspace_command" => WorkspaceOp::Command,
            _ => return Err(Refused::UnknownTool),
        };
        if !ops.contains(&op) {
            return Err(Refused::UnknownTool);
        }
        let bad = |_| Refused::BadArguments;
        Ok(match op {
            WorkspaceOp::Read => {
                ToolCall::Read { path: serde_json::from_str::<PathArgs>(arguments).map_err(bad)?.path }
            }
            WorkspaceOp::List => {
                let a: ListArgs = serde_json::from_str(arguments).map_err(bad)?;
                ToolCall::List { path: a.path, after: a.after.filter(|s| !s.is_empty()) }
            }
            WorkspaceOp::Write => {
                let a: WriteArgs = serde_json::from_str(arguments).map_err(bad)?;
                ToolCall::Write { path: a.path, content: a.content }
            }
            WorkspaceOp::Delete => {
                ToolCall::Delete { path: serde_json::from_str::<PathArgs>(arguments).map_err(bad)?.path }
            }
            WorkspaceOp::Command => {
                let a: CommandArgs = serde_json::from_str(arguments).map_err(bad)?;
                if !command_ids.contains(&a.command) {
                    return Err(Refused::CommandDenied);
                }
                ToolCall::Command { command: a.command }
            }
        })
    }

    /// The node request for this call.
    pub fn request(self, request_id: &str, stage_id: &str, tool_id: &str) -> pb::WorkspaceToolRequest {
        let mut r = pb::WorkspaceToolRequest {
            request_id: request_id.to_owned(),
            stage_id: stage_id.to_owned(),
            tool_id: tool_id.to_owned(),
            ..Default::default()
        };
        let op = match self {
            ToolCall::Read { path } => {
                r.path = path;
                pb::WorkspaceOperation::Read
            }
            ToolCall::List { path, after } => {
                r.path = path;
                r.after = after.unwrap_or_default();
                pb::WorkspaceOperation::List
            }
            ToolCall::Write { path, content } => {
                r.path = path;
                r.content = content.into_bytes().into();
                pb::WorkspaceOperation::Write
            }
            ToolCall::Delete { path } => {
                r.path = path;
                pb::WorkspaceOperation::Delete
            }
            ToolCall::Command { command } => {
                r.command_id = command;
                pb::WorkspaceOperation::Command
            }
        };
        r.operation = op as i32;
        r
    }
}

/// The tools given to the Work stage: one per admitted operation.
pub fn schemas(ops: &[WorkspaceOp], command_ids: &[String]) -> Vec<Value> {
    let path = json!({"type": "string", "description": "A path relative to the workspace root, e.g. src/main.rs"});
    let tool = |name: &str, description: &str, properties: Value, required: &[&str]| {
        json!({
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "strict": true,
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": false,
                },
            },
        })
    };
    ops.iter()
        .map(|op| match op {
            WorkspaceOp::Read => {
                tool("workspace_read", "Read a file of the workspace (bounded).", json!({"path": path}), &["path"])
            }
            WorkspaceOp::List => tool(
                "workspace_list",
                "List a directory of the workspace in batches by name; \"\" is the root.",
                json!({"path": path, "after": {"type": ["string", "null"], "description": "The last name of the previous batch"}}),
                &["path", "after"],
            ),
            WorkspaceOp::Write => tool(
                "workspace_write",
                "Write a whole file of the workspace (created or replaced).",
                json!({"path": path, "content": {"type": "string"}}),
                &["path", "content"],
            ),
            WorkspaceOp::Delete => {
                tool("workspace_delete", "Delete one file of the workspace.", json!({"path": path}), &["path"])
            }
            WorkspaceOp::Command => tool(
                "workspace_command",
                "Run one of the workspace's named commands in its root.",
                json!({"command": {"type": "string", "enum": command_ids}}),
                &["command"],
            ),
        })
        .collect()
}

/// How a node's tool answer reads to the model: `Ok` with the typed JSON
/// result (a command that exited non-zero included: that is evidence), or
/// the status and closed error code of a refusal or failure.
pub fn project(r: &pb::WorkspaceToolResponse) -> Result<Value, (pb::WorkspaceStatus, String)> {
    let status = pb::WorkspaceStatus::try_from(r.status).unwrap_or(pb::WorkspaceStatus::Unspecified);
    if status != pb::WorkspaceStatus::Ok {
        // The node's codes are a closed set; a longer one is cut, not echoed.
        return Err((status, r.error.chars().take(64).collect()));
    }
    let text = || String::from_utf8_lossy(&r.content).into_owned();
    Ok(match pb::WorkspaceOperation::try_from(r.operation) {
        Ok(pb::WorkspaceOperation::Read) => json!({"content": text(), "truncated": r.truncated}),
        Ok(pb::WorkspaceOperation::List) => {
            let entries: Vec<Value> = r
                .entries
                .iter()
                .map(|e| {
                    let kind = match pb::WorkspaceEntryKind::try_from(e.kind) {
                        Ok(pb::WorkspaceEntryKind::File) => "file",
                        Ok(pb::WorkspaceEntryKind::Directory) => "directory",
                        Ok(pb::WorkspaceEntryKind::Symlink) => "symlink",
                        _ => "other",
                    };
                    json!({"name": e.name, "kind": kind})
                })
                .collect();
            json!({"entries": entries, "more": r.more})
        }
        Ok(pb::WorkspaceOperation::Write) => json!({"written": true}),
        Ok(pb::WorkspaceOperation::Delete) => json!({"deleted": true}),
        Ok(pb::WorkspaceOperation::Command) => json!({
            "exit_code": r.exit_code,
            "signal": (r.signal != 0).then_some(r.signal),
            "timed_out": r.timed_out,
            "output": text(),
            "truncated": r.truncated,
        }),
        _ => return Err((pb::WorkspaceStatus::Unspecified, "operation_unknown".into())),
    })
}

/// Bytes of a tool answer counted against the stage's tool output budget.
pub fn output_bytes(r: &pb::WorkspaceToolResponse) -> u64 {
    let names: usize = r.entries.iter().map(|e| e.name.len()).sum();
    (r.content.len() + names) as u64
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "tools_tests.rs"]
mod tests;
