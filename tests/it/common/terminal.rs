//! A terminal for `tally top`: tmux on a socket of its own, so a test touches no one else's
//! sessions.

use std::process::{Command, Output};

/// tmux on `socket` with `args`.
pub fn tmux(socket: &str, args: &[&str]) -> Output {
    Command::new("tmux")
        .args(["-L", socket])
        .args(args)
        .output()
        .expect("run tmux (scripts/setup.sh installs it)")
}

/// Starts `command` in a detached 160×45 session named `top` on `socket`.
pub fn start_top(socket: &str, command: &str) {
    let started = tmux(
        socket,
        &[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "160",
            "-y",
            "45",
            command,
        ],
    );
    assert!(started.status.success(), "{started:?}");
}

/// What the session `top` on `socket` shows now.
pub fn screen(socket: &str) -> String {
    let shot = tmux(socket, &["capture-pane", "-p", "-t", "top"]);
    String::from_utf8_lossy(&shot.stdout).into_owned()
}
