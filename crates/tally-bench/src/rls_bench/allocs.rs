//! Allocations per decision: this binary's global allocator counts every allocation of the
//! `serve` role (the benchmarks' allocator underneath: jemalloc, as `tally` uses), so the bench
//! can divide a
//! phase's allocations by its decisions. The client role does not count (one relaxed load per
//! allocation). Counts are striped per thread (one cache line each), so counting does not make
//! the server's threads share a hot line.

use std::alloc::{GlobalAlloc, Layout};

use crate::alloc_switch::Switch;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The benchmarks' allocator, counting while [`enable`]d.
pub struct Counting;

/// Whether allocations are counted (the `serve` role turns it on at start).
static ENABLED: AtomicBool = AtomicBool::new(false);

const STRIPES: usize = 32;

#[repr(align(128))]
struct Stripe(AtomicU64);

static COUNTS: [Stripe; STRIPES] = [const { Stripe(AtomicU64::new(0)) }; STRIPES];
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's stripe (usize::MAX: not chosen yet).
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn count() {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    // `try_with`: a thread being torn down still allocates; it is then not counted.
    let _ = SLOT.try_with(|slot| {
        let mut i = slot.get();
        if i == usize::MAX {
            i = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
            slot.set(i);
        }
        COUNTS[i].0.fetch_add(1, Ordering::Relaxed);
    });
}

// SAFETY: every call is passed to `Switch` unchanged; counting touches no allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { Switch.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { Switch.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { Switch.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { Switch.dealloc(ptr, layout) }
    }
}

/// Count from now on (the `serve` role).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Allocations (and reallocations) counted so far.
pub fn total() -> u64 {
    COUNTS.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
}
