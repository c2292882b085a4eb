//! Build facts the binary reports (`tally version`, `tally_build_info`): the git commit it was
//! built from, when built in a git checkout ("unknown" otherwise, e.g. from a source archive),
//! or as given in `TALLY_BUILD_COMMIT` (a packager building outside git).

use std::path::PathBuf;
use std::process::Command;

/// `git <args>`'s first line of output, if git is there and succeeds.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let line = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !line.is_empty()).then_some(line)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TALLY_BUILD_COMMIT");
    // A new commit moves HEAD or the branch it names: watch both (only paths that exist: a
    // missing one would rerun this script, and rebuild the crate, on every build). Only that
    // branch's file, not `refs/heads`: a commit on another branch (another worktree of the same
    // repository) must not rebuild this one.
    let head = git(&["rev-parse", "--git-path", "HEAD"]).map(PathBuf::from);
    let common = git(&["rev-parse", "--git-common-dir"]).map(PathBuf::from);
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    let watched = [
        head,
        common.as_ref().zip(branch).map(|(c, b)| c.join(b)),
        common.as_ref().map(|c| c.join("packed-refs")),
    ];
    for path in watched.into_iter().flatten().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let commit = std::env::var("TALLY_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=TALLY_BUILD_COMMIT={commit}");
    let profile = std::env::var("PROFILE").unwrap_or_default();
    println!("cargo:rustc-env=TALLY_BUILD_PROFILE={profile}");
}
