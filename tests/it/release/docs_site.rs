//! The docs site (`docs/`, an mdBook): it builds, no link in it is broken, and its generated
//! reference pages are what the code says today.
//!
//! - `docs/reference/metrics.md` is rendered from the metric registry (every family, with its
//!   type, labels and help);
//! - `docs/reference/cli.md` is every command's `--help`, from clap.
//!
//! A change to either side fails here with the difference; `TALLY_BLESS=1 cargo nextest run -E
//! 'test(/docs_site/)'` rewrites the pages (then read the diff before committing it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")
}

/// Compare a generated page with the committed one; with `TALLY_BLESS=1`, write it instead.
fn check_generated(relative: &str, generated: &str) {
    let path = docs().join(relative);
    if std::env::var_os("TALLY_BLESS").is_some() {
        std::fs::write(&path, generated).expect("write the generated page");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "docs/{relative} is not what the code generates (first difference at line {}):\n\
             committed: {:?}\ngenerated: {:?}\nrun with TALLY_BLESS=1 to rewrite it",
            first + 1,
            committed.lines().nth(first),
            generated.lines().nth(first),
        );
    }
}

#[test]
fn the_metrics_reference_is_the_registry() {
    let mut page = String::from(
        "# Metrics\n\n\
         Every metric family a tally process exports on `/metrics`, generated from its registry\n\
         (the test suite fails when this page and the code differ). A labelled family\n\
         appears on `/metrics` once it has a series. Labels are bounded: counter and limit names\n\
         come from the configuration, the others are closed sets; a key or a dimension value is\n\
         never a label. Every `tally_` family is on a panel of a dashboard in `dashboards/`\n\
         (checked against a real Prometheus).\n\n\
         | metric | type | labels | meaning |\n|---|---|---|---|\n",
    );
    let catalog = tally::ops::metrics::catalog();
    assert!(
        catalog.len() > 40,
        "the catalog holds every family: {catalog:?}"
    );
    for m in &catalog {
        let labels = m
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        page.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            m.name,
            m.kind,
            labels,
            m.help.replace('|', "\\|")
        ));
    }
    check_generated("reference/metrics.md", &page);
}

/// `tally <args…> --help`'s output.
fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run tally");
    assert!(out.status.success(), "tally {args:?} --help");
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

#[test]
fn the_cli_reference_is_every_commands_help() {
    let top = help(&[]);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(
        commands.len() > 10,
        "commands from `tally --help`: {commands:?}"
    );
    let mut page = String::from(
        "# Commands\n\n\
         Every command's `--help`, generated from the binary (the test suite fails when\n\
         this page and the code differ). `demo`, `mock-broker` and `produce` are local tooling:\n\
         they exist only in builds with the cargo feature `dev` (the default; the product image\n\
         is built without it). A usage error exits 64, like a bad configuration.\n\n\
         ## tally\n\n```text\n",
    );
    page.push_str(&top);
    page.push_str("```\n");
    for command in &commands {
        page.push_str(&format!("\n## tally {command}\n\n```text\n"));
        page.push_str(&help(&[command]));
        page.push_str("```\n");
    }
    check_generated("reference/cli.md", &page);
}

/// `attr="value"` values of an HTML text.
fn attribute_values<'a>(html: &'a str, attr: &str) -> Vec<&'a str> {
    let needle = format!(" {attr}=\"");
    html.match_indices(&needle)
        .filter_map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            rest.find('"').map(|end| &rest[..end])
        })
        .collect()
}

/// Builds the book with mdBook and follows every link of every page: a relative link must name a
/// file of the built site, and a `#fragment` an id in that page. Links to the web (http,
/// https, mailto) are not followed (the tests use loopback only).
#[test]
fn the_docs_site_builds_with_no_broken_link() {
    let out_dir = std::env::temp_dir().join(format!("tally-book-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let built = Command::new("mdbook")
        .arg("build")
        .arg(docs())
        .arg("--dest-dir")
        .arg(&out_dir)
        .output()
        .expect("mdbook is not installed: scripts/setup.sh installs it (cargo install mdbook)");
    let log = String::from_utf8_lossy(&built.stderr);
    assert!(built.status.success(), "mdbook build failed:\n{log}");
    assert!(
        !log.contains("WARN") && !log.contains("ERROR"),
        "mdbook warned:\n{log}"
    );

    let mut pages: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut stack = vec![out_dir.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the built site") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "html") {
                let html = std::fs::read_to_string(&path).expect("read a page");
                pages.insert(path, html);
            }
        }
    }
    let ids = |html: &str| -> BTreeSet<String> {
        attribute_values(html, "id")
            .into_iter()
            .map(str::to_string)
            .collect()
    };
    let mut broken = Vec::new();
    let mut followed = 0;
    for (page, html) in &pages {
        // The print page repeats every chapter with links rewritten to its own anchors (the
        // chapters are checked themselves); the 404 page's links are relative to the server's
        // root (`output.html.site-url`), wherever it is shown.
        if page
            .file_name()
            .is_some_and(|n| n == "print.html" || n == "404.html")
        {
            continue;
        }
        let links = attribute_values(html, "href")
            .into_iter()
            .chain(attribute_values(html, "src"));
        for link in links {
            if link.contains("://") || link.starts_with("mailto:") || link.starts_with("data:") {
                continue;
            }
            followed += 1;
            let (file, fragment) = link.split_once('#').unwrap_or((link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                let file = file.split('?').next().unwrap_or(file);
                page.parent().expect("a page's folder").join(file)
            };
            let Ok(target) = target.canonicalize() else {
                broken.push(format!("{}: {link} (no such file)", page.display()));
                continue;
            };
            if !target.starts_with(out_dir.canonicalize().expect("the site")) {
                broken.push(format!("{}: {link} (outside the site)", page.display()));
                continue;
            }
            if !fragment.is_empty() && target.extension().is_some_and(|e| e == "html") {
                let html = pages
                    .get(&target)
                    .cloned()
                    .unwrap_or_else(|| std::fs::read_to_string(&target).unwrap_or_default());
                if !ids(&html).contains(fragment) {
                    broken.push(format!("{}: {link} (no id {fragment:?})", page.display()));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    assert!(
        broken.is_empty(),
        "{} broken links of {followed}:\n{}",
        broken.len(),
        broken.join("\n")
    );
    assert!(
        pages.len() > 20 && followed > 500,
        "the site has its pages and links"
    );
    println!(
        "{} pages, {followed} links followed, none broken",
        pages.len()
    );
}

/// The facts that drifted before, checked: README.md stays a front door (at most 12,000
/// characters), and the alert table of the observability guide lists exactly the rules of
/// `deploy/prometheus/alerts.yml`, with their `for` and severity.
#[test]
fn the_front_door_is_short_and_the_alert_table_is_the_rules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    assert!(
        readme.chars().count() <= 12_000,
        "README.md has {} characters: move detail into docs/",
        readme.chars().count()
    );
    let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(root.join("deploy/prometheus/alerts.yml")).expect("alerts.yml"),
    )
    .expect("alerts.yml is YAML");
    let mut in_file: BTreeMap<String, (String, String)> = BTreeMap::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("alert").to_string();
            let period = rule["for"].as_str().unwrap_or("0m").to_string();
            let severity = rule["labels"]["severity"]
                .as_str()
                .unwrap_or("")
                .to_string();
            in_file.insert(name, (period, severity));
        }
    }
    let guide = std::fs::read_to_string(docs().join("guide/16-observability-and-deployment.md"))
        .expect("guide 16");
    let in_guide: BTreeMap<String, (String, String)> = guide
        .lines()
        .filter(|l| l.starts_with("| `Tally"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            let name = cells[0].trim_matches('`').to_string();
            let n = cells.len();
            (name, (cells[n - 2].to_string(), cells[n - 1].to_string()))
        })
        .collect();
    assert_eq!(
        in_guide, in_file,
        "guide 16's alert table against alerts.yml"
    );
}

/// Guide 16 lists each dashboard's rows as the dashboard JSON has them, top to bottom.
#[test]
fn the_dashboard_rows_in_the_guide_are_the_dashboards() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(docs().join("guide/16-observability-and-deployment.md"))
        .expect("guide 16");
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("dashboards"))
        .expect("dashboards/")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let rows: Vec<&str> = d["panels"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["type"] == "row")
            .filter_map(|p| p["title"].as_str())
            .collect();
        let line = guide
            .lines()
            .find(|l| l.contains(&format!("`dashboards/{name}`:")))
            .unwrap_or_else(|| panic!("guide 16 does not list {name}"));
        let listed = line.split("`:").nth(1).unwrap_or_default();
        assert_eq!(
            listed.trim().trim_end_matches('.'),
            rows.join(", "),
            "guide 16's rows of {name}"
        );
    }
}

/// The book is a manual: no page of `docs/SUMMARY.md` (nor README.md) names the work sessions
/// or issues it was written in, and no user page sends the reader into the test suite's files (a figure cites
/// the command that measures it and its date). The "Contributing" part is for developers, whose
/// subject the test files are: only the labels are refused there.
#[test]
fn no_page_of_the_book_names_a_session_an_issue_or_a_test_file() {
    let label = regex::Regex::new(r"(?i)\b(session|issue)\s+#?\d+").expect("pattern");
    let summary = std::fs::read_to_string(docs().join("SUMMARY.md")).expect("SUMMARY.md");
    let mut part = String::new();
    let mut found = Vec::new();
    let mut pages = 0;
    for line in summary.lines() {
        if let Some(title) = line.strip_prefix("# ") {
            part = title.trim().to_string();
            continue;
        }
        let Some((_, rest)) = line.split_once("](") else {
            continue;
        };
        let page = rest.trim_end().trim_end_matches(')');
        let text = std::fs::read_to_string(docs().join(page))
            .unwrap_or_else(|e| panic!("docs/{page}: {e}"));
        pages += 1;
        for (n, l) in text.lines().enumerate() {
            if let Some(m) = label.find(l) {
                found.push(format!("docs/{page}:{}: {:?}", n + 1, m.as_str()));
            }
            if part != "Contributing" && l.contains("tests/it/") {
                found.push(format!("docs/{page}:{}: a test file: {l}", n + 1));
            }
        }
    }
    // The front door is read as the book is.
    let readme = std::fs::read_to_string(docs().join("../README.md")).expect("README.md");
    for (n, l) in readme.lines().enumerate() {
        if label.is_match(l) || l.contains("tests/it/") {
            found.push(format!("README.md:{}: {l}", n + 1));
        }
    }
    assert!(pages > 20, "pages of SUMMARY.md: {pages}");
    assert!(
        found.is_empty(),
        "{} lab labels or test-file references on pages of the book:\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The pages of `docs/SUMMARY.md`, in order, with their text.
fn book_pages() -> Vec<(String, String)> {
    let summary = std::fs::read_to_string(docs().join("SUMMARY.md")).expect("SUMMARY.md");
    summary
        .lines()
        .filter_map(|l| {
            l.split_once("](")
                .map(|(_, r)| r.trim_end().trim_end_matches(')'))
        })
        .map(|page| {
            let text = std::fs::read_to_string(docs().join(page))
                .unwrap_or_else(|e| panic!("docs/{page}: {e}"));
            (page.to_string(), text)
        })
        .collect()
}

/// Every metric a page of the book (or README.md) names is one tally exports, and every alert it
/// names is a rule of `deploy/prometheus/alerts.yml`: a troubleshooting row that sends the reader
/// to a renamed metric or alert is a dead end. Prefixes (`tally_rls_…`, `tally_rls_*`) and
/// the crates (`tally_counters::`) are not metric names.
#[test]
fn every_metric_and_alert_a_page_names_exists() {
    let metric = regex::Regex::new(r"\btally_[a-z0-9_]+[a-z0-9]\b(::|\*|…)?").expect("pattern");
    let alert = regex::Regex::new(r"`(Tally[A-Z][A-Za-z]+)`").expect("pattern");
    let families: BTreeSet<String> = tally::ops::metrics::catalog()
        .iter()
        .map(|m| m.name.to_string())
        .collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/alerts.yml")).expect("alerts");
    let mut pages = book_pages();
    pages.push((
        "../README.md".into(),
        std::fs::read_to_string(root.join("README.md")).expect("README.md"),
    ));
    let mut unknown = Vec::new();
    let mut named = 0;
    for (page, text) in &pages {
        for m in metric.captures_iter(text) {
            if m.get(1).is_some() {
                continue;
            }
            let name = &m[0];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| families.contains(*f)))
                .unwrap_or(name);
            named += 1;
            // The Envoy snippets' name for tally's cluster.
            if !families.contains(family) && family != "tally_rls" {
                unknown.push(format!("docs/{page}: metric {name}"));
            }
        }
        for a in alert.captures_iter(text) {
            named += 1;
            if !rules.contains(&format!("alert: {}\n", &a[1])) {
                unknown.push(format!("docs/{page}: alert {}", &a[1]));
            }
        }
    }
    assert!(
        named > 100,
        "only {named} metrics and alerts named: is the book read right?"
    );
    assert!(
        unknown.is_empty(),
        "names that tally does not export or alert on:\n{}",
        unknown.join("\n")
    );
}
