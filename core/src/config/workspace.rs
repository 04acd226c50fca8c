//! The single-request coordinator's config: workspaces approved per node
//! (`[[nodes.workspaces]]`, delivered to the node in its config payload)
//! and agents (`[[agents]]`: a public name, the model groups of its
//! stages, the workspaces it may use, its budgets).

use std::{collections::BTreeMap, time::Duration};

use super::{
    raw::{check, RawAgent, RawWorkspace},
    ConfigError, ModelGroup, NodeEntry,
};
use crate::wire::pb;

/// The host a workspace's node runs on (a node refuses an entry for
/// another host before it is ready).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceHost {
    /// Linux.
    Linux,
    /// macOS (accepted by the schema; a Linux node refuses it).
    Darwin,
}

/// What a workspace allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WorkspaceOp {
    /// Read a file (bounded).
    Read,
    /// List a directory (bounded batches).
    List,
    /// Write a file (temp file, then rename).
    Write,
    /// Delete a file (non-recursive).
    Delete,
    /// Run one of the named command templates.
    Command,
}

impl WorkspaceOp {
    const ALL: [(&'static str, WorkspaceOp); 5] = [
        ("read", WorkspaceOp::Read),
        ("list", WorkspaceOp::List),
        ("write", WorkspaceOp::Write),
        ("delete", WorkspaceOp::Delete),
        ("command", WorkspaceOp::Command),
    ];

    /// Its wire form.
    pub fn to_wire(self) -> pb::WorkspaceOperation {
        match self {
            WorkspaceOp::Read => pb::WorkspaceOperation::Read,
            WorkspaceOp::List => pb::WorkspaceOperation::List,
            WorkspaceOp::Write => pb::WorkspaceOperation::Write,
            WorkspaceOp::Delete => pb::WorkspaceOperation::Delete,
            WorkspaceOp::Command => pb::WorkspaceOperation::Command,
        }
    }
}

/// A workspace's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceLimits {
    /// Bytes one read returns at most.
    pub read_bytes: u64,
    /// Bytes one write takes at most.
    pub write_bytes: u64,
    /// Entries one list batch returns at most.
    pub list_entries: u32,
    /// How long a command may run.
    pub command_timeout: Duration,
    /// Bytes of a command's output (stdout and stderr together) kept.
    pub output_bytes: u64,
}

/// One approved workspace on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceEntry {
    /// The opaque reference requests and agents name it by (unique in the
    /// config).
    pub reference: String,
    /// The host it is on.
    pub host: WorkspaceHost,
    /// Its root directory on the node (absolute).
    pub root: String,
    /// What it allows, in a fixed order.
    pub operations: Vec<WorkspaceOp>,
    /// Command templates by id: a fixed argv each.
    pub commands: BTreeMap<String, Vec<String>>,
    /// Environment variable names a command may see.
    pub env: Vec<String>,
    /// Its limits.
    pub limits: WorkspaceLimits,
}

impl WorkspaceEntry {
    /// Its wire form, for the node's config payload.
    pub fn to_wire(&self) -> pb::WorkspaceConfig {
        pb::WorkspaceConfig {
            workspace_ref: self.reference.clone(),
            host: match self.host {
                WorkspaceHost::Linux => pb::WorkspaceHost::Linux,
                WorkspaceHost::Darwin => pb::WorkspaceHost::Darwin,
            } as i32,
            root: self.root.clone(),
            operations: self.operations.iter().map(|o| o.to_wire() as i32).collect(),
            commands: self
                .commands
                .iter()
                .map(|(id, argv)| pb::WorkspaceCommand { id: id.clone(), argv: argv.clone() })
                .collect(),
            env: self.env.clone(),
            max_read_bytes: self.limits.read_bytes,
            max_write_bytes: self.limits.write_bytes,
            max_list_entries: self.limits.list_entries,
            command_timeout_ms: u64::try_from(self.limits.command_timeout.as_millis()).unwrap_or(u64::MAX),
            max_output_bytes: self.limits.output_bytes,
        }
    }
}

/// An agent's budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentBudget {
    /// Wall clock of a whole request.
    pub request_timeout: Duration,
    /// Model calls one stage may make.
    pub stage_iterations: u32,
    /// Wall clock of one stage.
    pub stage_timeout: Duration,
    /// Bytes of tool output a stage may take in.
    pub tool_output_bytes: u64,
    /// Times a review may send the work back.
    pub repair_rounds: u32,
}

/// An agent: one Anthropic `model` name run as Plan → Work → Review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEntry {
    /// The public name clients send as `model`.
    pub name: String,
    /// The model group of each stage.
    pub plan: String,
    /// See `plan`.
    pub work: String,
    /// See `plan`.
    pub review: String,
    /// Workspace references it may use; a request picks one, the first by
    /// default.
    pub workspaces: Vec<String>,
    /// Its budgets.
    pub budget: AgentBudget,
}

/// Most bytes of a read, a write or a command's output.
const MAX_IO_BYTES: u64 = 64 << 20;

/// A `[[nodes.workspaces]]` entry; `key` is its path.
pub(crate) fn workspace_entry(key: &str, raw: RawWorkspace) -> Result<WorkspaceEntry, ConfigError> {
    let reference = check::id(&format!("{key}.ref"), raw.reference)?;
    let host_key = format!("{key}.host");
    let host = match check::non_empty(&host_key, raw.host)?.as_str() {
        "linux" => WorkspaceHost::Linux,
        "darwin" => WorkspaceHost::Darwin,
        other => return Err(ConfigError::invalid(host_key, other, "expected `linux` or `darwin`")),
    };
    let root_key = format!("{key}.root");
    let root = check::non_empty(&root_key, raw.root)?;
    if !root.starts_with('/') || root.contains('\0') {
        return Err(ConfigError::invalid(root_key, &root, "must be an absolute path"));
    }
    let ops_key = format!("{key}.operations");
    if raw.operations.is_empty() {
        return Err(ConfigError::key(ops_key, "at least one of read, list, write, delete, command is required"));
    }
    let mut operations = Vec::with_capacity(raw.operations.len());
    for (j, name) in raw.operations.iter().enumerate() {
        let op = WorkspaceOp::ALL.iter().find(|(n, _)| n == name).map(|(_, op)| *op).ok_or_else(|| {
            ConfigError::invalid(format!("{ops_key}[{j}]"), name, "expected read, list, write, delete or command")
        })?;
        if operations.contains(&op) {
            return Err(ConfigError::invalid(format!("{ops_key}[{j}]"), name, "is listed twice"));
        }
        operations.push(op);
    }
    operations.sort_unstable();
    let commands_key = format!("{key}.commands");
    for (id, argv) in &raw.commands {
        let at = format!("{commands_key}.{id}");
        check::id(&at, Some(id.clone()))?;
        if argv.is_empty() || argv[0].is_empty() {
            return Err(ConfigError::key(at, "needs a program and its fixed arguments, e.g. [\"cargo\", \"test\"]"));
        }
        if let Some(arg) = argv.iter().find(|a| a.contains('\0')) {
            return Err(ConfigError::invalid(at, arg.replace('\0', "\\0"), "an argument cannot hold a NUL byte"));
        }
    }
    match (operations.contains(&WorkspaceOp::Command), raw.commands.is_empty()) {
        (true, true) => {
            return Err(ConfigError::key(commands_key, "at least one command template is needed for `command`"))
        }
        (false, false) => {
            return Err(ConfigError::key(commands_key, "templates given, but `operations` does not allow `command`"))
        }
        _ => {}
    }
    let env_key = format!("{key}.env");
    for (j, name) in raw.env.iter().enumerate() {
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(ConfigError::invalid(format!("{env_key}[{j}]"), name, "is not an environment variable name"));
        }
        if raw.env[..j].contains(name) {
            return Err(ConfigError::invalid(format!("{env_key}[{j}]"), name, "is listed twice"));
        }
    }
    let limits = WorkspaceLimits {
        read_bytes: bytes(&format!("{key}.max_read_bytes"), raw.max_read_bytes, 1 << 20)?,
        write_bytes: bytes(&format!("{key}.max_write_bytes"), raw.max_write_bytes, 1 << 20)?,
        list_entries: check::range_u32(&format!("{key}.max_list_entries"), raw.max_list_entries, 256, 1, 10_000)?,
        command_timeout: Duration::from_secs(check::range(
            &format!("{key}.command_timeout_sec"),
            raw.command_timeout_sec.unwrap_or(120),
            1,
            24 * 3600,
        )?),
        output_bytes: bytes(&format!("{key}.max_output_bytes"), raw.max_output_bytes, 64 << 10)?,
    };
    Ok(WorkspaceEntry { reference, host, root, operations, commands: raw.commands, env: raw.env, limits })
}

fn bytes(key: &str, value: Option<u64>, default: u64) -> Result<u64, ConfigError> {
    check::range(key, value.unwrap_or(default), 1024, MAX_IO_BYTES)
}

/// Checks that workspace references are unique across nodes.
pub(crate) fn unique_refs(nodes: &[NodeEntry]) -> Result<(), ConfigError> {
    let mut seen: Vec<(&str, String)> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for (j, w) in n.workspaces.iter().enumerate() {
            let here = format!("nodes[{i}].workspaces[{j}]");
            if let Some((_, first)) = seen.iter().find(|(r, _)| *r == w.reference) {
                return Err(ConfigError::invalid(
                    format!("{here}.ref"),
                    &w.reference,
                    format!("duplicates {first}.ref"),
                ));
            }
            seen.push((&w.reference, here));
        }
    }
    Ok(())
}

/// The `[[agents]]`, checked against the model groups and workspaces.
pub(crate) fn agents(
    raw: Vec<RawAgent>,
    models: &[std::sync::Arc<ModelGroup>],
    nodes: &[NodeEntry],
) -> Result<Vec<AgentEntry>, ConfigError> {
    let mut out: Vec<AgentEntry> = Vec::with_capacity(raw.len());
    for (i, a) in raw.into_iter().enumerate() {
        let key = format!("agents[{i}]");
        let name_key = format!("{key}.name");
        let name = check::non_empty(&name_key, a.name)?;
        if let Some(m) = models.iter().position(|m| m.name == name) {
            return Err(ConfigError::invalid(name_key, &name, format!("is the name of models[{m}] too")));
        }
        if let Some(first) = out.iter().position(|o| o.name == name) {
            return Err(ConfigError::invalid(name_key, &name, format!("duplicates agents[{first}].name")));
        }
        let group = |stage: &str, value: Option<String>| {
            let at = format!("{key}.{stage}");
            let g = check::non_empty(&at, value)?;
            if !models.iter().any(|m| m.name == g) {
                return Err(ConfigError::invalid(at, &g, "no [[models]] entry has this name"));
            }
            Ok(g)
        };
        let (plan, work, review) = (group("plan", a.plan)?, group("work", a.work)?, group("review", a.review)?);
        let ws_key = format!("{key}.workspaces");
        if a.workspaces.is_empty() {
            return Err(ConfigError::key(ws_key, "at least one workspace `ref` is required"));
        }
        for (j, r) in a.workspaces.iter().enumerate() {
            if !nodes.iter().any(|n| n.workspaces.iter().any(|w| &w.reference == r)) {
                return Err(ConfigError::invalid(format!("{ws_key}[{j}]"), r, "no [[nodes.workspaces]] has this ref"));
            }
            if a.workspaces[..j].contains(r) {
                return Err(ConfigError::invalid(format!("{ws_key}[{j}]"), r, "is listed twice"));
            }
        }
        let request_timeout = check::secs(&format!("{key}.request_timeout_sec"), a.request_timeout_sec, 600, 1)?;
        let stage_key = format!("{key}.stage_timeout_sec");
        let stage_timeout = check::secs(&stage_key, a.stage_timeout_sec, 300.min(request_timeout.as_secs()), 1)?;
        if stage_timeout > request_timeout {
            return Err(ConfigError::invalid(
                stage_key,
                stage_timeout.as_secs(),
                "must not exceed the agent's request_timeout_sec",
            ));
        }
        let budget = AgentBudget {
            request_timeout,
            stage_iterations: check::range_u32(&format!("{key}.stage_iterations"), a.stage_iterations, 16, 1, 256)?,
            stage_timeout,
            tool_output_bytes: bytes(&format!("{key}.tool_output_bytes"), a.tool_output_bytes, 256 << 10)?,
            repair_rounds: check::range_u32(&format!("{key}.repair_rounds"), a.repair_rounds, 1, 0, 8)?,
        };
        out.push(AgentEntry { name, plan, work, review, workspaces: a.workspaces, budget });
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "workspace_tests.rs"]
mod tests;
