use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
fn main() {
    for threads in [1, 2] {
        let pool = strata_kernels::ThreadPool::new(threads);
        for work in [300u64, 3000, 30000] {
            let counts = [AtomicUsize::new(0), AtomicUsize::new(0)];
            let t = Instant::now();
            let calls = 20000;
            for _ in 0..calls {
                let next = AtomicUsize::new(0);
                pool.run(&|tid| loop {
                    let u = next.fetch_add(1, Ordering::Relaxed);
                    if u >= 36 {
                        break;
                    }
                    counts[tid].fetch_add(1, Ordering::Relaxed);
                    let mut x = std::hint::black_box(1.0f64);
                    for _ in 0..work / 10 {
                        x = std::hint::black_box(x * 1.000001 + 0.5);
                    }
                    std::hint::black_box(x);
                });
            }
            println!(
                "threads {threads} work {work}: {:?} {:?} {:.2} us/call",
                counts[0],
                counts[1],
                t.elapsed().as_secs_f64() * 1e6 / calls as f64
            );
        }
    }
}
