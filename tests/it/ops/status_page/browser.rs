//! Debian's `chromium`, headless, on a fresh profile: the page's DOM after its script ran, and
//! a screenshot (kept under `target/` when a check fails).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The flags every run takes: no network of its own, no first-run UI, a throwaway profile.
fn chromium(profile: &std::path::Path) -> Command {
    let mut cmd = Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

/// The DOM of `url` once its script had `budget` of (virtual) time: fetches answer in between.
pub fn dump_dom(url: &str, budget: Duration) -> String {
    let profile = tempdir("dom");
    let out = chromium(&profile)
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("run chromium (scripts/setup.sh installs it)");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Save a screenshot of `url` as `target/<name>.png`; returns its path.
pub fn screenshot(url: &str, name: &str) -> PathBuf {
    let path =
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target")).join(format!("{name}.png"));
    let profile = tempdir("shot");
    let _ = chromium(&profile)
        .arg("--virtual-time-budget=3000")
        .arg("--window-size=1280,1100")
        .arg(format!("--screenshot={}", path.display()))
        .arg(url)
        .output();
    let _ = std::fs::remove_dir_all(&profile);
    path
}

fn tempdir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tally-chromium-{what}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("profile dir");
    dir
}

/// The text of the element with `id` (up to its first child tag), commas dropped.
pub fn text_of(dom: &str, id: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let start = at + dom[at..].find('>')? + 1;
    let end = start + dom[start..].find('<')?;
    Some(dom[start..end].replace(',', "").trim().to_string())
}

/// The cells of the rows of `<tbody id="{id}">`, row by row.
pub fn table(dom: &str, id: &str) -> Vec<Vec<String>> {
    let Some(at) = dom.find(&format!("<tbody id=\"{id}\">")) else {
        return Vec::new();
    };
    let body = &dom[at..at + dom[at..].find("</tbody>").unwrap_or(0)];
    body.split("<tr>")
        .skip(1)
        .map(|row| {
            row.split("<td")
                .skip(1)
                .filter_map(|cell| {
                    let start = cell.find('>')? + 1;
                    let end = cell.find("</td>")?;
                    Some(cell[start..end].replace(',', ""))
                })
                .collect()
        })
        .collect()
}
