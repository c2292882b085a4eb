//! Why a limits file is refused: [`LimitsProblem`] says what is wrong in a file's text (with
//! the descriptor path), [`LimitsError`] names the file.

use tally_counters::request::PolicyError;

/// Why a limits file was refused: the file, and where in it.
#[derive(Debug, thiserror::Error)]
#[error("limits file {file}: {reason}")]
pub struct LimitsError {
    /// The file (or directory) read.
    pub file: String,
    /// What is wrong, with the descriptor path.
    pub reason: String,
}

/// What is wrong in one limits file's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsProblem {
    /// Not YAML of the limits file's shape (serde's message, which lists the known keys).
    #[error("{0}")]
    Syntax(String),
    /// A value that cannot be used; the message names it by its descriptor path.
    #[error("{0}")]
    Invalid(String),
    /// A limit's numbers out of range (at a descriptor path once [`LimitsProblem::at`] placed it).
    #[error("{0}")]
    Policy(#[from] PolicyError),
    /// A problem placed at a descriptor path.
    #[error("`{path}`: {problem}")]
    At {
        /// The descriptor path.
        path: String,
        /// What is wrong there.
        problem: Box<LimitsProblem>,
    },
}

impl LimitsProblem {
    /// This problem, placed at descriptor `path`.
    pub fn at(self, path: &str) -> LimitsProblem {
        LimitsProblem::At {
            path: path.to_string(),
            problem: Box::new(self),
        }
    }
}

/// A value that cannot be used.
pub(super) fn invalid<T>(why: impl Into<String>) -> Result<T, LimitsProblem> {
    Err(LimitsProblem::Invalid(why.into()))
}
