//! Sends arbitrary bytes as the body of each API route, through the real router, scheduler and
//! a tiny real model (`strata_api::testkit`): any 500, panic, non-JSON answer or hang is a bug;
//! 4xx answers are fine. The first byte picks the route.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use strata_api::server::AppState;
use strata_api::testkit::{ROUTES, exercise, tiny_state};

struct Harness {
    rt: tokio::runtime::Runtime,
    state: Arc<AppState>,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| Harness {
        rt: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime"),
        state: tiny_state().expect("the test server"),
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let h = harness();
    let route = ROUTES[usize::from(pick) % ROUTES.len()];
    h.rt.block_on(exercise(&h.state, route, body.to_vec()));
});
