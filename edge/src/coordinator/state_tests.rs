use super::*;

fn through_review(run: &mut Run) {
    run.advance(Stage::Planning).unwrap();
    run.advance(Stage::Working).unwrap();
    run.advance(Stage::InternalTool { issued_by: Phase::Working }).unwrap();
    run.advance(Stage::Working).unwrap();
    run.advance(Stage::Reviewing).unwrap();
}

#[test]
fn a_run_goes_plan_work_review_and_repair_within_its_rounds() {
    let mut run = Run::new(1);
    through_review(&mut run);
    run.advance(Stage::Repairing).unwrap();
    run.advance(Stage::Working).unwrap();
    run.advance(Stage::Reviewing).unwrap();
    assert_eq!(run.advance(Stage::Repairing), Err(StateError::NoRepairLeft));
    assert_eq!(run.stage(), Stage::Reviewing);
    run.propose(Terminal::EndTurn);
    assert_eq!(run.stage(), Stage::Finalizing);
    assert_eq!(run.freeze(), Ok(Terminal::EndTurn));
    assert_eq!(run.stage(), Stage::Completed);
}

#[test]
fn a_tool_result_resumes_only_the_stage_that_issued_it() {
    let mut run = Run::new(0);
    run.advance(Stage::Planning).unwrap();
    // Planning cannot issue a call in Working's name.
    let wrong = Stage::InternalTool { issued_by: Phase::Working };
    assert!(matches!(run.advance(wrong), Err(StateError::Transition { .. })));
    run.advance(Stage::InternalTool { issued_by: Phase::Planning }).unwrap();
    // The result goes back to planning, nowhere else.
    for other in [Stage::Working, Stage::Reviewing, Stage::Repairing, Stage::Accepted] {
        assert!(matches!(run.advance(other), Err(StateError::Transition { .. })), "{other:?}");
    }
    run.advance(Stage::Planning).unwrap();
    // No skipping stages, no going back.
    assert!(run.advance(Stage::Reviewing).is_err());
    run.advance(Stage::Working).unwrap();
    assert!(run.advance(Stage::Planning).is_err());
}

#[test]
fn the_first_proposal_wins_and_the_terminal_is_frozen_once() {
    let mut run = Run::new(0);
    through_review(&mut run);
    run.propose(Terminal::Error(ErrorClass::Timeout));
    // A cancel racing it, or a success after it, changes nothing.
    run.client_gone();
    run.propose(Terminal::EndTurn);
    assert_eq!(run.freeze(), Ok(Terminal::Error(ErrorClass::Timeout)));
    assert_eq!(run.freeze(), Ok(Terminal::Error(ErrorClass::Timeout)));
    assert_eq!(run.stage(), Stage::Failed);
    // Nothing moves after the end.
    run.propose(Terminal::EndTurn);
    run.cleaned(false);
    assert_eq!(run.freeze(), Ok(Terminal::Error(ErrorClass::Timeout)));
    for to in [Stage::Planning, Stage::Working, Stage::Finalizing] {
        assert!(run.advance(to).is_err());
    }
}

#[test]
fn an_opened_workspace_is_cleaned_before_the_terminal_and_a_failed_cleanup_replaces_success() {
    // Success, cleanup fails: the run fails with workspace_cleanup.
    let mut run = Run::new(0);
    run.advance(Stage::Planning).unwrap();
    run.workspace_opened();
    run.propose(Terminal::EndTurn);
    assert_eq!(run.freeze(), Err(StateError::CleanupPending));
    assert!(run.needs_cleanup());
    run.cleaned(false);
    assert_eq!(run.freeze(), Ok(Terminal::Error(ErrorClass::WorkspaceCleanup)));
    // Length likewise.
    let mut run = Run::new(0);
    run.workspace_opened();
    run.propose(Terminal::Length);
    run.cleaned(false);
    assert_eq!(run.freeze(), Ok(Terminal::Error(ErrorClass::WorkspaceCleanup)));
    // An error or a cancel keeps its class.
    for t in [Terminal::Error(ErrorClass::Budget), Terminal::Cancelled { silent: true }] {
        let mut run = Run::new(0);
        run.workspace_opened();
        run.propose(t);
        run.cleaned(false);
        assert_eq!(run.freeze(), Ok(t));
    }
    // A cleanup that fails before anything was proposed ends the run too.
    let mut run = Run::new(0);
    run.advance(Stage::Planning).unwrap();
    run.workspace_opened();
    run.cleaned(false);
    assert_eq!(run.freeze(), Ok(Terminal::Error(ErrorClass::WorkspaceCleanup)));
    // Cleaned fine: the success stands; without a workspace no cleanup is awaited.
    let mut run = Run::new(0);
    run.workspace_opened();
    run.propose(Terminal::EndTurn);
    run.cleaned(true);
    assert_eq!(run.freeze(), Ok(Terminal::EndTurn));
    let mut run = Run::new(0);
    run.propose(Terminal::EndTurn);
    assert_eq!(run.freeze(), Ok(Terminal::EndTurn));
}

#[test]
fn what_each_terminal_tells_the_client() {
    assert!(Terminal::EndTurn.exposes_content());
    // A length never carries the private partial content.
    assert!(!Terminal::Length.exposes_content());
    assert!(!Terminal::Error(ErrorClass::Provider).exposes_content());
    // A client that left is told nothing; a requested cancel is.
    assert!(!Terminal::Cancelled { silent: true }.is_written());
    assert!(Terminal::Cancelled { silent: false }.is_written());
    let all = [
        ErrorClass::Provider,
        ErrorClass::Validation,
        ErrorClass::Timeout,
        ErrorClass::Budget,
        ErrorClass::Repetition,
        ErrorClass::Malformed,
        ErrorClass::Context,
        ErrorClass::InternalTool,
        ErrorClass::WorkspaceCleanup,
    ];
    for c in all {
        let expected = match c {
            ErrorClass::Validation | ErrorClass::Context => "invalid_request_error",
            _ => "api_error",
        };
        assert_eq!(c.anthropic().0, expected, "{}", c.as_str());
    }
    let labels: std::collections::HashSet<&str> = all.iter().map(|c| c.as_str()).collect();
    assert_eq!(labels.len(), all.len(), "labels are distinct");
    // Nothing proposed: nothing to freeze.
    assert_eq!(Run::new(0).freeze(), Err(StateError::NothingProposed));
}
