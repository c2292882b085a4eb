//! What this binary is: its version, the commit it was built from (by `build.rs`) and the
//! profile. `tally version` prints it; `/metrics` exports it as `tally_build_info`.

/// The package version (semantic versioning; 0.x: a minor release may break, see CHANGELOG.md).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit (12 hex digits), `TALLY_BUILD_COMMIT` if a packager set it, or "unknown".
pub const COMMIT: &str = env!("TALLY_BUILD_COMMIT");
/// `release` or `debug`.
pub const PROFILE: &str = env!("TALLY_BUILD_PROFILE");

/// The lines `tally version` prints.
pub fn describe() -> String {
    format!(
        "tally {VERSION}\ncommit: {COMMIT}\nprofile: {PROFILE}\ntarget: {}-{}\n",
        std::env::consts::ARCH,
        std::env::consts::OS
    )
}
