//! Time, CPU and memory of processes and threads, from the clock, `getrusage` and `/proc`;
//! and the small statistics used on them.

use std::collections::HashMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub fn unix_secs_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// user+sys CPU seconds of this process (all threads).
pub fn cpu_self() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU seconds of the calling thread.
pub fn cpu_thread() -> f64 {
    // SAFETY: clock_gettime only writes into the struct we pass.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no memory effects.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as f64
}

/// user+sys CPU seconds from a `/proc/.../stat` file (process or thread).
pub fn stat_cpu(path: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

/// Exact CPU time of a thread in seconds (`se.sum_exec_runtime`, kept by the scheduler in ns;
/// `/proc/.../stat` only has 10 ms ticks).
pub fn thread_runtime(pid: u32, tid: &str) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/sched")).ok()?;
    let ms: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("se.sum_exec_runtime"))?
        .trim_start_matches([' ', ':'])
        .trim()
        .parse()
        .ok()?;
    Some(ms / 1e3)
}

pub fn proc_cpu(pid: u32) -> f64 {
    stat_cpu(Path::new(&format!("/proc/{pid}/stat"))).unwrap_or(f64::NAN)
}

/// A `kB` field of `/proc/<pid>/status` (VmHWM, VmRSS), in MB.
pub fn proc_status_mb(pid: Option<u32>, field: &str) -> f64 {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// CPU seconds of every thread of `pid`, by thread id, with its name.
pub fn thread_cpus(pid: u32) -> HashMap<String, (String, f64)> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for entry in dir.flatten() {
        let tid = entry.file_name().to_string_lossy().to_string();
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if let Some(cpu) = stat_cpu(&entry.path().join("stat")) {
            out.insert(tid, (comm.trim().to_string(), cpu));
        }
    }
    out
}

/// CPU used between two snapshots, summed by thread name (digits folded: `rdk:broker1` →
/// `rdk:broker#`), largest first.
pub fn thread_breakdown(
    before: &HashMap<String, (String, f64)>,
    after: &HashMap<String, (String, f64)>,
) -> Vec<(String, f64)> {
    let mut by_name: HashMap<String, f64> = HashMap::new();
    for (tid, (name, cpu)) in after {
        let start = before.get(tid).map_or(0.0, |b| b.1);
        let folded: String = name
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .collect();
        let folded = folded.replace("##", "#");
        *by_name.entry(folded).or_default() += cpu - start;
    }
    let mut v: Vec<(String, f64)> = by_name.into_iter().filter(|(_, c)| *c > 0.0).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v
}

pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
