//! Feeds arbitrary bytes to the data plane's decoders: the handshake (frame heads, challenges,
//! hellos with and without a valid proof of the token, verdicts) and the sealed frames after it
//! (forged records, and authentic ones with any header, tampered or not). The first byte picks
//! the decoder; `strata_net::fuzz::data_plane_frames` documents each and the properties it
//! checks. Any panic is a bug; refusals are the expected outcome.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_net::fuzz::data_plane_frames(data);
});
