//! One coordinated request carried out: Plan on the plan group (its
//! result written to the PLAN artifact), Work on the work group with the
//! admitted workspace tools (one call at a time, each result going back to
//! the call that asked for it), Review on the review group (its verdict
//! written to REVIEW; `repair` sends its findings back to Work within the
//! repair budget), then the workspace's one cleanup and the frozen
//! terminal. It runs in a task of its own, so a client that leaves does not
//! drop it half-way: it cancels, cleans up, and ends silently.

use std::{
    cell::RefCell,
    collections::HashSet,
    hash::{Hash, Hasher},
    rc::Rc,
    time::Instant,
};

use iop_core::{
    config::AgentEntry,
    exec::Usage,
    rt::signal::{LocalCancel, LocalNotify},
    wire::pb,
};
use serde_json::{json, Value};

use super::{
    model::{self, Answer},
    stages,
    state::{ErrorClass, Run, Stage, Terminal},
    tools::{self, ToolCall},
    workspace::Frozen,
};
use crate::ctx::Ctx;

/// Most bytes of a Work stage's request: past it, the conversation no
/// longer fits a model's context (class `context`).
const MAX_CONTEXT_BYTES: usize = 1 << 20;
/// Stage envelopes kept for the client before the oldest are dropped (a
/// slow reader sees the latest stages, never an unbounded list).
const MAX_QUEUED_STAGES: usize = 64;

/// What the client asked.
#[derive(Debug, Clone)]
pub struct Task {
    /// The request's id (its job directory's name on the node).
    pub request_id: String,
    /// The task text.
    pub text: String,
    /// The client key's name, for credential leases ("" without keys).
    pub principal: String,
    /// The client's session id ("" when none), put on every stage's run.
    pub session_id: String,
    /// Output tokens each stage's answer may take.
    pub max_tokens: u32,
}

/// What the client's task and the run share: stages entered (the only
/// progress a client sees), and the client leaving.
#[derive(Default)]
pub struct Progress {
    stages: RefCell<std::collections::VecDeque<Stage>>,
    /// Told when a stage was entered.
    pub changed: LocalNotify,
    /// Cancelled when the client left.
    pub client_gone: LocalCancel,
}

impl Progress {
    fn enter(&self, s: Stage) {
        let mut q = self.stages.borrow_mut();
        if q.len() == MAX_QUEUED_STAGES {
            q.pop_front();
        }
        q.push_back(s);
        drop(q);
        self.changed.notify();
    }

    /// The stages entered since the last call.
    pub fn take(&self) -> Vec<Stage> {
        self.stages.borrow_mut().drain(..).collect()
    }
}

/// How the run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The frozen terminal.
    pub terminal: Terminal,
    /// The final answer (only with `end_turn`).
    pub text: String,
    /// Tokens of every stage's calls together.
    pub usage: Usage,
    /// Model calls made.
    pub model_calls: u32,
    /// Workspace tool calls made.
    pub tool_calls: u32,
}

/// A run in progress.
pub(super) struct Driver {
    ctx: Rc<Ctx>,
    agent: AgentEntry,
    pub(super) ws: Frozen,
    pub(super) task: Task,
    progress: Rc<Progress>,
    pub(super) run: Run,
    usage: Usage,
    model_calls: u32,
    pub(super) tool_calls: u32,
    request_deadline: Instant,
    /// The stage being timed, and since when.
    stage: &'static str,
    stage_since: Instant,
}

/// Carries out `task` for `agent` in the admitted workspace `ws`.
pub async fn run(ctx: Rc<Ctx>, agent: AgentEntry, ws: Frozen, task: Task, progress: Rc<Progress>) -> Outcome {
    let started = Instant::now();
    let request_deadline = started + agent.budget.request_timeout;
    let mut d = Driver {
        run: Run::new(agent.budget.repair_rounds),
        ctx,
        agent,
        ws,
        task,
        progress: progress.clone(),
        usage: Usage::default(),
        model_calls: 0,
        tool_calls: 0,
        request_deadline,
        stage: "accepted",
        stage_since: started,
    };
    d.progress.enter(Stage::Accepted);
    let result = {
        let stages = iop_core::rt::time::timeout_at(request_deadline, d.stages());
        monoio::select! {
            r = stages => Some(r),
            _ = progress.client_gone.cancelled() => None,
        }
    };
    let mut text = String::new();
    match result {
        None => {
            d.run.client_gone();
            d.cancel_commands().await;
        }
        Some(Err(_)) => d.run.propose(Terminal::Error(ErrorClass::Timeout)),
        Some(Ok(Ok(answer))) => {
            text = answer;
            d.run.propose(Terminal::EndTurn);
        }
        Some(Ok(Err(t))) => d.run.propose(t),
    }
    d.progress.enter(Stage::Finalizing);
    d.stage_done(Instant::now());
    d.stage = "finalizing";
    let cleaned = d.run.needs_cleanup();
    if cleaned {
        let ok = d.cleanup().await;
        d.run.cleaned(ok);
    }
    // Only a bug leaves nothing proposed or a cleanup pending: never a success.
    let terminal = d.run.freeze().unwrap_or(Terminal::Error(ErrorClass::InternalTool));
    if terminal != Terminal::EndTurn {
        text.clear();
    }
    let (kind, class) = labels(terminal);
    tracing::info!(
        request_id = %d.task.request_id,
        agent = %d.agent.name,
        terminal = kind,
        class,
        model_calls = d.model_calls,
        tool_calls = d.tool_calls,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "single request finished"
    );
    d.stage_done(Instant::now());
    crate::metrics::single_request_done(kind, class, d.model_calls, d.tool_calls, cleaned);
    if let Terminal::Error(c) = terminal {
        let status = c.anthropic().1;
        d.ctx.shared.events.publish(crate::events::EdgeEvent::SingleRequestRejected { terminal: kind, class, status });
    }
    Outcome { terminal, text, usage: d.usage, model_calls: d.model_calls, tool_calls: d.tool_calls }
}

/// The closed labels of a terminal: its kind and error class ("" when none).
pub fn labels(t: Terminal) -> (&'static str, &'static str) {
    match t {
        Terminal::EndTurn => ("end_turn", ""),
        Terminal::Length => ("length", ""),
        Terminal::Error(c) => ("error", c.as_str()),
        Terminal::Cancelled { .. } => ("cancelled", ""),
    }
}

pub(super) type Step<T> = Result<T, Terminal>;

pub(super) fn error(class: ErrorClass) -> Terminal {
    Terminal::Error(class)
}

impl Driver {
    async fn stages(&mut self) -> Step<String> {
        self.enter(Stage::Planning)?;
        let deadline = self.stage_deadline();
        let max = self.task.max_tokens;
        let plan_group = self.agent.plan.clone();
        let answer = self.model(&plan_group, stages::plan_request(&self.task.text, max), deadline).await?;
        let plan = stages::parse_plan(&answer.text).ok_or(error(ErrorClass::Malformed))?;
        self.open(deadline).await?;
        self.artifact(pb::WorkspaceArtifactKind::Plan, Some(stages::plan_markdown(&plan)), "plan", deadline).await?;
        let mut findings: Option<String> = None;
        for round in 1u32.. {
            self.enter(Stage::Working)?;
            let deadline = self.stage_deadline();
            let stage_id = format!("work-{round}");
            let plan_md = self.artifact(pb::WorkspaceArtifactKind::Plan, None, &stage_id, deadline).await?;
            let evidence = self.work(&stage_id, &plan_md, findings.as_deref(), deadline).await?;
            self.enter(Stage::Reviewing)?;
            let deadline = self.stage_deadline();
            let stage_id = format!("review-{round}");
            let body = stages::review_request(&self.task.text, &plan_md, &evidence, max);
            let review_group = self.agent.review.clone();
            let answer = self.model(&review_group, body, deadline).await?;
            let review = stages::parse_review(&answer.text).ok_or(error(ErrorClass::Malformed))?;
            let md = stages::review_markdown(&review);
            self.artifact(pb::WorkspaceArtifactKind::Review, Some(md), &stage_id, deadline).await?;
            match review.verdict {
                stages::Verdict::Approve => return Ok(evidence),
                stages::Verdict::Repair => {
                    self.enter(Stage::Repairing)?;
                    findings = Some(review.findings);
                }
            }
        }
        Err(error(ErrorClass::Budget))
    }

    /// One Work stage: model calls and tool calls until the model answers
    /// without a tool call (its report is the evidence).
    async fn work(&mut self, stage_id: &str, plan: &str, findings: Option<&str>, deadline: Instant) -> Step<String> {
        let tools = tools::schemas(&self.ws.operations, &self.ws.command_ids);
        let mut messages = stages::work_messages(&self.task.text, plan, findings);
        let mut seen: HashSet<(u64, u64)> = HashSet::new();
        let mut output = 0u64;
        let work_group = self.agent.work.clone();
        for _ in 0..self.agent.budget.stage_iterations {
            let body = stages::work_request(&messages, &tools, self.task.max_tokens);
            if serde_json::to_vec(&body).map_or(usize::MAX, |b| b.len()) > MAX_CONTEXT_BYTES {
                return Err(error(ErrorClass::Context));
            }
            let answer = self.model(&work_group, body, deadline).await?;
            if answer.calls.is_empty() {
                let report = answer.text.trim();
                if report.is_empty() || report.len() > stages::MAX_FIELD_BYTES {
                    return Err(error(ErrorClass::Malformed));
                }
                return Ok(report.to_owned());
            }
            let calls: Vec<Value> = answer
                .calls
                .iter()
                .map(
                    |c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}),
                )
                .collect();
            let content = if answer.text.is_empty() { Value::Null } else { Value::String(answer.text.clone()) };
            messages.push(json!({"role": "assistant", "content": content, "tool_calls": calls}));
            for call in &answer.calls {
                if call.id.is_empty() {
                    return Err(error(ErrorClass::Malformed));
                }
                let decoded = ToolCall::decode(&call.name, &call.arguments, &self.ws.operations, &self.ws.command_ids)
                    .map_err(|_| error(ErrorClass::Malformed))?;
                let resp = self.tool(stage_id, decoded, deadline).await?;
                output += tools::output_bytes(&resp);
                if output > self.agent.budget.tool_output_bytes {
                    return Err(error(ErrorClass::Budget));
                }
                let result = tools::project(&resp).map_err(|_| error(ErrorClass::InternalTool))?.to_string();
                // The same action with the same result again: no progress.
                if !seen.insert((fixed_hash(&(&call.name, &call.arguments)), fixed_hash(&result))) {
                    return Err(error(ErrorClass::Repetition));
                }
                messages.push(json!({"role": "tool", "tool_call_id": call.id, "content": result}));
            }
        }
        Err(error(ErrorClass::Budget))
    }

    /// One model call of the current stage.
    async fn model(&mut self, group: &str, body: Value, deadline: Instant) -> Step<Answer> {
        self.model_calls += 1;
        let answer = model::call(&self.ctx, group, body, deadline, &self.task.principal, &self.task.session_id).await.map_err(|f| {
            tracing::info!(request_id = %self.task.request_id, code = f.code, class = f.class.as_str(), "stage model call failed");
            error(f.class)
        })?;
        self.usage.input_tokens += answer.usage.input_tokens;
        self.usage.output_tokens += answer.usage.output_tokens;
        if answer.hit_length() {
            return Err(Terminal::Length);
        }
        Ok(answer)
    }

    pub(super) fn enter(&mut self, s: Stage) -> Step<()> {
        match self.run.advance(s) {
            Ok(()) => {
                self.progress.enter(s);
                let now = Instant::now();
                self.stage_done(now);
                self.stage = stage_label(s);
                Ok(())
            }
            Err(super::state::StateError::NoRepairLeft) => Err(error(ErrorClass::Budget)),
            Err(e) => {
                tracing::error!(request_id = %self.task.request_id, error = %e, "coordinator state error");
                Err(error(ErrorClass::InternalTool))
            }
        }
    }

    /// Records the time spent in the stage being timed.
    fn stage_done(&mut self, now: Instant) {
        crate::metrics::single_request_stage(self.stage, now.saturating_duration_since(self.stage_since));
        self.stage_since = now;
    }

    /// A new stage's deadline: its own budget, within the request's.
    fn stage_deadline(&self) -> Instant {
        (Instant::now() + self.agent.budget.stage_timeout).min(self.request_deadline)
    }
}

/// A stage's closed name (metrics, the client's stage envelope).
pub fn stage_label(s: Stage) -> &'static str {
    match s {
        Stage::Accepted => "accepted",
        Stage::Planning => "planning",
        Stage::Working => "working",
        Stage::InternalTool { .. } => "internal_tool",
        Stage::Reviewing => "reviewing",
        Stage::Repairing => "repairing",
        Stage::Finalizing => "finalizing",
        Stage::Completed => "completed",
        Stage::Failed => "failed",
        Stage::Cancelled => "cancelled",
    }
}

/// A hash with fixed keys: the same action hashes the same in every run.
fn fixed_hash<T: Hash + ?Sized>(v: &T) -> u64 {
    #[allow(deprecated)] // SipHasher: fixed keys, unlike DefaultHasher's promise
    let mut h = std::hash::SipHasher::new_with_keys(0x696f_7020_6167_656e, 0x7420_7265_7065_6174);
    v.hash(&mut h);
    h.finish()
}
