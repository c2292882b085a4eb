//! The benchmarks' global allocator: jemalloc, as `tally` uses, or glibc's malloc with
//! `TALLY_BENCH_ALLOCATOR=system` (to compare the two in one session). The variable is read
//! with `getenv` at the first allocation, so every allocation of a process goes to one of them;
//! child processes inherit it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

use tikv_jemallocator::Jemalloc;

/// jemalloc, or the system allocator when `TALLY_BENCH_ALLOCATOR=system`.
pub struct Switch;

/// 0: not chosen yet; 1: the system allocator; 2: jemalloc.
static WHICH: AtomicU8 = AtomicU8::new(0);

fn system() -> bool {
    let mut w = WHICH.load(Ordering::Relaxed);
    if w == 0 {
        // SAFETY: getenv of a NUL-terminated name; the value is only read, here, at once.
        let v = unsafe { libc::getenv(c"TALLY_BENCH_ALLOCATOR".as_ptr()) };
        let system = !v.is_null() && unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes() == b"system";
        w = if system { 1 } else { 2 };
        WHICH.store(w, Ordering::Relaxed);
    }
    w == 1
}

/// Which allocator this process uses, for the reports (not every binary prints it).
#[allow(dead_code)]
pub fn name() -> &'static str {
    if system() {
        "glibc malloc (TALLY_BENCH_ALLOCATOR=system)"
    } else {
        "jemalloc"
    }
}

// SAFETY: every call goes to the one allocator chosen before the first allocation.
unsafe impl GlobalAlloc for Switch {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        unsafe {
            if system() {
                System.alloc(l)
            } else {
                Jemalloc.alloc(l)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        unsafe {
            if system() {
                System.alloc_zeroed(l)
            } else {
                Jemalloc.alloc_zeroed(l)
            }
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        unsafe {
            if system() {
                System.realloc(p, l, n)
            } else {
                Jemalloc.realloc(p, l, n)
            }
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe {
            if system() {
                System.dealloc(p, l)
            } else {
                Jemalloc.dealloc(p, l)
            }
        }
    }
}
