//! What a shutdown hands back of a task it could not finish.

use super::{Task, TaskId};
use crate::outcome::Attempt;

/// A task the dispatcher could not finish before shutting down.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Unfinished {
    /// The task's id.
    pub id: TaskId,
    /// Its service.
    pub service: String,
    /// The task as submitted, to resubmit elsewhere.
    pub task: Task,
    /// Attempts it made.
    pub attempts: Vec<Attempt>,
    /// Whether an attempt was out when the grace period ended.
    pub was_in_flight: bool,
}
