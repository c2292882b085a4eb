//! One supervisor for every long-lived task of a process (consumer lanes, the HTTP server, the
//! jobs, the Redis probe of `tally serve`). Every task runs until the shutdown token is
//! cancelled; the first one that fails — returns an error, panics, or ends while the token is
//! not cancelled — cancels the token for all the others, and its error becomes the process'
//! result (exit 1). A signal cancels the same token: every task drains, and the result is `Ok`.
//!
//! After the token is cancelled, the tasks get `drain` to end. Past it the supervisor cancels
//! the *deadline* token (sinks stop retrying Redis) and returns without waiting any longer:
//! nothing is lost by that, Redis holds the applied offsets.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The set of a process' long-lived tasks and the token that stops them.
pub struct Supervisor {
    /// Cancelled by a signal or by the first task that fails.
    shutdown: CancellationToken,
    /// Cancelled when the tasks did not end within the drain time after shutdown.
    deadline: CancellationToken,
    /// Each task's name (for the error) and result.
    tasks: JoinSet<(&'static str, anyhow::Result<()>)>,
    /// The first failure, kept while the others drain.
    failure: Option<anyhow::Error>,
}

impl Supervisor {
    /// A supervisor stopped by `shutdown`.
    pub fn new(shutdown: CancellationToken) -> Supervisor {
        Supervisor {
            shutdown,
            deadline: CancellationToken::new(),
            tasks: JoinSet::new(),
            failure: None,
        }
    }

    /// The token every task watches.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// The token cancelled when draining takes too long (for retries that would go on).
    pub fn deadline(&self) -> &CancellationToken {
        &self.deadline
    }

    /// Run `task` until the shutdown token is cancelled.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.tasks.spawn(async move { (name, task.await) });
    }

    /// Record a failure that happened outside a task (say, while starting one) and stop the
    /// others.
    pub fn fail(&mut self, error: anyhow::Error) {
        tracing::error!(error = %format!("{error:#}"), "shutting down");
        self.failure.get_or_insert(error);
        self.shutdown.cancel();
    }

    /// Wait until every task has ended (or `drain` has passed since shutdown); the first
    /// failure, if any.
    pub async fn wait(mut self, drain: Duration) -> anyhow::Result<()> {
        let shutdown = self.shutdown.clone();
        let deadline = async {
            shutdown.cancelled().await;
            tokio::time::sleep(drain).await;
        };
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                ended = self.tasks.join_next() => match ended {
                    None => break,
                    Some(Ok((name, Ok(())))) => {
                        if !self.shutdown.is_cancelled() {
                            self.fail(anyhow::anyhow!("{name} stopped unexpectedly"));
                        }
                    }
                    Some(Ok((name, Err(e)))) => self.fail(e.context(name)),
                    Some(Err(e)) => self.fail(anyhow::anyhow!("a task panicked: {e}")),
                },
                _ = &mut deadline => {
                    tracing::warn!(?drain, "tasks did not end in time after shutdown; exiting anyway");
                    self.deadline.cancel();
                    // Retries stop at the deadline; give them a moment to notice.
                    let _ = tokio::time::timeout(Duration::from_secs(2), async {
                        while self.tasks.join_next().await.is_some() {}
                    })
                    .await;
                    break;
                }
            }
        }
        self.failure.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_signal_drains_every_task_and_ends_ok() {
        let token = CancellationToken::new();
        let mut s = Supervisor::new(token.clone());
        for name in ["a", "b"] {
            let t = token.clone();
            s.spawn(name, async move {
                t.cancelled().await;
                Ok(())
            });
        }
        token.cancel();
        s.wait(Duration::from_secs(5)).await.expect("clean drain");
    }

    #[tokio::test]
    async fn the_first_failure_stops_the_others_and_is_the_result() {
        let token = CancellationToken::new();
        let mut s = Supervisor::new(token.clone());
        let t = token.clone();
        s.spawn("waits", async move {
            t.cancelled().await;
            Ok(())
        });
        s.spawn("fails", async { anyhow::bail!("boom") });
        let err = s.wait(Duration::from_secs(5)).await.expect_err("failed");
        assert!(format!("{err:#}").contains("boom"), "{err:#}");
        assert!(token.is_cancelled());
    }

    #[tokio::test]
    async fn a_task_that_ends_on_its_own_is_a_failure() {
        let token = CancellationToken::new();
        let mut s = Supervisor::new(token.clone());
        s.spawn("http server", async { Ok(()) });
        let err = s.wait(Duration::from_secs(5)).await.expect_err("failed");
        assert!(err.to_string().contains("http server stopped unexpectedly"));
    }

    #[tokio::test]
    async fn a_task_that_will_not_end_is_cut_at_the_deadline() {
        let token = CancellationToken::new();
        let mut s = Supervisor::new(token.clone());
        let deadline = s.deadline().clone();
        s.spawn("stuck", async move {
            deadline.cancelled().await;
            Ok(())
        });
        token.cancel();
        s.wait(Duration::from_millis(50))
            .await
            .expect("a cut drain is not a failure");
    }
}
