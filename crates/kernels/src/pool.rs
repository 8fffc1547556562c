//! A persistent thread pool for the forward pass.
//!
//! A decode step issues a few hundred parallel regions of a few microseconds each, so dispatch
//! cost matters more than anything else here: workers spin on an epoch counter for a short while
//! (tens of microseconds, enough to span the gap between two matmuls) and only then sleep on a
//! condition variable, so an idle server does not burn its cores.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Spins before a worker goes to sleep (each spin is one `spin_loop` hint, ~10-40 ns).
const SPINS_BEFORE_SLEEP: u32 = 1 << 14;

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    epoch: AtomicU64,
    job: UnsafeCell<Option<Job>>,
    remaining: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread inside `ThreadPool::run` while no worker reads it
// (all workers finished the previous epoch: `remaining == 0`), and read by workers only after they
// observe the new epoch with Acquire ordering, which the writer published with Release.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of worker threads that run one closure on every thread at a time.
pub struct ThreadPool {
    n_threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in total (the caller's thread counts as thread 0).
    pub fn new(n_threads: usize) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            remaining: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|tid| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("strata-compute-{tid}"))
                    .spawn(move || worker(&shared, tid))
                    .expect("spawning a compute thread")
            })
            .collect();
        ThreadPool {
            n_threads,
            shared,
            workers,
        }
    }

    /// Number of threads, including the caller's.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(thread, unit)` for every unit of `0..units`, the threads claiming units from a
    /// shared counter (units vary in cost, so a static split would leave threads idle).
    pub fn run_units(&self, units: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        let next = AtomicUsize::new(0);
        self.run(&|tid| {
            loop {
                let u = next.fetch_add(1, Ordering::Relaxed);
                if u >= units {
                    break;
                }
                f(tid, u);
            }
        });
    }

    /// Runs `f(thread_index)` on every thread of the pool and returns when all have finished.
    ///
    /// # Panics
    /// Re-raises (as a new panic) a panic of `f` on any thread.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.n_threads == 1 {
            f(0);
            return;
        }
        let s = &*self.shared;
        // SAFETY: see `Shared`: no worker is reading `job` now. The lifetime is erased, but `f`
        // outlives every use because this function does not return before `remaining` is zero.
        unsafe {
            let erased: Job = std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f);
            *s.job.get() = Some(erased);
        }
        s.remaining.store(self.n_threads - 1, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::Release);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock();
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let mut spins = 0u32;
        while s.remaining.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if mine.is_err() || s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a compute thread panicked");
        }
    }
}

fn worker(s: &Shared, tid: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        let epoch = loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen || s.stop.load(Ordering::Relaxed) {
                break e;
            }
            spins += 1;
            if spins < SPINS_BEFORE_SLEEP {
                std::hint::spin_loop();
                continue;
            }
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            let guard = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            if s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
                // The timeout bounds the cost of a missed wake-up to a millisecond.
                let _unused = s.wake.wait_timeout(guard, Duration::from_millis(1));
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            spins = 0;
        };
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        seen = epoch;
        // SAFETY: the epoch changed, so `run` published a job that outlives this call.
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            // SAFETY: as above.
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(tid))).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.remaining.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.lock.lock();
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_each_job_once() {
        for n in 1..=4 {
            let pool = ThreadPool::new(n);
            for _ in 0..2000 {
                let hits = AtomicUsize::new(0);
                let mask = AtomicUsize::new(0);
                pool.run(&|tid| {
                    hits.fetch_add(1, Ordering::Relaxed);
                    mask.fetch_or(1 << tid, Ordering::Relaxed);
                });
                assert_eq!(hits.load(Ordering::Relaxed), n);
                assert_eq!(mask.load(Ordering::Relaxed), (1 << n) - 1);
            }
        }
    }

    #[test]
    fn survives_sleep_and_wake() {
        let pool = ThreadPool::new(2);
        let hits = AtomicUsize::new(0);
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(5));
            pool.run(&|_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(hits.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn worker_panic_is_reported_not_hung() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|tid| {
                if tid == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let hits = AtomicUsize::new(0);
        pool.run(&|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }
}
